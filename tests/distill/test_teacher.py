"""End-to-end teacher stages on tiny models: pretrain from scratch, fine-tune, resume, DDP."""

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from edgedistill.bench.ports import free_port
from edgedistill.common import manifest as mf
from edgedistill.common.recipe import RecipeError
from edgedistill.distill import finetune, heads
from edgedistill.distill.finetune import reinit_top_layers
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
)

from tests.conftest import PYTHON, ROOT, run_here, run_module
from tests.distill.bert_init import tiny_bert
from tests.distill.gpt_init import write_gpt2

pytestmark = pytest.mark.slow
SMOKE = ROOT / "recipes" / "smoke.yaml"
# The smoke recipe's teacher half as wide (hidden 32, intermediate 64), for the tests that check that a way of training
# learns (GPT, bf16, DDP) rather than how well: as clearly above the majority class, in half the time.
NARROW = ["--model.hidden_size=32", "--model.intermediate_size=64"]


def run_stage(*args, env_extra=None) -> subprocess.CompletedProcess:
    """`python -m distill *args`, run in this process (`run_here`) with the variables `env_extra`."""
    return run_here("distill", *args, env=env_extra)


def majority_rate(labels_file: Path, limit: int) -> float:
    labels = [line.rsplit("\t", 1)[1] for line in labels_file.read_text().splitlines()[1 : limit + 1]]
    return max(labels.count("0"), labels.count("1")) / len(labels)


