import copy
import dataclasses
import gc
import json
import weakref
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common.config.training import LossWeights, OptimConfig, RuntimeConfig, StudentConfig, StudentRun
from edgedistill.common.data import load_splits
from edgedistill.common.recipe import RecipeError, load_recipe
from edgedistill.common.stage import Inputs
from edgedistill.common.textstyle import tokenise
from edgedistill.distill import heads, pipeline, stages, student_stage
from edgedistill.distill.batching import collate
from edgedistill.distill.device import resolve
from edgedistill.distill.finetune import predict_logits
from edgedistill.distill.losses import attention_kl
from edgedistill.distill.metrics import task_metrics
from edgedistill.distill.student_stage import (
    DistillObjective,
    _transfer_data,
    check_students,
    distill_batch,
    load_student,
    student_logits,
    write_tokenizer,
)
from edgedistill.distill.students import ARCHITECTURES, build_student, init_from_teacher
from edgedistill.distill.tokenization import encode, load_tokenizer, train_tokenizer
from edgedistill.distill.trainer import Trainer
from edgedistill.distill.transfer_texts import TransferTexts
from tokenizers import Tokenizer
from torch import nn
from transformers import AutoTokenizer, BartConfig, BertConfig, BertModel, RobertaConfig

from tests.conftest import ROOT, save_initialised
from tests.distill import extension
from tests.distill.bert_init import tiny_bert
from tests.distill.ranks import on_two_ranks

pytestmark = pytest.mark.slow
SMOKE = load_recipe(ROOT / "recipes" / "smoke.yaml")
STUDENTS = tuple(SMOKE.distill.students)  # a student added to the smoke recipe is checked here too


@pytest.mark.parametrize("name", STUDENTS)
def test_student_artifact_reproduces_its_dev_accuracy(smoke_run, name):
    arch = SMOKE.distill.students[name].model.arch
    folder = smoke_run / f"student-{name}"
    manifest = mf.load(folder)
    assert manifest.info["kind"] == "distilled"
    assert manifest.info["arch"] == arch
    assert set(manifest.parents) == {"transfer", "teacher"}
    student, cfg = load_student(folder)
    assert cfg.arch == arch
    assert manifest.metrics["params"] == sum(p.numel() for p in student.parameters())
    tokenizer = load_tokenizer(str(smoke_run / "teacher"))
    dev = load_splits(SMOKE.data)[1].as_served(SMOKE.text_style)  # as the bundle serves it
    feats = encode(tokenizer, dev.texts, None, SMOKE.transfer.max_length)
    with torch.no_grad():
        logits = predict_logits(lambda b: student(b["input_ids"], b["attention_mask"]), feats, tokenizer.pad_token_id)
    accuracy = task_metrics(logits, dev.labels, SMOKE.data)["dev_accuracy"]
    assert accuracy == pytest.approx(manifest.metrics["dev_accuracy"])
    assert accuracy > 0.6, "a distilled smoke student must beat the majority class (about 0.52)"
    vocabulary = [json.loads((f / "tokenizer.json").read_text())["model"] for f in (folder, smoke_run / "teacher")]
    assert vocabulary[0] == vocabulary[1]  # the teacher's, truncating at the student's max length


class Encoded(Exception):
    """Raised by `encode_spy` once the stage has encoded its dev texts, which it holds."""


def encode_spy(*args, **kwargs):
    raise Encoded(args[1])


@pytest.mark.parametrize("baseline", [False, True])
def test_a_student_is_scored_on_dev_text_as_its_bundle_serves_it(smoke_run, monkeypatch, baseline):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_run.parent))
    train, dev = load_splits(SMOKE.data)
    shouted = dataclasses.replace(dev, texts=[text.upper() for text in dev.texts])  # as people write, not as SST-2
    monkeypatch.setattr(student_stage, "load_splits", lambda data: (train, shouted))
    monkeypatch.setattr(student_stage, "encode", encode_spy)
    inputs = stages.student(SMOKE, "cnn", baseline).inputs()
    with pytest.raises(Encoded) as encoded:
        student_stage.build_stage(inputs, "cnn", baseline, None)
    assert encoded.value.args[0] == [tokenise(text) for text in shouted.texts]


class Trained(Exception):
    """Raised once the stage has trained, with the training's progress."""


