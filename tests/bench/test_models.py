"""The model benchmark: which bundles it can time here, and its table on the smoke run."""

import shutil

import numpy as np
import pytest
import torch
from edgedistill.bench import model_stage, models
from edgedistill.bench.__main__ import main as bench_main
from edgedistill.bench.records import ModelTable, Timing
from edgedistill.common import manifest as mf
from edgedistill.common import runtime
from edgedistill.common.bundle import read_bundle
from edgedistill.common.config.export import BundleRecipe
from edgedistill.common.config.measure import ModelBenchConfig
from edgedistill.common.modelcard import TEACHER_ROW
from edgedistill.common.recipe import RecipeError, load_recipe, parse_overrides
from edgedistill.common.runtime import missing_here
from edgedistill.common.stage import Inputs
from edgedistill.distill.device import DeviceError
from edgedistill.distill.heads import TOKEN_INPUTS
from edgedistill.distill.tokenization import train_tokenizer
from tokenizers import Tokenizer
from tqdm import tqdm

from tests.bart_init import bart_tokenizer
from tests.conftest import LOADING, ROOT, loaded_by, run_module
from tests.distill.test_transfer import rebuilt
from tests.serve.conftest import pair_spec, tiny_tokenizer, write_bundle

SMOKE = ROOT / "recipes" / "smoke.yaml"
TEXTS = ["a text and its pair", "another text"] * 20


def test_bench_times_a_gpu_bundle_only_where_its_provider_is_offered(monkeypatch):
    cuda = BundleRecipe(source="teacher", providers=["CUDAExecutionProvider"])
    monkeypatch.setattr(runtime, "available_providers", lambda: ["CPUExecutionProvider"])
    assert model_stage.left_out(cuda) == "CUDAExecutionProvider not offered by this onnxruntime build"
    assert model_stage.left_out(BundleRecipe(source="teacher")) is None
    assert "runtime tensorrt" in model_stage.left_out(BundleRecipe(source="teacher", runtime="tensorrt"))
    monkeypatch.setattr(runtime, "available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(runtime, "provider_problem", lambda provider: None)  # offered, and it starts
    assert model_stage.left_out(cuda) is None


@pytest.mark.parametrize("where", ["EDGEDISTILL_DEVICE", "--runtime.device"])
def test_the_eager_teacher_is_timed_on_the_device_the_recipe_names(monkeypatch, where):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # honoured even where PyTorch sees a GPU
    monkeypatch.delenv("EDGEDISTILL_DEVICE", raising=False)
    if where == "EDGEDISTILL_DEVICE":
        monkeypatch.setenv("EDGEDISTILL_DEVICE", "cpu")
        recipe = load_recipe(SMOKE)
    else:
        recipe = load_recipe(SMOKE, parse_overrides(["--runtime.device=cpu"]))
    assert model_stage.eager_devices(recipe.runtime) == ["cpu"]


def test_the_eager_teacher_on_cuda_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = load_recipe(SMOKE, parse_overrides(["--runtime.device=cuda"]))
    with pytest.raises(DeviceError, match="runtime.device=cuda but no CUDA device visible to PyTorch"):
        model_stage.eager_devices(recipe.runtime)


def test_bench_before_any_bundle_is_built_is_refused_naming_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    assert bench_main(["models", str(SMOKE)]) == 2
    assert f"is built yet: build them first (edgedistill bundles {SMOKE}" in capsys.readouterr().err


def bench_of_stale_bundles(run, monkeypatch, capsys, *overrides: str) -> tuple[int, str]:
    """`bench models` of the smoke recipe with `overrides` on the run folder `run`, its benchmark removed so that it is
    built: its exit status and what it wrote to stderr."""
    shutil.rmtree(run / "bench", ignore_errors=True)
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(run.parent))
    status = bench_main(["models", str(SMOKE), *overrides])
    return status, capsys.readouterr().err


def test_a_bundle_edited_in_the_recipe_since_it_was_built_is_refused_before_it_is_timed(
    smoke_bundles_copy, monkeypatch, capsys
):
    edited = "--export.bundles.bilstm-fp32.precision=int8"
    status, err = bench_of_stale_bundles(smoke_bundles_copy, monkeypatch, capsys, edited)
    assert status == 2
    assert 'export.bundles.bilstm-fp32.precision "fp32" -> "int8")' in err  # why, among the gates int8 reads
    assert "--only bilstm-fp32, with those of the overrides given here that it reads; make takes none)" in err
    assert not (smoke_bundles_copy / "bench").exists()  # nothing timed, nothing published