def scratch_teacher(family: str, request) -> tuple[Path, list[str], str]:
    """The run folder of the smoke recipe's teacher of `family`, pretrained from scratch then fine-tuned; the
    arguments of the stage that built it; what the stage printed. The BERT one is the session's smoke run (the same
    stage of the same recipe); the GPT one is trained here, half as wide and pretrained for 25 of the recipe's 75
    steps (its fine-tune is the recipe's, and beats the majority class as clearly)."""
    if family == "bert":
        return request.getfixturevalue("smoke_run"), [], request.getfixturevalue("smoke_teacher_said")
    # a GPT's blocks cannot seed the recipe's transformer student: it starts afresh (else the recipe is refused)
    args = ["--model.family=gpt", "--name=smoke-gpt", "--distill.students.transformer.init_from_teacher=false"]
    args += ["--pretrain.optim.max_steps=25", *NARROW]
    result = run_stage("teacher", SMOKE, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke-gpt", args, result.stdout


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_scratch_pretrain_then_finetune_beats_majority(family, data_dir, request):
    runs, args, said = scratch_teacher(family, request)
    pre = mf.load(runs / "pretrain")
    assert pre.info["objective"] == ("mlm" if family == "bert" else "clm")
    assert pre.metrics["perplexity_after"] < pre.metrics["perplexity_before"]
    teacher = mf.load(runs / "teacher")
    assert teacher.parents["pretrain"].manifest_sha256 == mf.sha256_file(runs / "pretrain" / "manifest.json")
    for key in ("dev_accuracy", "params", "size_bytes", "wall_seconds"):
        assert key in teacher.metrics
    assert teacher.metrics["dev_accuracy"] > majority_rate(data_dir / "sst2" / "dev.tsv", 300) + 0.05
    assert "tokenizer.json" in teacher.files
    assert "[teacher]" in said

    model = AutoModelForSequenceClassification.from_pretrained(runs / "teacher")
    tokenizer = AutoTokenizer.from_pretrained(runs / "teacher")
    logits = model(**tokenizer(["a great film", "dull"], padding=True, return_tensors="pt")).logits
    assert logits.shape == (2, 2)
    assert model.config.id2label == {0: "negative", 1: "positive"}

    again = run_stage("teacher", SMOKE, *args, env_extra={"EDGEDISTILL_RUNS_DIR": str(runs.parent)})
    assert "up to date" in again.stdout
    assert mf.load(runs / "teacher") == teacher


def test_bad_recipe_and_data_fail_with_a_clear_message(tmp_path):
    result = run_here("distill", "teacher", SMOKE, "--finetune.optim.lrr=1")
    assert result.returncode == 2
    assert "finetune.optim.lrr" in result.stderr
    result = run_here(
        "distill",
        "finetune",
        SMOKE,
        f"--data.train={tmp_path}/none.tsv",
        f"--data.dev={tmp_path}/dev.tsv",
        "--pretrain=null",
        "--model.init=x",
    )
    assert result.returncode == 2
    assert "none.tsv: file not found" in result.stderr
    result = run_here("distill", "finetune", SMOKE)
    assert result.returncode == 2
    assert "pretrain is not a finished artifact" in result.stderr


def never_loaded(tmp_path) -> str:
    """A `model.init` that passes the checks before training (a folder with a config.json and a weights file) and is
    never loaded: the tests that give it stop before the teacher's checkpoint is read."""
    folder = tmp_path / "never-loaded"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return str(folder)


def test_a_wrong_column_fails_the_teacher_before_pretraining(tmp_path):
    result = run_here(
        "distill", "teacher", SMOKE, "--data.text_column=review", "--name=smoke-column", "--pretrain.optim.max_steps=1"
    )
    assert "missing column(s) ['review']" in result.stderr
    assert not (Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke-column" / "pretrain").exists()


@pytest.mark.parametrize("stage", ["teacher", "finetune"])
def test_a_bad_test_split_fails_before_any_training(stage, tmp_path):
    test = tmp_path / "test.tsv"
    test.write_text("sentence\tlabel\na film\tpositive\nanother\tgood\n")
    without = ["--pretrain=null", f"--model.init={never_loaded(tmp_path)}"] if stage == "finetune" else []
    result = run_here("distill", stage, SMOKE, f"--data.test={test}", "--name=smoke-test-split", *without)
    assert f"{test}:3: label 'good' is neither one of data.label_names" in result.stderr
    assert not (Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke-test-split" / "pretrain").exists()


def test_dev_and_test_examples_that_are_train_examples_are_warned_of_before_training(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\na fine film\t1\na dull film\t0\nstill more\t1\n")
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\na fine film\t1\nsomething new\t0\n")
    split = [f"--data.train={train}", f"--data.dev={dev}", f"--data.test={train}"]
    result = run_here("distill", "finetune", SMOKE, *split, "--pretrain=null", f"--model.init={never_loaded(tmp_path)}")
    assert "warning: 1 of the 2 dev examples are train examples too (data.train, data.dev)" in result.stdout
    assert "warning: 3 of the 3 test examples are train examples too (data.train, data.test)" in result.stdout


def test_the_teacher_manifest_counts_the_test_examples(tmp_path):
    test = tmp_path / "test.tsv"
    test.write_text("sentence\tlabel\na fine film\t1\na dull one\t0\nstill more\t1\n")
    steps = ["--pretrain.optim.max_steps=1", "--finetune.optim.max_steps=1", "--data.train_limit=32"]
    result = run_stage("teacher", SMOKE, f"--data.test={test}", "--name=smoke-test-count", *steps)
    assert result.returncode == 0, result.stderr[-3000:]
    teacher = mf.load(Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke-test-count" / "teacher")
    assert teacher.info["train_examples"] == 32
    assert teacher.info["test_examples"] == 3


def test_the_teacher_scores_dev_and_test_as_its_bundles_server_writes_them(tmp_path, monkeypatch):
    split = tmp_path / "split.tsv"
    split.write_text("sentence\tlabel\nA GREAT Film, Mr. Smith!\t1\nA dull one.\t0\n")
    encoded = []
    real = finetune.encode
    monkeypatch.setattr(
        finetune, "encode", lambda tok, texts, *rest, **kw: encoded.extend(texts) or real(tok, texts, *rest, **kw)
    )
    steps = ["--pretrain.optim.max_steps=1", "--finetune.optim.max_steps=1", "--data.train_limit=32"]
    result = run_stage("teacher", SMOKE, f"--data.dev={split}", f"--data.test={split}", "--name=smoke-served", *steps)
    assert result.returncode == 0, result.stderr[-3000:]
    assert encoded.count("a great film , mr. smith !") == 2  # dev, then test


def kill_9_once(args: list, ready: Callable[[], bool]) -> None:
    """Start `python -m distill *args` and kill -9 it once `ready()` (polled) is true."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "distill", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,  # never read: a pipe would fill with progress bars and stall the stage
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.2)
    assert proc.poll() is None, "the stage finished before it could be killed; give it more work"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def kill_9_at_checkpoint(args: list, run: Path, step: int) -> None:
    """`kill_9_once` when the teacher's checkpoint in `run` has reached `step`."""
    checkpoint = run / ".work" / "teacher" / "checkpoint.pt"

    def reached() -> bool:
        try:
            return torch.load(checkpoint, weights_only=False)["progress"]["global_step"] >= step
        except Exception:  # noqa: BLE001 - missing, or mid-replace; poll again
            return False

    kill_9_once(args, reached)


def test_kill_9_mid_epoch_resumes_to_the_same_result(tmp_path):
    """An interrupted fine-tune continues from its checkpoint and ends exactly where an uninterrupted one does."""
    # The moving average (ema_decay) is part of the state that must survive the kill. Epochs of 60 steps (1,920
    # examples in batches of 32): killed at step 40 or later, mid-epoch, with 80 steps still to run.
    common = ["--pretrain.optim.max_steps=10", "--finetune.optim.epochs=2", "--finetune.optim.checkpoint_every=10"]
    common += ["--finetune.optim.ema_decay=0.95", "--data.train_limit=1920"]
    base = run_stage("teacher", SMOKE, "--name=straight", *common)
    assert base.returncode == 0, base.stderr[-3000:]
    runs = Path(os.environ["EDGEDISTILL_RUNS_DIR"])
    # Same pretrain artifact for both runs, so only the fine-tune differs.
    (runs / "killed").mkdir()
    os.symlink(runs / "straight" / "pretrain", runs / "killed" / "pretrain")

    kill_9_at_checkpoint(["finetune", SMOKE, "--name=killed", *common], runs / "killed", 40)
    assert not (runs / "killed" / "teacher").exists(), "a killed stage must not publish an artifact"

    resumed = run_stage("finetune", SMOKE, "--name=killed", *common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step" in resumed.stdout
    killed, straight = mf.load(runs / "killed" / "teacher"), mf.load(runs / "straight" / "teacher")
    assert killed.info["resumed_from_step"] >= 40
    assert killed.metrics["dev_accuracy"] == straight.metrics["dev_accuracy"]
    assert killed.info["best_step"] == straight.info["best_step"]
    history = json.loads((runs / "killed" / "teacher" / "history.json").read_text())
    assert history[-1]["step"] == straight.info["steps"]


def test_a_forced_teacher_killed_and_forced_again_goes_on_from_its_checkpoint():
    """`teacher --force` starts afresh once: the same forced command, run again after a kill, resumes."""
    args = ["teacher", SMOKE, "--name=forced", "--pretrain.optim.max_steps=10", "--finetune.optim.checkpoint_every=10"]
    args += ["--data.train_limit=960"]  # 3 epochs of 30 steps: killed at step 10 or later, with 80 still to run
    runs = Path(os.environ["EDGEDISTILL_RUNS_DIR"])
    kill_9_at_checkpoint([*args, "--force"], runs / "forced", 10)
    resumed = run_stage(*args, "--force")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert mf.load(runs / "forced" / "teacher").info["resumed_from_step"] is not None


def test_torchrun_two_cpu_processes(data_dir):
    torchrun = Path(PYTHON).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [torchrun, "--standalone", "--nproc_per_node=2", "-m", "distill", "teacher", SMOKE, "--name=ddp"]
    # the recipe's fine-tune on a teacher half as wide, after 10 of its 75 pretraining steps: it learns as clearly
    cmd += ["--pretrain.optim.max_steps=10", *NARROW]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    teacher = mf.load(Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "ddp" / "teacher")
    assert teacher.info["world_size"] == 2
    # The effective batch is the recipe's on any world size: 3 epochs of 4,000 examples in batches of 32.
    assert teacher.info["steps"] == 3 * 4000 // 32
    assert teacher.metrics["dev_accuracy"] > majority_rate(data_dir / "sst2" / "dev.tsv", 300) + 0.05


def test_two_nodes_of_one_process_train_the_same_teacher_as_one_node_of_two():
    """Multi-node DDP as the docs give it (`--nnodes` with c10d rendezvous), two nodes on this host sharing the run
    folder: the ranks meet, and the teacher is the bit-identical one a single node of two processes trains."""
    torchrun = Path(PYTHON).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # a few steps of each stage, every one all-reduced across the ranks: bit-identical weights need no more
    stage = ["-m", "distill", "teacher", SMOKE, "--data.train_limit=320", "--finetune.optim.epochs=1"]
    stage += ["--pretrain.optim.max_steps=4", "--pretrain.train_max_lines=100", "--pretrain.eval_max_lines=20"]
    stage += ["--data.dev_limit=50"]
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        subprocess.Popen(
            [
                torchrun,
                "--nnodes=2",
                "--nproc_per_node=1",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}",
                "--rdzv_id=nodes",
                *stage,
                "--name=nodes",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    errors = [node.communicate(timeout=600)[1][-3000:] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], errors
    one = [torchrun, "--standalone", "--nproc_per_node=2", *stage, "--name=one"]
    result = subprocess.run(one, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = Path(os.environ["EDGEDISTILL_RUNS_DIR"])
    weights = [(runs / name / "teacher" / "model.safetensors").read_bytes() for name in ("nodes", "one")]
    assert weights[0] == weights[1]


def test_bf16_autocast_fine_tune_on_the_cpu_beats_majority(data_dir):
    # a CPU without AVX512-BF16 emulates bf16, several times slower: a short pretraining, two epochs of fine-tuning,
    # a teacher half as wide
    short = ["--pretrain.optim.max_steps=5", "--finetune.optim.epochs=2", *NARROW]
    result = run_stage("teacher", SMOKE, "--runtime.device=cpu", "--runtime.precision=bf16", "--name=bf16", *short)
    assert result.returncode == 0, result.stderr[-3000:]
    teacher = mf.load(Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "bf16" / "teacher")
    assert teacher.info["device"] == "cpu"
    assert teacher.info["precision"] == "bf16"
    assert teacher.metrics["dev_accuracy"] > majority_rate(data_dir / "sst2" / "dev.tsv", 300) + 0.05


def test_cuda_on_a_machine_without_one_fails_before_any_work():
    if torch.cuda.is_available():
        pytest.skip("checks the error of a machine without CUDA")
    result = run_here("distill", "teacher", SMOKE, "--runtime.device=cuda", "--name=nocuda")
    assert result.returncode == 2
    assert "runtime.device=cuda but no CUDA device visible" in result.stderr
    assert not (Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "nocuda").exists()


def test_sentence_pair_fine_tuning(smoke_run, tmp_path):
    """Pairs reach the model as [CLS] a [SEP] b [SEP] with segment ids, and the task is learnt."""
    rows = ["q\tp\tlabel"] + [f"is it {w} ?\tit is {w}\t1" for w in ("good", "great", "fine", "fun")] * 40
    rows += [f"is it {w} ?\tit is not {w}\t0" for w in ("good", "great", "fine", "fun")] * 40
    (tmp_path / "pairs.tsv").write_text("\n".join(rows) + "\n")
    pairs = [
        "--pretrain=null",
        f"--model.init={smoke_run / 'teacher'}",
        f"--data.train={tmp_path / 'pairs.tsv'}",
        f"--data.dev={tmp_path / 'pairs.tsv'}",
        "--data.text_column=q",
        "--data.text_pair_column=p",
        "--data.dev_limit=null",
        "--name=pairs",
    ]
    result = run_stage("finetune", SMOKE, *pairs)
    assert result.returncode == 0, result.stderr[-3000:]
    teacher = mf.load(Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "pairs" / "teacher")
    assert teacher.metrics["dev_accuracy"] > 0.9
    tokenizer = AutoTokenizer.from_pretrained(Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "pairs" / "teacher")
    encoded = tokenizer("is it good ?", "it is good")
    assert set(encoded["token_type_ids"]) == {0, 1}


def test_mean_pooled_teacher_fine_tunes_and_loads_through_the_auto_class(smoke_run, data_dir):
    result = run_stage(
        "finetune",
        SMOKE,
        "--pretrain=null",
        f"--model.init={smoke_run / 'teacher'}",
        "--finetune.pooling=mean",
        "--name=mean-pooled",
        "--finetune.optim.epochs=1",  # of the recipe's 3, on half its examples: the mean-pooled head learns in one
        "--data.train_limit=2000",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    folder = Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "mean-pooled" / "teacher"
    assert mf.load(folder).metrics["dev_accuracy"] > majority_rate(data_dir / "sst2" / "dev.tsv", 300) + 0.05
    assert isinstance(heads.load_teacher(folder), heads.MeanPooledBertForSequenceClassification)


def tiny_classifier(family: str):
    """A two-layer classifier of `family`, fresh weights, no files."""
    if family == "bert":
        return BertForSequenceClassification(
            BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
        )
    return GPT2ForSequenceClassification(GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, pad_token_id=0))


def pretrained_like(model) -> dict:
    """Set every weight to 0.5 (no fresh draw gives that) and return a copy of the state."""
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(0.5)
    return {name: value.clone() for name, value in model.state_dict().items()}


TOP_LAYER = {"bert": ".layer.1.", "gpt": ".h.1."}


def reinit_changes(family: str) -> set[str]:
    """The state entries of a pretrained-like two-layer `family` classifier that re-initialising its top layer
    changes."""
    model = tiny_classifier(family)
    before = pretrained_like(model)
    reinit_top_layers(model, 1)
    return {name for name, value in model.state_dict().items() if not value.equal(before[name])}


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_reinit_layers_draws_the_top_layer_afresh(family):
    assert any(TOP_LAYER[family] in name for name in reinit_changes(family))


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_reinit_layers_keeps_the_lower_layers_and_embeddings(family):
    changed = reinit_changes(family)
    assert {name for name in changed if TOP_LAYER[family] not in name and "pooler" not in name} == set()


def test_reinit_layers_draws_the_pooler_afresh():
    assert "bert.pooler.dense.weight" in reinit_changes("bert")


def test_reinit_layers_sets_layer_norms_to_identity():
    model = tiny_classifier("bert")
    pretrained_like(model)
    reinit_top_layers(model, 1)
    assert model.bert.encoder.layer[1].output.LayerNorm.weight.eq(1.0).all()


def test_reinit_layers_past_the_model_is_refused():
    with pytest.raises(RecipeError, match="reinit_layers=3, but the model has 2 layers"):
        reinit_top_layers(tiny_classifier("bert"), 3)


def test_the_teacher_warns_first_of_a_transfer_file_that_does_not_exist():
    result = run_here(
        "distill",
        "teacher",
        SMOKE,
        "--transfer.unlabelled_files=[nowhere.txt]",
        "--data.text_column=review",
        "--name=smoke-gone",
    )
    assert "[teacher] warning: transfer.unlabelled_files: nowhere.txt: file not found" in result.stdout


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"\n\n", ": no text (the file is empty, or its lines show nothing)"),
        (b"caf\xe9 au lait\n", ":1: not valid UTF-8 (byte 3)"),
    ],
    ids=["empty", "not-utf8"],
)
def test_the_teacher_warns_first_of_a_transfer_file_it_cannot_read(tmp_path, content, problem):
    (tmp_path / "u.txt").write_bytes(content)
    result = run_here(
        "distill",
        "teacher",
        SMOKE,
        f"--transfer.unlabelled_files=[{tmp_path / 'u.txt'}]",
        "--data.text_column=review",
        "--name=smoke-unreadable",
    )
    assert f"[teacher] warning: transfer.unlabelled_files: {tmp_path / 'u.txt'}{problem}" in result.stdout


def test_a_teacher_whose_training_diverged_stops_the_stage_naming_its_learning_rate(tmp_path):
    init = tiny_bert(tmp_path / "init", num_labels=2)
    steps = ["--pretrain=null", f"--model.init={init}", "--finetune.optim.max_steps=1", "--data.train_limit=32"]
    result = run_module("distill", tmp_path / "runs", "finetune", str(SMOKE), *steps, "--finetune.optim.lr=1e30")
    assert (
        "finetune: training diverged, 600 of its 600 dev logits are NaN or infinite; lower finetune.optim.lr (1e+30)"
        in result.stderr
    )


@pytest.fixture(scope="module")
def from_a_three_label_head(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The smoke recipe's two-label teacher fine-tuned (one step) from a tiny BERT with a three-label head, as an
    MNLI checkpoint has: what the stage printed, and the teacher's folder."""
    init = tiny_bert(tmp_path_factory.mktemp("three-labels"), num_labels=3)
    runs = tmp_path_factory.mktemp("runs")
    steps = ["--pretrain=null", f"--model.init={init}", "--finetune.optim.max_steps=1", "--data.train_limit=32"]
    return run_module("distill", runs, "finetune", str(SMOKE), *steps), runs / "smoke" / "teacher"


def test_an_init_checkpoint_with_a_head_for_other_labels_fine_tunes(from_a_three_label_head):
    result, _ = from_a_three_label_head
    assert result.returncode == 0, result.stderr[-3000:]


def test_an_init_checkpoint_with_a_head_for_other_labels_gives_the_teacher_a_head_of_the_recipe_s_labels(
    from_a_three_label_head,
):
    _, teacher = from_a_three_label_head
    assert heads.load_teacher(teacher).classifier.out_features == 2


def test_an_init_checkpoint_with_a_head_for_other_labels_is_warned_of_naming_both_counts(from_a_three_label_head):
    result, _ = from_a_three_label_head
    assert "head for 3 labels and data.label_names 2: classifier.bias, classifier.weight drawn afresh" in result.stdout


# The smoke recipe as a GPT teacher's: its Transformer student cannot start from a GPT's blocks.
GPT = ["--model.family=gpt", "--distill.students.transformer.init_from_teacher=false"]


def short_gpt2(tmp_path, data_dir) -> Path:
    """A GPT-2 init checkpoint of 32 positions, fewer than the smoke recipe's 64 tokens per text."""
    texts = (data_dir / "unlabeled" / "movie_reviews.txt").read_text().splitlines()[:300]
    return write_gpt2(tmp_path / "gpt2-short", texts, positions=32)


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_a_gpt2_init_under_model_family_bert_is_refused_before_training(stage, tmp_path, data_dir):
    init = short_gpt2(tmp_path, data_dir)
    without = ["--pretrain=null"] if stage == "finetune" else []
    result = run_here("distill", stage, SMOKE, f"--model.init={init}", "--model.max_length=32", *without)
    assert f"model.family=bert wants a BERT-style encoder, but {init} is a gpt2" in result.stderr


def test_a_max_length_past_the_init_checkpoints_positions_is_refused_before_training(tmp_path, data_dir):
    init = short_gpt2(tmp_path, data_dir)
    result = run_here("distill", "finetune", SMOKE, *GPT, f"--model.init={init}", "--pretrain=null")
    assert f"model.max_length=64, but {init} has 32 positions" in result.stderr


def test_a_pretrain_seq_len_past_the_init_checkpoints_positions_is_refused_before_training(tmp_path, data_dir):
    init = short_gpt2(tmp_path, data_dir)
    result = run_here("distill", "pretrain", SMOKE, *GPT, f"--model.init={init}", "--model.max_length=32")
    assert f"pretrain.seq_len=64, but {init} has 32 positions" in result.stderr


def test_reinit_layers_for_an_encoder_decoder_is_refused_naming_its_decoder():
    from transformers import BartConfig, BartForSequenceClassification

    config = BartConfig(
        vocab_size=50, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=32,
    )  # fmt: skip
    with pytest.raises(RecipeError, match="BartForSequenceClassification is an encoder-decoder, whose head reads"):
        reinit_top_layers(BartForSequenceClassification(config), 1)


def test_reinit_layers_for_a_model_without_initializer_range_is_refused():
    from transformers import XLMConfig, XLMForSequenceClassification

    model = XLMForSequenceClassification(XLMConfig(vocab_size=50, emb_dim=16, n_layers=2, n_heads=2))
    with pytest.raises(RecipeError, match="XLMForSequenceClassification's config gives no initializer_range"):
        reinit_top_layers(model, 1)