def _baseline_history(tmp_path, monkeypatch) -> list[dict]:
    """The history of a cnn baseline of two epochs of its student's 3 batches (4, 4 and 2 sentences) over 20 train
    examples, whose own epochs are 5 batches."""
    teacher = tiny_bert(tmp_path / "teacher", 2)
    optim = {"distill.students.cnn.optim.epochs": 2, "distill.students.cnn.optim.batch_size": 4}
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"data.train_limit": 20, "data.dev_limit": 10, **optim})
    manifests = {"teacher": SimpleNamespace(metrics={}), "transfer": SimpleNamespace(metrics={"sentences": 10})}
    folders = {"teacher": teacher, "transfer": tmp_path / "transfer"}
    inputs = Inputs(recipe, "hash", tmp_path / "work", False, manifests, folders, "key", tmp_path / "baseline-cnn")
    fit = Trainer.fit

    def fit_then_stop(self, *args, **kwargs):
        raise Trained(fit(self, *args, **kwargs))

    monkeypatch.setattr(Trainer, "fit", fit_then_stop)
    with pytest.raises(Trained) as trained:
        student_stage.build_stage(inputs, "cnn", True, None)
    return trained.value.args[0].history


def test_a_baseline_trains_and_evaluates_at_the_steps_of_its_student_over_a_transfer_set_a_batch_does_not_divide(
    tmp_path, monkeypatch
):
    # at the end of each of the student's two epochs
    assert [entry["step"] for entry in _baseline_history(tmp_path, monkeypatch)] == [3, 6]


def test_a_baseline_s_history_counts_the_epochs_of_its_student(tmp_path, monkeypatch):
    assert [entry["epoch"] for entry in _baseline_history(tmp_path, monkeypatch)] == [1.0, 2.0]


@pytest.mark.parametrize("name", STUDENTS)
def test_baseline_has_the_same_budget_and_no_teacher(smoke_run, name):
    student = mf.load(smoke_run / f"student-{name}")
    baseline = mf.load(smoke_run / f"baseline-{name}")
    assert baseline.info["kind"] == "baseline"
    # The transfer set is a parent only for its size (the step budget): the baseline trains on the labelled train set.
    assert baseline.info["train_examples"] == len(load_splits(SMOKE.data)[0])
    assert baseline.info["losses"] == {"kd": 0.0, "mse": 0.0, "ce": 1.0, "hidden": 0.0, "attention": 0.0}
    assert baseline.info["steps"] <= student.info["steps"]
    assert baseline.metrics["params"] == student.metrics["params"]


def test_a_baseline_records_no_temperature_as_its_hash_covers_none(smoke_run):
    assert "temperature" not in mf.load(smoke_run / "baseline-cnn").info


def test_a_student_records_its_temperature(smoke_run):
    assert mf.load(smoke_run / "student-cnn").info["temperature"] == 2.0


def test_padding_does_not_change_student_predictions(smoke_run):
    student, _ = load_student(smoke_run / "student-bilstm")
    feats = {"input_ids": [[2, 40, 41, 42, 3], [2, 50, 3]]}
    batch = collate(feats, [0, 1], pad_id=0)
    with torch.no_grad():
        together = student(batch["input_ids"], batch["attention_mask"])
        alone = student(torch.tensor([[2, 50, 3]]), torch.ones(1, 3, dtype=torch.long))
    assert torch.allclose(together[1], alone[0], atol=1e-5)


def test_distill_summary_lists_the_teacher_then_every_student_with_its_gain_and_retention(smoke_run):
    rows = json.loads((smoke_run / "distill-summary.json").read_text())
    assert [r["student"] for r in rows] == ["teacher", *STUDENTS]
    for row in rows[1:]:
        # the three figures are each rounded to 4 decimals
        assert row["gain"] == pytest.approx(row["dev_accuracy"] - row["baseline"], abs=1.5e-4)
        assert 0 < row["retention"] <= 1.5
    assert "| bilstm | bilstm |" in (smoke_run / "distill-summary.md").read_text()


