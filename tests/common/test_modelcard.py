import shlex
import subprocess
import sys

import pytest
from edgedistill.bench.records import RESULT_FILE, Cell, ModelRow, ModelTable
from edgedistill.common import manifest as mf
from edgedistill.common import modelcard
from edgedistill.common.bundle import BundleSpec, TensorSpec
from edgedistill.common.recipe import load_recipe, run_dir
from edgedistill.common.stage import Built, Stage
from edgedistill.distill import stages
from huggingface_hub import ModelCard

from tests.conftest import ROOT

STUDENT_INFO = {
    "arch": "bilstm",
    "kind": "distilled",
    "train_examples": 5000,
    "losses": {"kd": 1.0, "mse": 0.0, "ce": 0.5, "hidden": 0.0, "attention": 0.0},
    "temperature": 2.0,
    "init_from_teacher": True,
    "steps": 280,
}
STUDENT_METRICS = {"dev_accuracy": 0.8125, "test_accuracy": 0.8, "retention": 0.95, "params": 1000, "size_bytes": 2**20}


SMOKE = ROOT / "recipes" / "smoke.yaml"


@pytest.fixture
def recipe():
    return load_recipe(SMOKE)


def raw(recipe):
    """The recipe with its texts written as people write them."""
    return recipe.model_copy(update={"transfer": recipe.transfer.model_copy(update={"text_style": "raw"})})


def _bundle_info(**changes) -> dict:
    spec = BundleSpec(
        name="smoke-bilstm-int8",
        labels=["negative", "positive"],
        text_inputs=["text"],
        max_length=48,
        pad_token_id=0,
        inputs=[TensorSpec(name="input_ids", dtype="int64", shape=["batch", "sequence"])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=["batch", 2])],
        precision="int8",
        runtime="onnxruntime",
        providers=["CPUExecutionProvider"],
        model_file="model.onnx",
        arch="bilstm",
        opset=17,
    )
    return {"bundle": spec.model_dump() | changes, "source": "bilstm"}


def _publish(recipe, stage: str, metrics: dict | None = None, info: dict | None = None):
    """An artifact folder `stage` holding a model file and a stale card, published with its manifest."""
    final = run_dir(recipe) / stage
    with mf.stage_folder(final) as tmp:
        (tmp / "model.onnx").write_bytes(b"weights")
        (tmp / mf.CARD).write_text("an old card")
        manifest = mf.for_stage(recipe, stage, "hash", mf.Stopwatch(), metrics=metrics, info=info or {})
        mf.commit(tmp, final, manifest)
    return final


def _bench(recipe, bundle_hash: str | None = None, timed_length: int = 16) -> None:
    """A model benchmark of the run's teacher and bundle-bilstm-int8 (both published first) at 16 tokens, the bundle
    timed at `timed_length` (its max_length, where shorter: no speedup), recording the bundle's manifest hash as
    `bundle_hash` where given (an earlier build), else as it is."""
    timing = {"median_ms": 0.5, "min_ms": 0.4, "max_ms": 0.7, "calls": 5, "items_per_s": 2e3}
    speedup = 20.0 if timed_length == 16 else None
    cell = Cell(**timing, batch=1, length=16, timed_length=timed_length, speedup=speedup)
    row = ModelRow(
        model="bilstm-int8", precision="int8", runtime="onnxruntime (CPU)", size_bytes=1, dev_accuracy=0.8, cells=[cell]
    )
    run = run_dir(recipe)
    bundle = mf.parent_of(run / "bundle-bilstm-int8")
    parents = {
        "teacher": mf.parent_of(run / "teacher"),
        "bundle-bilstm-int8": bundle.model_copy(update={"manifest_sha256": bundle_hash or bundle.manifest_sha256}),
    }
    folder = run / "bench"
    with mf.stage_folder(folder) as tmp:
        (tmp / RESULT_FILE).write_text(ModelTable(threads=1, rows=[row]).model_dump_json())
        mf.commit(tmp, folder, mf.for_stage(recipe, "bench", "hash", mf.Stopwatch(), parents=parents))


def _text(recipe, folder) -> str:
    return modelcard.write(recipe, folder).read_text(encoding="utf-8")


def test_student_card_header_is_the_hubs_metadata(recipe):
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    data = ModelCard.load(modelcard.write(recipe, folder)).data
    assert data.pipeline_tag == "text-classification"
    assert data.library_name == "edgedistill"
    assert data.license == "apache-2.0"