def test_bundles_whose_student_was_built_again_are_refused_each_named(smoke_bundles_copy, monkeypatch, capsys):
    rebuilt(smoke_bundles_copy / "student-bilstm")
    err = bench_of_stale_bundles(smoke_bundles_copy, monkeypatch, capsys)[1]
    assert "bundle-bilstm-fp32 (its parent student-bilstm was built again); bundle-bilstm-int8 (its parent" in err


def test_bundles_out_of_date_without_overrides_are_built_again_by_the_command_and_make_named(
    smoke_bundles_copy, monkeypatch, capsys
):
    rebuilt(smoke_bundles_copy / "student-bilstm")
    err = bench_of_stale_bundles(smoke_bundles_copy, monkeypatch, capsys)[1]
    assert f"(edgedistill bundles {SMOKE} --only bilstm-fp32 --only bilstm-int8; make bundles in a checkout)" in err


@pytest.mark.slow
def test_bench_writes_its_tables(smoke_bundles, capsys, monkeypatch):
    # measured here, whether or not a test before it (the report's) measured this smoke run
    result = run_module("bench", smoke_bundles.parent, "models", str(SMOKE), "--force")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = ModelTable.load(smoke_bundles / "bench").rows
    assert rows[0].model == "teacher-pytorch-eager"
    assert rows[0].cell(1, 16).speedup == 1.0
    bundles = load_recipe(SMOKE).export.bundles
    here = {
        b
        for b, spec in bundles.items()
        if spec.runtime == "onnxruntime" and not missing_here("onnxruntime", spec.providers)
    }
    assert {r.model for r in rows if not r.model.startswith("teacher-pytorch-eager")} == here
    # the bundles this machine cannot time (bilstm-engine on every one: the server times engines) and why
    left_out = {b: model_stage.left_out(spec) for b, spec in bundles.items() if b not in here}
    for bundle_id, reason in left_out.items():
        assert f"[bench] {bundle_id} not timed here: {reason}\n" in result.stdout
    assert mf.load(smoke_bundles / "bench").info["left_out"] == left_out
    for row in rows:
        for cell in row.cells:
            assert cell.min_ms <= cell.median_ms <= cell.max_ms
            assert cell.calls >= 5
    assert "teacher-int8" in (smoke_bundles / "bench" / "bench.md").read_text()
    manifest = mf.load(smoke_bundles / "bench")
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    assert bench_main(["models", str(SMOKE)]) == 0  # again, in this process: it only reads the manifests
    assert "[bench] up to date" in capsys.readouterr().out
    assert mf.load(smoke_bundles / "bench").created == manifest.created  # not measured again


def test_a_bundle_is_timed_from_the_model_it_verified_not_a_file_swapped_in_since(swapped_after_check):
    folder = swapped_after_check(models)
    cfg = ModelBenchConfig(batch_sizes=[1], seq_lens=[8], warmup=0, iterations=1, min_seconds=0, threads=1)
    _, timings = models._bundle_row("teacher-fused", folder, cfg, tqdm(disable=True), "accuracy")
    assert list(timings) == [(1, 8)]


class RecordingRunner:
    """A runner that keeps every feed it is given and returns no output."""

    providers = ["CPUExecutionProvider"]

    def __init__(self):
        self.feeds = []

    def infer(self, feed):
        self.feeds.append(feed)
        return {}

    def close(self):
        pass


@pytest.mark.parametrize(("rule", "types"), [("token_types", [0] * 16), ("sequence_ids", [0] * 8 + [1] * 8)])
def test_a_pair_bundle_is_timed_with_sentence_b_marked_as_the_server_marks_it(tmp_path, monkeypatch, rule, types):
    metrics = {"size_bytes": 1, "dev_accuracy": 1.0}
    untyped = tiny_tokenizer(pair_types=False)  # type 0 throughout: only the sequence ids say where sentence B is
    spec = pair_spec(pair_segments=rule)
    folder = write_bundle(tmp_path / "bundle-pairs", metrics=metrics, tokenizer=untyped, **spec)
    runner = RecordingRunner()
    monkeypatch.setattr(models, "open_bundle", lambda bundle, **options: runner)
    cfg = ModelBenchConfig(batch_sizes=[2], seq_lens=[16], warmup=0, iterations=1, min_seconds=0, threads=1)
    models._bundle_row("pairs", folder, cfg, tqdm(disable=True), "accuracy")
    assert runner.feeds[0]["token_type_ids"].tolist() == [types] * 2