def test_students_train_under_torchrun(smoke_run, tmp_path):
    """Two CPU processes (gloo) distil a student from the shared transfer set, each accumulating two micro-batches
    (DDP's no_sync on the first)."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    from tests.conftest import PYTHON

    runs = tmp_path / "runs"
    shutil.copytree(smoke_run, runs / "smoke", ignore=shutil.ignore_patterns("student-*", "baseline-*", "bundle-*"))
    env = {**os.environ, "EDGEDISTILL_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1"}
    torchrun = Path(PYTHON).with_name("torchrun")
    cmd = [torchrun, "--standalone", "--nproc_per_node=2", "-m", "distill", "distill", ROOT / "recipes" / "smoke.yaml"]
    result = subprocess.run(
        [*map(str, cmd), "--only=cnn", "--no-baseline", "--distill.students.cnn.optim.grad_accum=2"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    student = mf.load(runs / "smoke" / "student-cnn")
    assert student.info["world_size"] == 2
    assert student.info["grad_accum"] == 2
    assert student.metrics["dev_accuracy"] > 0.6


def test_how_a_student_s_batch_is_split_leaves_its_hash_unchanged():
    changed = load_recipe(ROOT / "recipes" / "smoke.yaml", {"distill.students.cnn.optim.grad_accum": 5})
    assert stages.student(changed, "cnn").config_hash == stages.student(SMOKE, "cnn").config_hash


STEP_BUDGET = {"distill.students.cnn.optim.max_steps": 50}


@pytest.mark.parametrize("baseline", [False, True], ids=["student", "baseline"])
def test_epochs_leave_the_hash_unchanged_where_max_steps_is_the_step_budget(baseline):
    budget = load_recipe(ROOT / "recipes" / "smoke.yaml", STEP_BUDGET)
    longer = load_recipe(ROOT / "recipes" / "smoke.yaml", STEP_BUDGET | {"distill.students.cnn.optim.epochs": 5})
    assert stages.student(longer, "cnn", baseline).config_hash == stages.student(budget, "cnn", baseline).config_hash


KD = {"distill.students.cnn.losses.kd": 0.5}  # the soft-target loss, which the temperature is read by
DISTILLATION_ALONE = [("temperature", 5.0), ("losses.kd", 1.0), ("losses.ce", 0.5), ("init_from_teacher", False)]


def with_kd(overrides: dict | None = None):
    """The smoke recipe with the cnn student's kd loss weighed, and `overrides`."""
    return load_recipe(ROOT / "recipes" / "smoke.yaml", KD | (overrides or {}))


@pytest.mark.parametrize(("key", "value"), DISTILLATION_ALONE)
def test_a_setting_of_the_distillation_alone_leaves_the_baseline_s_hash_unchanged(key, value):
    changed = with_kd({f"distill.students.cnn.{key}": value})
    assert stages.student(changed, "cnn", True).config_hash == stages.student(with_kd(), "cnn", True).config_hash


@pytest.mark.parametrize(("key", "value"), DISTILLATION_ALONE)
def test_a_setting_of_the_distillation_makes_the_student_stale(key, value):
    changed = with_kd({f"distill.students.cnn.{key}": value})
    assert stages.student(changed, "cnn").config_hash != stages.student(with_kd(), "cnn").config_hash


@pytest.mark.parametrize(("key", "value"), [("baseline_init_from_teacher", True), ("optim.lr", 0.01)])
def test_a_setting_the_baseline_reads_makes_it_stale(key, value):
    changed = load_recipe(ROOT / "recipes" / "smoke.yaml", {f"distill.students.cnn.{key}": value})
    assert stages.student(changed, "cnn", True).config_hash != stages.student(SMOKE, "cnn", True).config_hash


@pytest.mark.parametrize(("hidden", "attention"), [(0.0, 1.0), (1.0, 0.0), (1.0, 1.0)])
def test_every_parameter_of_the_objective_gets_a_gradient(hidden, attention):
    # DDP refuses a parameter without a gradient: a projection made for a hidden-state term weighted 0 had none
    torch.manual_seed(0)
    cfg = StudentConfig(arch="transformer", vocab_size=50, hidden_size=8, num_layers=2, num_heads=2,
                        intermediate_size=16, max_length=16)  # fmt: skip
    teacher = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32, attn_implementation="eager")).eval()  # fmt: skip
    run = StudentRun(model=cfg, losses={"mse": 1.0, "hidden": hidden, "attention": attention})
    objective = DistillObjective(build_student(cfg), run, teacher)
    ids = torch.randint(1, 50, (3, 7))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    objective(batch, torch.randn(3, 2), torch.tensor([0, 1, 0])).backward()
    assert [name for name, p in objective.named_parameters() if p.grad is None] == []