def test_student_card_is_tagged_as_distilled(recipe):
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert "knowledge-distillation" in ModelCard.load(modelcard.write(recipe, folder)).data.tags


def test_teacher_card_is_a_transformers_model(recipe):
    folder = _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    assert ModelCard.load(modelcard.write(recipe, folder)).data.library_name == "transformers"


def test_mean_pooled_teacher_card_imports_its_head_before_loading():
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"finetune.pooling": "mean"})
    folder = _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    assert "import edgedistill.distill.heads" in _text(recipe, folder)


def test_teacher_card_of_a_recipe_that_continues_pretraining_says_the_pipeline_pretrained_its_init_further():
    recipe = load_recipe(ROOT / "recipes" / "sst2-dapt.yaml", {"model.init": "org/encoder"})
    folder = _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    assert "fine-tuned from `org/encoder` after further masked-LM pretraining by the pipeline (10 steps)." in _text(
        recipe, folder
    )


def test_card_names_the_recipes_metrics(recipe):
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert ModelCard.load(modelcard.write(recipe, folder)).data.metrics == ["accuracy"]


def test_card_header_lists_the_hub_dataset_of_the_test_split():
    recipe = load_recipe(SMOKE, {"data.test": "hub:org/held-out:test"})
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert ModelCard.load(modelcard.write(recipe, folder)).data.datasets == ["org/held-out"]


def test_student_card_gives_retention(recipe):
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert "| retention | 0.9500 |" in _text(recipe, folder)


def test_student_card_gives_losses_and_temperature(recipe):
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert "loss weights kd 1, ce 0.5, temperature 2" in _text(recipe, folder)


def test_card_lists_the_labels(recipe):
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert "2 labels: `negative`, `positive`" in _text(recipe, folder)


def test_student_card_loads_the_student_from_its_folder_in_the_runs_folder(recipe):
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert f'Student.from_pretrained("{run_dir(recipe) / "student-bilstm"}")' in _text(recipe, folder)


def test_student_card_names_the_teacher_it_was_distilled_from_in_the_runs_folder(recipe):
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert f"Distilled from `{run_dir(recipe) / 'teacher'}` on its transfer set" in _text(recipe, folder)


def test_teacher_card_loads_the_teacher_from_its_folder_in_the_runs_folder(recipe):
    folder = _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    assert f'from_pretrained("{run_dir(recipe) / "teacher"}")' in _text(recipe, folder)


def test_card_of_a_ptb_lower_task_says_to_write_texts_in_its_style(recipe):
    folder = _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert "`edgedistill.common.textstyle.tokenise`" in _text(recipe, folder)


def test_card_of_a_raw_task_says_nothing_of_a_text_style(recipe):
    folder = _publish(raw(recipe), "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert "tokenise" not in _text(raw(recipe), folder)


def test_bundle_card_of_a_ptb_lower_bundle_writes_its_text_so_before_the_tokenizer(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8}, _bundle_info(text_style="ptb_lower"))
    assert 'batch = tokenizer([tokenise("a text")], truncation=True, return_tensors="np")' in _text(recipe, folder)


def test_bundle_card_of_a_ptb_lower_bundle_imports_tokenise(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8}, _bundle_info(text_style="ptb_lower"))
    assert "\nfrom edgedistill.common.textstyle import tokenise\n" in _text(recipe, folder)


def test_bundle_card_of_a_raw_bundle_gives_the_tokenizer_the_text_as_it_is(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8}, _bundle_info(text_style="raw"))
    assert 'batch = tokenizer(["a text"], truncation=True, return_tensors="np")' in _text(recipe, folder)


def test_pair_student_card_of_a_ptb_lower_task_writes_the_text_and_its_pair_so(recipe):
    pairs = recipe.model_copy(update={"data": recipe.data.model_copy(update={"text_pair_column": "sentence2"})})
    text = _text(pairs, _publish(pairs, "student-bilstm", STUDENT_METRICS, STUDENT_INFO))
    assert 'batch = tokenizer([tokenise("a text")], [tokenise("its pair")], truncation=True' in text


def test_bundle_card_serves_the_bundle_from_its_folder_in_the_runs_folder(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, _bundle_info())
    assert f"edgedistill serve --bundle {run_dir(recipe) / 'bundle-bilstm-int8'}\n" in _text(recipe, folder)