def test_an_engine_bundles_row_names_tensorrt_as_its_runtime(tmp_path, monkeypatch):
    engine_spec = {"runtime": "tensorrt", "model_file": "model.plan", "providers": ["TensorrtExecutionProvider"]}
    metrics = {"size_bytes": 1, "dev_accuracy": 1.0}
    folder = write_bundle(tmp_path / "bundle-engine-fp16", model=b"engine", metrics=metrics, **engine_spec)
    engine = RecordingRunner()
    engine.providers = ["TensorRT 10.16.1"]  # what an engine's runner reports
    monkeypatch.setattr(models, "open_bundle", lambda bundle, **options: engine)
    cfg = ModelBenchConfig(batch_sizes=[1], seq_lens=[8], warmup=0, iterations=1, min_seconds=0, threads=1)
    row, _ = models._bundle_row("engine-fp16", folder, cfg, tqdm(disable=True), "accuracy")
    assert row["runtime"] == "tensorrt (TensorRT 10.16.1)"


def cut_table(tmp_path) -> ModelTable:
    """The table of a bundle whose max_length is 16 timed at 32 tokens, beside a teacher row timed at 32."""
    metrics = {"size_bytes": 1, "dev_accuracy": 1.0}
    folder = write_bundle(tmp_path / "bundle-short", metrics=metrics, max_length=16)
    cfg = ModelBenchConfig(batch_sizes=[1], seq_lens=[32], warmup=0, iterations=1, min_seconds=0, threads=1)
    bundle = models._bundle_row("short", folder, cfg, tqdm(disable=True), "accuracy")
    teacher = {"model": TEACHER_ROW, "precision": "fp32", "runtime": "pytorch (cpu)", "size_bytes": 1}
    teacher |= {"dev_accuracy": 1.0}
    timing = Timing(median_ms=4.0, min_ms=4.0, max_ms=4.0, calls=1)
    return models.table(1, [(teacher, {(1, 32): (32, timing)}), bundle], "accuracy")


def test_a_bundle_timed_at_its_max_length_records_the_length_it_was_timed_at(tmp_path):
    assert cut_table(tmp_path).rows[1].cell(1, 32).timed_length == 16


def test_a_bundle_timed_at_fewer_tokens_than_the_teacher_has_no_speedup(tmp_path):
    assert cut_table(tmp_path).rows[1].cell(1, 32).speedup is None


def test_the_benchmark_markdown_marks_a_bundle_cut_to_its_max_length(tmp_path):
    assert " / cut to 16 |" in models.markdown(cut_table(tmp_path))


def test_a_pair_bundle_is_timed_on_token_ids_of_its_own_vocabulary(pair_bundle):
    bundle, files = read_bundle(pair_bundle)
    feed = models.bundle_feed(bundle, files.tokenizer, batch=2, length=16)
    assert feed["input_ids"].max() < Tokenizer.from_str(files.tokenizer).get_vocab_size()


def test_a_single_text_bundle_of_a_small_vocabulary_is_timed_on_token_ids_it_holds(tmp_path):
    bundle, files = read_bundle(write_bundle(tmp_path / "bundle-small-vocabulary"))
    feed = models.bundle_feed(bundle, files.tokenizer, batch=2, length=16)
    assert feed["input_ids"].max() < Tokenizer.from_str(files.tokenizer).get_vocab_size()


def test_a_model_of_a_large_vocabulary_is_timed_on_the_ids_drawn_from_1000_to_1999_as_before():
    feed = models.inputs(("input_ids",), batch=4, length=64, vocab_size=30522)
    assert feed["input_ids"].tolist() == np.random.default_rng(0).integers(1000, 2000, size=(4, 64)).tolist()


def test_a_pair_bundle_is_timed_on_rows_of_the_cell_s_length(pair_bundle):
    bundle, files = read_bundle(pair_bundle)
    assert models.bundle_feed(bundle, files.tokenizer, batch=3, length=9)["attention_mask"].shape == (3, 9)


@pytest.mark.parametrize("field", ["batch_sizes", "seq_lens"])
def test_a_shape_listed_twice_is_refused_naming_the_field_and_the_value(field):
    with pytest.raises(ValueError, match=f"{field} lists 16 more than once"):
        ModelBenchConfig(**{field: [16, 8, 16]})


def test_a_length_too_short_for_a_pair_is_refused_with_the_setting_to_change(pair_bundle):
    bundle, files = read_bundle(pair_bundle)
    with pytest.raises(RecipeError, match="bench.models.seq_lens"):
        models.bundle_feed(bundle, files.tokenizer, batch=1, length=4)


def test_a_pair_teacher_is_timed_with_its_tokenizer_s_token_type_ids():
    tokenizer = train_tokenizer("bert", ["a text and its pair", "another text"] * 20, vocab_size=100)
    feed = models.teacher_feed(tokenizer, TOKEN_INPUTS, batch=2, length=16, pairs=True)
    assert feed["token_type_ids"].tolist() == [[0] * 8 + [1] * 8] * 2


def test_a_row_of_an_f1_recipe_takes_dev_f1_from_the_manifest():
    metrics = {"size_bytes": 10, "dev_accuracy": 0.8, "dev_macro_f1": 0.75, "dev_f1": 0.7}
    assert models._figures(metrics, "f1")["dev_selected"] == 0.7