def test_the_attention_term_of_a_student_copied_from_its_teacher_is_zero_in_train_mode():
    # eager attention returns its probabilities after dropout, whose rows no longer sum to 1 (a KL of 2.48 here)
    torch.manual_seed(0)
    cfg = StudentConfig(arch="transformer", vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                        intermediate_size=32, max_length=16, dropout=0.1)  # fmt: skip
    teacher = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32, attn_implementation="eager")).eval()  # fmt: skip
    student = build_student(cfg)
    init_from_teacher(student, teacher)
    objective = DistillObjective(student, StudentRun(model=cfg, losses={"mse": 1.0, "attention": 1.0}), teacher)
    for name, module in student.named_modules():  # dropout of the hidden states would move the attentions too
        if isinstance(module, nn.Dropout) and not name.endswith("attention.self.dropout"):
            module.p = 0.0
    ids = torch.randint(1, 50, (3, 7))
    mask = torch.ones_like(ids)
    _, _, s_attn = objective.student.train()(ids, mask, return_internals=True)
    with torch.no_grad():
        t_attn = teacher(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    for s, t in objective.pairs:
        assert attention_kl(s_attn[s - 1], t_attn[t - 1], mask).item() < 1e-6, f"student layer {s}"


def _step_gradient(folder, grad_accum: int, term: str) -> list[float]:
    """The gradient of one step of a student trained on loss `term` and the logit MSE (which reaches every weight, as
    DDP needs), over a batch of 4 texts of 4, 3, 5 and 3 tokens labelled [1, -100, 0, 0], flattened (plain floats,
    which a rank's process hands back)."""
    torch.manual_seed(0)
    cfg = StudentConfig(arch="transformer", vocab_size=50, hidden_size=8, num_layers=1, num_heads=2,
                        intermediate_size=16, max_length=16, dropout=0.0)  # fmt: skip
    # weights far from BERT's small init: attention far from uniform, whose KL terms would be nearly 0
    teacher = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32, initializer_range=1.0,
                                   attn_implementation="eager")).eval()  # fmt: skip
    objective = DistillObjective(build_student(cfg), StudentRun(model=cfg, losses={"mse": 1.0, term: 1.0}), teacher)
    feats = {"input_ids": [[2, 7, 9, 3], [2, 5, 3], [2, 8, 8, 11, 3], [2, 6, 3]]}
    make_batch = partial(distill_batch, feats, torch.zeros(4, 2), torch.tensor([1, -100, 0, 0]), 0)
    optim = OptimConfig(lr=1e-3, batch_size=4, grad_accum=grad_accum, max_steps=1)
    trainer = Trainer(objective, optim, folder, "h", "test", resolve(RuntimeConfig(device="cpu", precision="fp32")))
    grads = []  # as the optimizer steps on them: accumulated, and averaged over the ranks
    trainer.optimizer.register_step_pre_hook(
        lambda *_: grads.extend(torch.cat([p.grad.flatten() for p in objective.parameters()]).tolist())
    )
    trainer.fit(lambda epoch: [[0, 1, 2, 3]], make_batch, lambda m, batch: m(*batch), lambda m: {"score": 0.0},
                "score", lambda m, _: None)  # fmt: skip
    return grads


# Micro-batches of texts 0, 2 and 1, 3 hold 2 and 1 labelled rows, 9 and 6 real tokens: each averaging over its own
# would weigh the rows or tokens of the second more than those of the first.
AVERAGED_TERMS = ["ce", "hidden", "attention"]


@pytest.mark.parametrize("term", AVERAGED_TERMS)
def test_a_term_averaged_over_rows_or_tokens_has_the_same_gradient_whatever_the_split_of_its_batch(tmp_path, term):
    whole, split = _step_gradient(tmp_path / "one", 1, term), _step_gradient(tmp_path / "two", 2, term)
    assert (torch.tensor(split) - torch.tensor(whole)).abs().max().item() < 1e-6


@pytest.mark.parametrize("term", AVERAGED_TERMS)
def test_a_term_averaged_over_rows_or_tokens_has_the_same_gradient_on_two_ranks_as_on_one(tmp_path, term):
    whole = _step_gradient(tmp_path / "one", 1, term)
    ranks = on_two_ranks(tmp_path, _step_gradient, str(tmp_path / "two"), 1, term)
    assert (torch.tensor(ranks[0]) - torch.tensor(whole)).abs().max().item() < 1e-6