def test_bundle_card_serves_the_bundle_with_make_from_its_folder_in_the_runs_folder(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, _bundle_info())
    assert f"make serve BUNDLE={run_dir(recipe) / 'bundle-bilstm-int8'}  # in a checkout" in _text(recipe, folder)


def _shell_words(text: str) -> list[list[str]]:
    """The words the shell reads in each line of a card's bash block, its comments left out."""
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines()]


@pytest.fixture
def odd_runs(monkeypatch, tmp_path):
    """A runs folder whose name holds a space and other characters the shell reads."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "my runs; it's $HOME"))


def test_bundle_card_serves_a_bundle_in_a_runs_folder_with_a_space_as_one_word(recipe, odd_runs):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, _bundle_info())
    assert _shell_words(_text(recipe, folder))[0] == ["edgedistill", "serve", "--bundle", str(folder)]


def test_bundle_card_names_no_make_line_for_a_runs_folder_with_a_space(recipe, odd_runs):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, _bundle_info())
    assert "make serve" not in _text(recipe, folder)


def test_bundle_card_opens_the_model_file_in_the_runs_folder(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, _bundle_info())
    model = run_dir(recipe) / "bundle-bilstm-int8" / "model.onnx"
    assert f'session = ort.InferenceSession("{model}")' in _text(recipe, folder)


def test_bundle_card_names_the_student_it_was_exported_from_in_the_runs_folder(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, _bundle_info())
    assert f"exported from `{run_dir(recipe) / 'student-bilstm'}`" in _text(recipe, folder)


def test_bundle_card_opens_the_model_with_the_optimizers_the_bundle_disables(recipe):
    info = _bundle_info(disabled_optimizers=["SkipLayerNormFusion"])
    folder = _publish(recipe, "bundle-transformer-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, info)
    assert "model.onnx\", disabled_optimizers=['SkipLayerNormFusion'])" in _text(recipe, folder)


def cuda_card(recipe, precision: str = "int8") -> str:
    """The card of a bundle of `precision` built for the CUDA provider."""
    info = _bundle_info(providers=["CUDAExecutionProvider", "CPUExecutionProvider"], precision=precision)
    return _text(recipe, _publish(recipe, "bundle-bilstm-cuda", {"dev_accuracy": 0.8, "agreement": 0.99}, info))


def test_bundle_card_opens_a_gpu_bundle_on_the_providers_it_was_built_for(recipe):
    assert "providers=[('CUDAExecutionProvider', {" in cuda_card(recipe)


def test_bundle_card_opens_an_fp32_gpu_bundle_without_tf32_as_the_server_does(recipe):
    assert "'use_tf32': 0" in cuda_card(recipe, "fp32")


def test_bundle_card_opens_a_gpu_bundle_with_the_servers_cudnn_search(recipe):
    assert "'cudnn_conv_algo_search': 'HEURISTIC'" in cuda_card(recipe)


def test_bundle_card_leaves_tf32_to_an_fp16_gpu_bundle(recipe):
    assert "use_tf32" not in cuda_card(recipe, "fp16")


def test_bundle_card_of_a_gpu_bundle_is_written_without_onnx_runtime(recipe):
    """As the report rewrites it, in the `report` role, which installs no ONNX Runtime."""
    info = _bundle_info(providers=["CUDAExecutionProvider", "CPUExecutionProvider"], precision="fp32")
    folder = _publish(recipe, "bundle-bilstm-cuda", {"dev_accuracy": 0.8, "agreement": 0.99}, info)
    probe = (
        "import sys\nfrom pathlib import Path\nsys.modules['onnxruntime'] = None\n"
        "from edgedistill.common import modelcard\nfrom edgedistill.common.recipe import load_recipe\n"
        f"modelcard.write(load_recipe({str(SMOKE)!r}), Path({str(folder)!r}))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_bundle_card_gives_parity(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, _bundle_info())
    assert "| agreement | 0.9900 |" in _text(recipe, folder)


def test_bundle_card_gives_a_small_parity_difference_in_significant_digits_not_as_0(recipe):
    metrics = {"dev_accuracy": 0.8, "agreement": 0.99, "max_abs_diff": 7.9e-06}
    folder = _publish(recipe, "bundle-bilstm-int8", metrics, _bundle_info())
    assert "| max_abs_diff | 7.9e-06 |" in _text(recipe, folder)


def tensorrt_card(recipe) -> ModelCard:
    """The card of a TensorRT bundle."""
    info = _bundle_info(runtime="tensorrt", providers=[], model_file="model.plan")
    return ModelCard.load(modelcard.write(recipe, _publish(recipe, "bundle-bilstm-trt", {"dev_accuracy": 0.8}, info)))


def test_tensorrt_bundle_card_is_not_an_onnx_model(recipe):
    assert tensorrt_card(recipe).data.library_name == "tensorrt"


def test_tensorrt_bundle_card_is_not_tagged_onnx(recipe):
    assert "onnx" not in tensorrt_card(recipe).data.tags


def test_tensorrt_bundle_card_names_its_runtime_with_its_article(recipe):
    assert "A TensorRT bundle (int8, opset 17)" in tensorrt_card(recipe).text


def test_onnx_runtime_bundle_card_is_an_onnx_model(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8}, _bundle_info())
    assert ModelCard.load(modelcard.write(recipe, folder)).data.library_name == "onnx"


CASCADE_INFO = {
    "cascade": {
        "name": "smoke-c",
        "labels": ["negative", "positive"],
        "text_inputs": ["text"],
        "rule": "margin",
        "members": [
            {"bundle": "bilstm-int8", "manifest_sha256": "a", "threshold": 0.8156, "temperature": 0.44},
            {"bundle": "teacher-fused", "manifest_sha256": "b", "threshold": None, "temperature": 1.0},
        ],
    },
    "dev_answered_share": {"bilstm-int8": 0.3867, "teacher-fused": 0.6133},
    "member_dev_accuracy": {"bilstm-int8": 0.6933, "teacher-fused": 0.66},
}
CASCADE_METRICS = {
    "dev_accuracy": 0.6733,
    "dev_escalated": 0.6133,
    "expected_escalated": 0.8933,
    "calibration_agreement": 0.99,
}


def test_cascade_card_gives_each_members_threshold_and_share(recipe):
    text = _text(recipe, _publish(recipe, "bundle-c", CASCADE_METRICS, CASCADE_INFO))
    assert "| bilstm-int8 | 0.8156 | 0.44 | 38.7% | 0.6933 |" in text
    assert "| teacher-fused | - | 1.00 | 61.3% | 0.6600 |" in text
    assert "`margin`" in text


def test_cascade_card_says_calibration_texts_chose_its_thresholds(recipe):
    text = _text(recipe, _publish(recipe, "bundle-c", CASCADE_METRICS, CASCADE_INFO))
    assert "calibration texts, neither dev nor test, chose the thresholds" in text
    assert "chose the checkpoint" not in text


def test_cascade_card_gives_the_calibration_figures(recipe):
    text = _text(recipe, _publish(recipe, "bundle-c", CASCADE_METRICS, CASCADE_INFO))
    assert "| expected_escalated | 0.8933 |" in text
    assert "| calibration_agreement | 0.9900 |" in text


def test_card_has_no_latency_before_the_benchmark(recipe):
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8}, _bundle_info())
    assert "## Latency" not in _text(recipe, folder)


def test_refreshed_card_shows_the_benchmarks_latency(recipe):
    _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8}, _bundle_info())
    _bench(recipe)
    modelcard.refresh(recipe)
    assert "| 1 | 16 | 0.50 | 20.0x |" in (folder / mf.CARD).read_text(encoding="utf-8")


def test_refreshed_card_gives_the_length_a_bundle_cut_to_its_max_length_was_timed_at_and_no_speedup(recipe):
    _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8}, _bundle_info())
    _bench(recipe, timed_length=8)
    modelcard.refresh(recipe)
    assert "| 1 | 16 (cut to 8) | 0.50 | - |" in (folder / mf.CARD).read_text(encoding="utf-8")


def test_card_of_a_bundle_built_again_since_the_benchmark_has_no_latency(recipe):
    _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8}, _bundle_info())
    _bench(recipe, bundle_hash="0" * 64)
    assert "## Latency" not in _text(recipe, folder)


def test_card_of_a_bundle_whose_teacher_was_built_again_since_the_benchmark_has_no_latency(recipe):
    _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    folder = _publish(recipe, "bundle-bilstm-int8", {"dev_accuracy": 0.8}, _bundle_info())
    _bench(recipe)
    _publish(recipe, "teacher", {"dev_accuracy": 0.9}, {"steps": 10})
    assert "## Latency" not in _text(recipe, folder)


def test_refresh_writes_a_card_for_models_only(recipe):
    teacher = _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    _publish(recipe, "transfer", {"sentences": 10})
    assert modelcard.refresh(recipe) == [teacher / mf.CARD]


def test_card_of_a_transformer_student_from_the_teacher_says_it_started_from_its_embeddings_and_layers(recipe):
    info = STUDENT_INFO | {"arch": "transformer"}
    text = _text(recipe, _publish(recipe, "student-transformer", STUDENT_METRICS, info))
    assert "started from the teacher's embeddings and evenly spaced layers." in text


def test_card_of_a_transformer_baseline_from_the_teacher_says_it_started_from_its_embeddings_and_layers(recipe):
    info = STUDENT_INFO | {"arch": "transformer", "kind": "baseline"}
    text = _text(recipe, _publish(recipe, "baseline-transformer", STUDENT_METRICS, info))
    assert "started from the teacher's embeddings and evenly spaced layers." in text


def test_card_of_a_bilstm_student_from_the_teacher_says_it_started_from_its_embeddings(recipe):
    text = _text(recipe, _publish(recipe, "student-bilstm", STUDENT_METRICS, STUDENT_INFO))
    assert "started from the teacher's embeddings." in text


def test_card_is_left_out_of_the_manifest(recipe):
    folder = _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    assert list(mf.load(folder).files) == ["model.onnx"]


def test_written_card_keeps_the_artifact_verified(recipe):
    folder = _publish(recipe, "teacher", {"dev_accuracy": 0.85}, {"steps": 10})
    modelcard.write(recipe, folder)
    assert mf.load(folder, verify=True).files["model.onnx"].size_bytes == len(b"weights")


def test_stage_contract_writes_the_card_when_a_model_publishes(recipe):
    def build(inputs):
        return Built(lambda folder: (folder / "model.safetensors").write_bytes(b"w"), metrics={"dev_accuracy": 0.9})

    Stage("teacher", recipe, ("data",), build).run()
    assert ModelCard.load(run_dir(recipe) / "teacher" / mf.CARD).data.pipeline_tag == "text-classification"


def _built(recipe, stage: str, settings: tuple[str, ...] = (), parents: tuple = (), extra: dict | None = None) -> Stage:
    """Stage `stage` of `recipe` (its `settings`, `parents` and `extra` as declared), built and published with its
    card."""
    metrics = {"dev_accuracy": 0.9} | (STUDENT_METRICS if stage.startswith("student-") else {})
    info = STUDENT_INFO if stage.startswith(("student-", "baseline-")) else {"steps": 10}

    def build(inputs):
        return Built(lambda folder: (folder / "model.safetensors").write_bytes(b"w"), metrics=metrics, info=info)

    built = Stage(stage, recipe, settings, build, parents, extra)
    built.run()
    return built


TEACHER_SETTINGS = ("data", "model", "finetune")  # the teacher stage's (`distill.stages.teacher`)


def test_refresh_leaves_the_card_of_a_teacher_built_before_its_pooling_changed_as_its_build_wrote_it():
    mean = load_recipe(ROOT / "recipes" / "smoke.yaml", {"finetune.pooling": "mean"})
    _built(mean, "teacher", TEACHER_SETTINGS)
    modelcard.refresh(load_recipe(ROOT / "recipes" / "smoke.yaml", {"finetune.pooling": "cls"}))
    assert "import edgedistill.distill.heads" in (run_dir(mean) / "teacher" / mf.CARD).read_text(encoding="utf-8")


def test_refresh_leaves_the_card_of_a_student_whose_teacher_was_built_with_other_labels_as_its_build_wrote_it(recipe):
    student = _built(recipe, "student-bilstm", parents=(_built(recipe, "teacher", TEACHER_SETTINGS),))
    modelcard.refresh(load_recipe(ROOT / "recipes" / "smoke.yaml", {"data.label_names": ["bad", "good"]}))
    assert "2 labels: `negative`, `positive`" in (student.folder / mf.CARD).read_text(encoding="utf-8")


def test_refresh_rewrites_the_card_of_a_model_built_with_the_recipes_settings(recipe):
    teacher = _built(recipe, "teacher", TEACHER_SETTINGS)
    assert modelcard.refresh(recipe) == [teacher.folder / mf.CARD]


def _distilled(lr: float, baseline: bool = False) -> Stage:
    """Student bilstm of the smoke recipe (or its baseline), built and published with `distill.students.bilstm.optim.lr`
    at `lr`, recording its spec as its stage does."""
    edited = load_recipe(SMOKE, {"distill.students.bilstm.optim.lr": lr})
    spec = stages.student(edited, "bilstm", baseline).extra
    return _built(edited, f"{'baseline' if baseline else 'student'}-bilstm", extra=spec)


def test_settings_change_names_a_students_spec_setting_the_recipe_now_gives_otherwise(recipe):
    assert modelcard.settings_change(recipe, _distilled(0.002).folder) == (
        "student-bilstm was built with other optim settings (optim.lr 0.002 -> 0.003)"
    )


def test_settings_change_names_a_baselines_spec_setting_the_recipe_now_gives_otherwise(recipe):
    assert modelcard.settings_change(recipe, _distilled(0.002, baseline=True).folder) == (
        "baseline-bilstm was built with other optim settings (optim.lr 0.002 -> 0.003)"
    )


def test_settings_change_leaves_a_student_of_the_recipes_spec(recipe):
    assert modelcard.settings_change(recipe, _distilled(0.003).folder) is None


def test_refresh_leaves_the_card_of_a_student_distilled_before_its_spec_was_edited_as_its_build_wrote_it(recipe):
    student = _distilled(0.002)
    (student.folder / mf.CARD).write_text("as its build wrote it")
    modelcard.refresh(recipe)
    assert (student.folder / mf.CARD).read_text() == "as its build wrote it"


def test_bundle_card_gives_the_text_style_its_spec_records_whatever_the_recipe_says_now(recipe):
    info = _bundle_info(text_style="ptb_lower")
    folder = _publish(raw(recipe), "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, info)
    assert "`edgedistill.common.textstyle.tokenise`" in _text(raw(recipe), folder)


def pairs_of(recipe):
    """The recipe made a pair task, whose texts are written as people write them (as MRPC's and RTE's)."""
    return raw(recipe).model_copy(update={"data": recipe.data.model_copy(update={"text_pair_column": "sentence2"})})


def test_pair_student_card_gives_the_model_a_pair_and_its_token_types(recipe):
    pairs = pairs_of(recipe)
    text = _text(pairs, _publish(pairs, "student-bilstm", STUDENT_METRICS, STUDENT_INFO))
    assert 'model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])' in text


def test_card_of_a_pair_student_whose_tokenizer_gives_no_token_types_makes_them_from_sequence_ids(recipe):
    pairs = pairs_of(recipe)
    info = STUDENT_INFO | {"pair_segments": "sequence_ids"}
    text = _text(pairs, _publish(pairs, "student-bilstm", STUDENT_METRICS, info))
    assert "from_sequence_ids(batch.sequence_ids(i))" in text


def test_pair_bundle_card_runs_the_model_on_a_pair(recipe):
    pairs = pairs_of(recipe)
    folder = _publish(pairs, "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, _bundle_info())
    assert 'batch = tokenizer(["a text"], ["its pair"], truncation=True, return_tensors="np")' in _text(pairs, folder)


def test_card_of_a_pair_bundle_whose_tokenizer_gives_no_token_types_makes_them_from_sequence_ids(recipe):
    pairs = pairs_of(recipe)
    info = _bundle_info(pair_segments="sequence_ids")
    folder = _publish(pairs, "bundle-bilstm-int8", {"dev_accuracy": 0.8, "agreement": 0.99}, info)
    assert 'batch["token_type_ids"] = np.array([from_sequence_ids(batch.sequence_ids(i))' in _text(pairs, folder)


def test_a_hub_sources_card_names_its_dataset_by_its_hub_id_without_config_or_split(recipe):
    hub = recipe.model_copy(update={"data": recipe.data.model_copy(update={"train": "hub:nyu-mll/glue@sst2:train"})})
    folder = _publish(hub, "student-bilstm", STUDENT_METRICS, STUDENT_INFO)
    assert ModelCard.load(modelcard.write(hub, folder)).data.datasets == ["nyu-mll/glue"]