def test_a_row_of_an_accuracy_recipe_has_no_second_dev_figure():
    metrics = {"size_bytes": 10, "dev_accuracy": 0.8, "dev_macro_f1": 0.75}
    assert models._figures(metrics, "accuracy")["dev_selected"] is None


def test_the_benchmark_is_measured_again_when_the_eager_teacher_moves_to_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "a GPU")
    on_cpu, on_gpu = (load_recipe(SMOKE, parse_overrides([f"--runtime.device={d}"])) for d in ("cpu", "cuda"))
    assert model_stage.stage(on_cpu).config_hash != model_stage.stage(on_gpu).config_hash


def test_bench_json_ends_with_a_newline_as_every_result_file(monkeypatch, tmp_path):
    recipe = load_recipe(SMOKE)
    timing = Timing(median_ms=1.0, min_ms=1.0, max_ms=1.0, calls=5)
    row = {
        "model": TEACHER_ROW,
        "precision": "fp32",
        "runtime": "pytorch (cpu)",
        "size_bytes": 10,
        "dev_accuracy": 0.5,
    }
    timings = {(batch, length): (length, timing) for batch, length in models.shapes(recipe.bench.models)}
    monkeypatch.setattr(models, "_eager_row", lambda *args: (row, timings))
    folders = {"teacher": tmp_path / "teacher"}  # no bundle built: only the teacher is timed
    inputs = Inputs(recipe, "hash", tmp_path / "work", False, {}, folders, "key", tmp_path / "bench")
    models.build_stage(inputs, ["cpu"]).write(tmp_path)
    assert (tmp_path / "bench.json").read_text(encoding="utf-8").endswith("}\n")


@pytest.fixture
def bart_teacher(tmp_path):
    """A tiny BART teacher artifact whose vocabulary holds the random ids single texts are timed on (1000-1999)."""
    from transformers import BartConfig, BartForSequenceClassification

    bart_tokenizer(TEXTS).save_pretrained(tmp_path / "staged")
    config = BartConfig(
        vocab_size=2048, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128,
    )  # fmt: skip
    BartForSequenceClassification(config).save_pretrained(tmp_path / "staged")
    metrics = {"size_bytes": 1, "dev_accuracy": 0.5}
    artifact = mf.Manifest(stage="teacher", recipe="tiny", recipe_hash="h", config_hash="c", metrics=metrics)
    mf.commit(tmp_path / "staged", tmp_path / "teacher", artifact)
    return tmp_path / "teacher"


def test_an_encoder_decoder_teacher_is_timed_in_pytorch_on_texts_that_end_with_its_eos(bart_teacher):
    cfg = ModelBenchConfig(batch_sizes=[2], seq_lens=[12], warmup=0, iterations=1, min_seconds=0, threads=1)
    _, timings = models._eager_row(bart_teacher, cfg, tqdm(disable=True), torch.device("cpu"), "accuracy", False)
    assert list(timings) == [(2, 12)]


def test_a_length_beyond_the_teachers_positions_is_refused_with_the_setting_to_change(bart_teacher):
    cfg = ModelBenchConfig(batch_sizes=[1], seq_lens=[12, 200], warmup=0, iterations=1, min_seconds=0, threads=1)
    refused = pytest.raises(RecipeError, match="set bench.models.seq_lens to at most 128")
    with refused:
        models._eager_row(bart_teacher, cfg, tqdm(disable=True), torch.device("cpu"), "accuracy", False)


def test_a_text_too_short_for_an_encoder_decoder_teacher_s_special_tokens_is_refused_with_the_setting():
    tokenizer = bart_tokenizer(TEXTS)
    with pytest.raises(RecipeError, match="bench.models.seq_lens: a text cannot be cut to 1 tokens"):
        models.teacher_feed(tokenizer, TOKEN_INPUTS[:2], batch=1, length=1, pairs=False, written=True)


def test_a_current_benchmark_is_said_so_without_importing_its_timing_code_or_torch(smoke_bundles, tmp_path):
    shutil.copytree(smoke_bundles, tmp_path / "smoke")
    cpu = "--runtime.device=cpu"  # auto: a CUDA build of torch is imported to find a GPU
    assert run_module("bench", tmp_path, "models", str(SMOKE), cpu).returncode == 0  # built here, where it is not yet
    result, loaded = loaded_by("bench", tmp_path, "models", SMOKE, cpu, watched=(*LOADING, "edgedistill.bench.models"))
    assert result.stdout == f"[bench] up to date: {tmp_path / 'smoke' / 'bench'}\n", result.stderr[-3000:]
    assert loaded == []