def _loaded_teacher(tmp_path, monkeypatch, matched: bool):
    """A weak reference to the teacher encoder `teacher_in_training` loaded to start a CNN student from (and match
    the layers of, where `matched`), and what it returned."""
    config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16)
    save_initialised(BertModel, config, tmp_path / "teacher")
    load, loaded = heads.load_encoder, []
    monkeypatch.setattr(heads, "load_encoder", lambda *args, **kw: loaded.append(load(*args, **kw)) or loaded[-1])
    student = build_student(StudentConfig(arch="cnn", vocab_size=50, embed_dim=4, num_filters=4))
    returned = student_stage.teacher_in_training(student, tmp_path / "teacher", copied=True, matched=matched)
    teacher = weakref.ref(loaded.pop())
    return teacher, returned


def test_a_teacher_only_copied_from_is_let_go_before_training(tmp_path, monkeypatch):
    teacher, handed_to_training = _loaded_teacher(tmp_path, monkeypatch, matched=False)
    gc.collect()
    assert teacher() is None


def test_a_teacher_whose_layers_are_matched_is_kept_for_training(tmp_path, monkeypatch):
    teacher, returned = _loaded_teacher(tmp_path, monkeypatch, matched=True)
    assert returned is teacher()


def _objective_with_teacher() -> tuple[DistillObjective, BertModel]:
    torch.manual_seed(0)
    cfg = StudentConfig(arch="transformer", vocab_size=50, hidden_size=8, num_layers=2, num_heads=2,
                        intermediate_size=16, max_length=16, dropout=0.5)  # fmt: skip
    teacher = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32, attn_implementation="eager")).eval()  # fmt: skip
    run = StudentRun(model=cfg, losses={"mse": 1.0, "hidden": 1.0})
    return DistillObjective(build_student(cfg), run, teacher), teacher


def test_a_copy_of_the_objective_shares_the_frozen_teacher():
    # the weights' moving average copies the objective: a second teacher would double its memory
    objective, teacher = _objective_with_teacher()
    assert copy.deepcopy(objective).teacher[0] is teacher


def test_student_logits_are_computed_with_dropout_off_whatever_mode_training_left():
    objective, _ = _objective_with_teacher()
    feats = {"input_ids": [[2, 7, 9, 11, 3], [2, 5, 3]]}
    with torch.no_grad():
        first = student_logits(objective.student.train(), feats, 0)
        second = student_logits(objective.student.train(), feats, 0)
    assert (first == second).all()


def test_a_student_whose_training_diverged_stops_the_stage_naming_its_learning_rate():
    student = build_student(student_stage.student_config(SMOKE, SMOKE.distill.students["cnn"], 50, 0))
    with torch.no_grad():
        student.classifier.weight.fill_(float("nan"))  # as a step too large leaves the weights
    feats = {"input_ids": [[2, 7, 9, 11, 3], [2, 5, 3]]}
    diverged = r"cnn: training diverged, 4 of its 4 dev logits are NaN .*lower distill.students.cnn.optim.lr \(0.003\)"
    with pytest.raises(RecipeError, match=diverged):
        student_stage.dev_metrics(student, feats, [0, 1], SMOKE, "cnn", 0)


def test_the_teacher_logits_of_the_transfer_set_stay_float16_in_memory(tmp_path):
    TransferTexts(["a fine film", "dull"], None, np.zeros(2, np.int8), np.array([-1, 1]), {}).write(tmp_path)
    np.save(tmp_path / "logits.npy", np.ones((2, 2), np.float16))
    _, logits, _ = _transfer_data(tmp_path, train_tokenizer("bert", ["a fine film", "dull"] * 5, 40), 16)
    assert logits.dtype == torch.float16


def student_tokenizer_folder(tmp_path, max_length: int):
    """A student folder's tokenizer files, written from a teacher's saved truncating at 64 tokens of 512."""
    teacher = train_tokenizer("bert", ["a fine film", "dull"] * 5, 40)
    teacher.backend_tokenizer.enable_truncation(64)  # the last call's truncation, which save_pretrained keeps
    teacher.model_max_length = 512
    teacher.save_pretrained(tmp_path / "teacher")
    (tmp_path / "student").mkdir()
    write_tokenizer(tmp_path / "teacher", tmp_path / "student", max_length)
    return tmp_path / "student"


def test_a_student_folder_s_tokenizer_truncates_at_the_student_s_max_length(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(student_tokenizer_folder(tmp_path, 8))
    assert len(tokenizer("fine " * 100, truncation=True)["input_ids"]) == 8


def test_a_student_folder_s_tokenizer_json_alone_truncates_at_the_student_s_max_length(tmp_path):
    tokenizer = Tokenizer.from_file(str(student_tokenizer_folder(tmp_path, 8) / "tokenizer.json"))
    assert len(tokenizer.encode("fine " * 100).ids) == 8


def _recipe_from(tmp_path, config) -> object:
    """The smoke recipe with `model.init` a checkpoint folder holding `config` alone (what the check reads)."""
    config.save_pretrained(tmp_path / "init")
    return load_recipe(ROOT / "recipes" / "smoke.yaml", {"model.init": str(tmp_path / "init")})


def test_a_transformer_student_that_would_copy_a_roberta_teacher_is_refused_before_the_transfer_set(tmp_path):
    config = RobertaConfig(hidden_size=64, num_attention_heads=2, intermediate_size=128)
    with pytest.raises(
        RecipeError, match=r"distill.students.transformer starts .* the teacher.s model_type is roberta"
    ):
        check_students(_recipe_from(tmp_path, config), ["transformer"])


def test_a_transformer_student_wider_than_its_bert_teacher_is_refused_before_the_transfer_set(tmp_path):
    config = BertConfig(hidden_size=32, num_attention_heads=2, intermediate_size=128)
    with pytest.raises(RecipeError, match="sizes differ: hidden_size 64 vs 32"):
        check_students(_recipe_from(tmp_path, config), ["transformer"])


def test_a_transformer_student_sized_as_its_bert_teacher_passes_the_check(tmp_path):
    config = BertConfig(hidden_size=64, num_attention_heads=2, intermediate_size=128)
    assert check_students(_recipe_from(tmp_path, config), ["transformer"]) is None


def _recipe_with_built_teacher(tmp_path, monkeypatch, config) -> object:
    """The smoke recipe with `model.init` a folder that is gone, and a built teacher of `config` in its run folder."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "runs"))
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"model.init": str(tmp_path / "gone")})
    config.save_pretrained(stages.teacher(recipe).folder)
    return recipe


def test_a_student_passes_the_check_against_the_built_teacher_where_model_init_is_gone(tmp_path, monkeypatch):
    config = BertConfig(hidden_size=64, num_attention_heads=2, intermediate_size=128)
    assert check_students(_recipe_with_built_teacher(tmp_path, monkeypatch, config), ["transformer"]) is None


def test_a_student_wider_than_the_built_teacher_is_refused_where_model_init_is_gone(tmp_path, monkeypatch):
    config = BertConfig(hidden_size=32, num_attention_heads=2, intermediate_size=128)
    with pytest.raises(RecipeError, match="sizes differ: hidden_size 64 vs 32"):
        check_students(_recipe_with_built_teacher(tmp_path, monkeypatch, config), ["transformer"])


def test_a_cross_entropy_on_a_transfer_set_without_train_rows_is_refused_before_the_transfer_set():
    recipe = load_recipe(
        ROOT / "recipes" / "smoke.yaml", {"transfer.include_train": False, "distill.students.cnn.losses.ce": 0.5}
    )
    with pytest.raises(RecipeError, match=r"distill.students.cnn.losses.ce is 0.5, .* transfer.include_train: false"):
        check_students(recipe, ["cnn"])


def test_a_student_class_whose_forward_raises_is_refused_naming_the_student_and_the_error(monkeypatch):
    monkeypatch.setitem(ARCHITECTURES, "cnn", extension.Misbuilt)  # registered as docs/extending.md says
    with pytest.raises(RecipeError, match=r"distill.students.cnn: built at a small vocabulary .* raised RuntimeError"):
        check_students(load_recipe(ROOT / "recipes" / "smoke.yaml"), ["cnn"])


def test_the_teachers_commands_warn_of_a_student_class_whose_forward_raises_and_go_on(monkeypatch, capsys):
    monkeypatch.setitem(ARCHITECTURES, "cnn", extension.Misbuilt)
    pipeline._warn_student_problems(load_recipe(ROOT / "recipes" / "smoke.yaml"))
    assert "[teacher] warning: distill.students.cnn: built at a small vocabulary" in capsys.readouterr().out


def test_a_student_without_a_cross_entropy_passes_the_check_without_train_rows():
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"transfer.include_train": False})
    assert check_students(recipe, ["cnn"]) is None


@pytest.mark.parametrize("loss", ["hidden", "attention"])
def test_a_student_matching_the_layers_of_an_encoder_decoder_teacher_is_refused_before_the_transfer_set(tmp_path, loss):
    BartConfig(d_model=64, encoder_attention_heads=2, decoder_attention_heads=2).save_pretrained(tmp_path / "init")
    student = "distill.students.transformer"
    overrides = {"model.init": str(tmp_path / "init"), f"{student}.init_from_teacher": False}
    overrides |= {f"{student}.losses.{key}": 0.0 for key in ("hidden", "attention") if key != loss}
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", overrides)
    with pytest.raises(RecipeError, match=rf"{student}.losses.{loss} .* is an encoder-decoder \(bart\)"):
        check_students(recipe, ["transformer"])


def test_a_student_matching_no_layers_of_an_encoder_decoder_teacher_passes_the_check(tmp_path):
    BartConfig(d_model=64, encoder_attention_heads=2, decoder_attention_heads=2).save_pretrained(tmp_path / "init")
    student = "distill.students.transformer"
    overrides = {"model.init": str(tmp_path / "init"), f"{student}.init_from_teacher": False}
    overrides |= {f"{student}.losses.{key}": 0.0 for key in ("hidden", "attention")}
    assert check_students(load_recipe(ROOT / "recipes" / "smoke.yaml", overrides), ["transformer"]) is None


def as_if_kd_compared_layers(monkeypatch) -> None:
    """`LossWeights.layered` as if kd were the one term that compares the student's layers with the teacher's."""
    monkeypatch.setattr(LossWeights, "layered", property(lambda self: ["kd"] if self.kd else []))


def test_a_term_the_loss_weights_count_as_layered_runs_the_teacher_in_the_objective(monkeypatch):
    as_if_kd_compared_layers(monkeypatch)
    cfg = StudentConfig(arch="transformer", vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                        intermediate_size=32, max_length=16)  # fmt: skip
    teacher = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=32, attn_implementation="eager")).eval()  # fmt: skip
    run = StudentRun(model=cfg, losses={"mse": 1.0, "kd": 1.0})
    assert DistillObjective(build_student(cfg), run, teacher).intermediate


def test_a_term_the_loss_weights_count_as_layered_is_checked_against_the_teacher_s_layers(tmp_path, monkeypatch):
    as_if_kd_compared_layers(monkeypatch)
    BartConfig(d_model=64, encoder_attention_heads=2, decoder_attention_heads=2).save_pretrained(tmp_path / "init")
    student = "distill.students.transformer"
    overrides = {"model.init": str(tmp_path / "init"), f"{student}.init_from_teacher": False}
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", overrides | {f"{student}.losses": {"mse": 1.0, "kd": 1.0}})
    with pytest.raises(RecipeError, match=rf"{student}.losses.kd .* is an encoder-decoder \(bart\)"):
        check_students(recipe, ["transformer"])


DEEPER = {"distill.students.transformer.model.num_layers": 3}
COPYING = {"distill.students.transformer.losses": {"mse": 1.0}}  # init_from_teacher, by default
MATCHING = {"distill.students.transformer.init_from_teacher": False, "distill.students.transformer.losses.attention": 0}


@pytest.mark.parametrize("uses", [COPYING, MATCHING], ids=["copying", "matching"])
def test_a_transformer_student_deeper_than_its_teacher_is_refused_before_the_transfer_set(tmp_path, uses):
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    config.save_pretrained(tmp_path / "init")
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"model.init": str(tmp_path / "init")} | DEEPER | uses)
    with pytest.raises(RecipeError, match=r"distill.students.transformer.model.num_layers is 3, .* has 2 layers"):
        check_students(recipe, ["transformer"])


def test_a_transformer_student_deeper_than_a_teacher_from_scratch_is_refused_before_the_transfer_set():
    # a BERT config made without num_hidden_layers says 12: the recipe's model.num_layers (2) is the teacher's depth
    with pytest.raises(RecipeError, match=r"distill.students.transformer.model.num_layers is 3, .* has 2 layers"):
        check_students(load_recipe(ROOT / "recipes" / "smoke.yaml", DEEPER), ["transformer"])
