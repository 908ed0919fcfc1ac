import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import load_bundle
from edgedistill.common.config.export import BundleRecipe
from edgedistill.common.config.training import DataConfig, StudentConfig
from edgedistill.common.data import DEV_EXAMPLES, load_splits
from edgedistill.common.recipe import load_recipe, parse_overrides, run_dir
from edgedistill.common.runtime import (
    TensorRTUnavailable,
    available_providers,
    missing_here,
    open_runner,
    tensorrt_available,
)
from edgedistill.distill import heads
from edgedistill.distill.tokenization import load_tokenizer
from edgedistill.export import bundle_stage, stages, validate
from edgedistill.export.bundle_stage import max_length, token_features
from edgedistill.export.onnx_export import ExportError, Source, example_inputs, export_onnx, load_source
from edgedistill.export.tensorrt import EngineBuildError
from edgedistill.export.validate import (
    ExportGateError,
    as_forward,
    dev_logits,
    gate,
    logits_runner,
    parity,
    torch_forward,
)
from edgedistill.serve.encoding import TextEncoder
from onnx import numpy_helper
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from tests.conftest import ROOT, run_export, run_here
from tests.distill import extension

pytestmark = pytest.mark.slow
SMOKE = ROOT / "recipes" / "smoke.yaml"
BINARY = DataConfig(train="unused", dev="unused", label_names=["negative", "positive"])
TIE = 0.1  # export.tie_margin's default
cuda_offered = "CUDAExecutionProvider" in available_providers()


def op_types(folder) -> list[str]:
    return [n.op_type for n in onnx.load(str(folder / "model.onnx")).graph.node]


@pytest.mark.parametrize("bundle_id, layers", [("teacher-fused", 2), ("teacher-int8", 2), ("transformer-fused", 1)])
def test_attention_is_fused_once_per_layer(smoke_bundles, bundle_id, layers):
    folder = smoke_bundles / f"bundle-{bundle_id}"
    ops = op_types(folder)
    # Dynamic INT8 turns the fused kernels into their quantized forms (QAttention, QEmbedLayerNormalization).
    assert ops.count("Attention") + ops.count("QAttention") == layers
    assert ops.count("SkipLayerNormalization") == 2 * layers
    assert ops.count("EmbedLayerNormalization") + ops.count("QEmbedLayerNormalization") == 1
    assert ops.count("BiasGelu") + ops.count("FastGelu") == layers
    assert "Softmax" not in ops
    assert load_bundle(folder).spec.fused_operators["Attention"] == layers


def test_int8_ops_limits_quantization_to_the_named_operators(smoke_bundles):
    # int8_ops: [MatMul], attention: MultiHeadAttention, skip_layer_norm: false
    folder = smoke_bundles / "bundle-transformer-int8"
    ops = op_types(folder)
    assert ops.count("MultiHeadAttention") == 1
    assert "Attention" not in ops
    assert "QAttention" not in ops
    assert ops.count("LayerNormalization") == 2
    assert "SkipLayerNormalization" not in ops
    assert "EmbedLayerNormalization" in ops
    assert "QEmbedLayerNormalization" not in ops
    # Q, K, V, the attention output and the two FFN projections of the one layer, all INT8
    assert ops.count("MatMulInteger") >= 6
    assert "MatMul" not in ops
    spec = load_bundle(folder).spec
    assert spec.fused_operators["MultiHeadAttention"] == 1
    assert spec.fused_operators["LayerNormalization"] == 2
    assert spec.disabled_optimizers == ["SkipLayerNormFusion"]  # else ONNX Runtime fuses them again on load


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("attention", "MultiHeadAttention", "attention=MultiHeadAttention names a fused"),
        ("skip_layer_norm", False, "skip_layer_norm: false is a fusion choice"),
    ],
)
def test_fusion_choices_need_fusion(key, value, message):
    with pytest.raises(ValueError, match=message):
        load_recipe(SMOKE, {f"export.bundles.teacher-onnx.{key}": value})  # teacher-onnx: fused: false


@pytest.mark.parametrize("key, value", [("attention", "MultiHeadAttention"), ("skip_layer_norm", False)])
def test_a_fusion_choice_for_a_teacher_graph_the_fusions_do_not_take_stops_its_bundle_naming_it(tmp_path, key, value):
    spec = BundleRecipe(source="teacher", **{key: value})
    gpt2 = Source(torch.nn.Identity(), heads.TOKEN_INPUTS[:2], "gpt2", tmp_path)  # as load_source gives a GPT-2's
    with pytest.raises(ExportError, match=rf"export\.bundles\.teacher-int8\.{key} would not apply: .* a gpt2"):
        bundle_stage.require_fusion_applies(spec, "teacher-int8", gpt2)


def test_smoothing_needs_dynamic_int8_of_a_fused_graph():
    with pytest.raises(ValueError, match="smooth applies to dynamic INT8 of a fused graph"):
        load_recipe(SMOKE, {"export.bundles.teacher-fused.smooth": 0.85})


def test_smoothing_is_refused_where_int8_ops_leaves_every_matmul_in_fp32():
    with pytest.raises(ValueError, match=r"smooth would not apply.*remove smooth, or add MatMul to int8_ops"):
        load_recipe(SMOKE, {"export.bundles.transformer-int8.int8_ops": ["Attention"]})


def test_smoothed_int8_bundle_records_what_it_smoothed(smoke_bundles):
    # smooth: 0.85 on the one-layer Transformer: the embedding LayerNorm (read by Q/K/V), the attention block's
    # LayerNorm (the FFN's input) and the GELU (the FFN's output)
    info = load_bundle(smoke_bundles / "bundle-transformer-int8").manifest.info
    assert info["smoothed_tensors"] == 3


def test_a_static_int8_bundle_records_the_quantization_it_applied(smoke_bundles):
    applied = load_bundle(smoke_bundles / "bundle-transformer-int8-static").manifest.info["quantization"]
    assert applied["mode"] == "static"
    assert applied["per_channel"] is True
    assert applied["op_types"] == ["MatMul", "Conv"]
    assert applied["calibration"] == "MinMax"
    assert applied["calibration_batches"] > 0
    assert applied["activations_quantized"] > 0  # a fused graph's: typed by ONNX Runtime's shape inference


def test_a_dynamic_int8_bundle_records_the_quantization_it_applied(smoke_bundles):
    applied = load_bundle(smoke_bundles / "bundle-transformer-int8").manifest.info["quantization"]
    assert applied["mode"] == "dynamic"
    assert applied["op_types"] == load_recipe(SMOKE).export.bundles["transformer-int8"].int8_ops


def test_bundles_of_other_weights_are_served_as_other_versions(smoke_bundles):
    versions = {
        load_bundle(smoke_bundles / f"bundle-{bundle_id}").spec.version for bundle_id in ("bilstm-fp32", "bilstm-int8")
    }
    assert len(versions) == 2


def test_a_bundle_is_served_as_the_version_of_its_model_and_tokenizer(smoke_bundles):
    bundle = load_bundle(smoke_bundles / "bundle-bilstm-int8")
    files = bundle.manifest.files
    content = bundle.spec.content_versioned(files["model.onnx"].sha256, files["tokenizer.json"].sha256)
    assert bundle.spec.version == content.version


def test_plain_teacher_export_is_unfused(smoke_bundles):
    ops = op_types(smoke_bundles / "bundle-teacher-onnx")
    assert "Attention" not in ops
    assert "Softmax" in ops


def test_bilstm_is_one_lstm_op(smoke_bundles):
    for bundle_id in ("bilstm-fp32", "bilstm-int8"):
        ops = op_types(smoke_bundles / f"bundle-{bundle_id}")
        assert ops.count("LSTM") + ops.count("DynamicQuantizeLSTM") == 1, bundle_id
        assert not {"Loop", "Scan"} & set(ops)


def test_folded_cnn_looks_up_instead_of_convolving(smoke_bundles):
    ops = op_types(smoke_bundles / "bundle-cnn-folded")
    assert "Conv" not in ops
    assert "Gather" in ops
    assert "ReduceSum" in ops
    assert load_bundle(smoke_bundles / "bundle-cnn-folded").manifest.info["recipe"]["fold"] is True
    # fp16: the table alone is float16; the rest of the graph stays float32 for ONNX Runtime's CPU kernels
    model = onnx.load(str(smoke_bundles / "bundle-cnn-folded" / "model.onnx"))
    halves = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16]
    assert halves == ["table"]
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    quantized = op_types(smoke_bundles / "bundle-cnn-folded-int8")  # the table is stored in INT8
    assert "Conv" not in quantized
    assert "DequantizeLinear" in quantized


@pytest.mark.parametrize(
    "bundle_id",
    [
        "teacher-onnx",
        "teacher-fused",
        "teacher-int8",
        "bilstm-fp32",
        "bilstm-int8",
        "cnn-int8",
        "cnn-folded",
        "cnn-folded-int8",
        "transformer-fused",
        "transformer-int8-static",
    ],
)
def test_bundle_round_trip_and_parity(smoke_bundles, bundle_id):
    bundle = load_bundle(smoke_bundles / f"bundle-{bundle_id}")
    m = bundle.manifest
    assert bundle.spec.name == f"smoke-{bundle_id}"
    assert bundle.spec.labels == ["negative", "positive"]
    assert set(m.info["shape_checks_max_abs_diff"]) >= {"b1_t1", "b3_t17", "b32_t9"}
    if bundle.spec.precision == "fp32":
        assert m.metrics["agreement"] >= 0.999
    else:
        assert m.metrics["torch_dev_accuracy"] - m.metrics["dev_accuracy"] <= 0.05
    # The bundle's own model reproduces the accuracy in its manifest.
    recipe = load_recipe(SMOKE)
    _, dev = load_splits(recipe.data)
    tokenizer = load_tokenizer(str(smoke_bundles / "teacher"))
    length = max_length(recipe, m.info["source"])
    feats = token_features(tokenizer, dev.texts, dev.pairs, length, bundle.spec.pair_segments)
    logits = dev_logits(
        as_forward(logits_runner(open_runner(bundle.model_path, "onnxruntime", ["cpu"], threads=1))), feats, 0
    )
    accuracy = float((logits.argmax(-1) == np.array(dev.labels)).mean())
    # Dynamic INT8 scales activations per batch and thread count changes summation order: one near-tie may flip.
    tolerance = 0 if bundle.spec.precision == "fp32" else 1.5 / len(dev.labels)
    assert accuracy == pytest.approx(m.metrics["dev_accuracy"], abs=tolerance)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: f.write_bytes(f.read_bytes()[:-10] + b"0123456789"), "sha256"),
        (lambda f: f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2]), "truncated"),
        (lambda f: f.unlink(), "missing"),
    ],
)
def test_damaged_bundle_is_refused(smoke_bundles, tmp_path, damage, message):
    copy = tmp_path / "bundle"
    shutil.copytree(smoke_bundles / "bundle-bilstm-int8", copy)
    damage(copy / "model.onnx")
    with pytest.raises(mf.ArtifactError, match=message):
        load_bundle(copy)


def test_int8_gate_refuses_a_broken_model(smoke_bundles, tmp_path, monkeypatch):
    """Scramble the INT8 weights of a bundle: the accuracy gate must refuse it, with the figures."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    recipe = load_recipe(SMOKE)
    model = onnx.load(str(smoke_bundles / "bundle-cnn-int8" / "model.onnx"))
    rng = np.random.default_rng(0)
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.dtype == np.int8 and array.size > 100:
            init.CopyFrom(numpy_helper.from_array(rng.integers(-127, 127, array.shape, dtype=np.int8), init.name))
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    source = load_source(run_dir(recipe) / "student-cnn")
    _, dev = load_splits(recipe.data)
    tokenizer = load_tokenizer(str(source.folder))
    feats = token_features(tokenizer, dev.texts, dev.pairs, max_length(recipe, "cnn"), "token_types")
    figures = parity(
        dev_logits(as_forward(logits_runner(open_runner(broken, "onnxruntime", ["cpu"], threads=1))), feats, 0),
        dev_logits(torch_forward(source), feats, 0),
        dev.labels,
        recipe.data,
        TIE,
    )
    with pytest.raises(ExportGateError, match=r"INT8 loses 0\.\d+ dev accuracy .* gate allows 0\.005"):
        gate(figures, "int8", 0.999, 0.005)
    gate(
        parity(
            figures_logits := dev_logits(torch_forward(source), feats, 0), figures_logits, dev.labels, recipe.data, TIE
        ),
        "int8",
        0.999,
        0.005,
    )


def moved_but_as_accurate() -> dict[str, float]:
    """Parity figures of an INT8 model that changed 6 of 100 answers and gained accuracy: 4 wrong answers became
    right and 2 right ones wrong."""
    torch_logits = np.array([[1.0, 0.0]] * 100)
    int8_logits = torch_logits.copy()
    int8_logits[:6] = [0.0, 1.0]
    labels = [1] * 4 + [0] * 96
    return parity(int8_logits, torch_logits, labels, BINARY, TIE)


def test_the_int8_gate_refuses_answers_that_moved_though_accuracy_rose():
    with pytest.raises(ExportGateError, match=r"int8 predictions agree with PyTorch on 94\.0000% of dev \(gate 97"):
        gate(moved_but_as_accurate(), "int8", 0.97, 0.005)


def test_the_int8_gate_passes_what_agrees_enough():
    gate(moved_but_as_accurate(), "int8", 0.94, 0.005)


def test_fp32_gate_message_has_the_figures():
    logits = np.array([[1.0, 0.0], [0.0, 1.0]])
    figures = parity(logits[::-1], logits, [0, 1], BINARY, TIE)
    with pytest.raises(ExportGateError, match=r"agree with PyTorch on 0\.0000% .*max \|Δlogit\| 1\.000e\+00"):
        gate(figures, "fp32", 0.999, 0.005)


def test_an_agreement_gate_names_its_recipe_key():
    logits = np.array([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ExportGateError, match=r"\(gate 99\.50%, export\.min_fp16_agreement\)"):
        gate(parity(logits[::-1], logits, [0, 1], BINARY, TIE), "fp16", 0.995, 0.005)


def test_the_int8_accuracy_gate_names_its_recipe_key():
    logits = np.array([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ExportGateError, match=r"the gate allows 0\.005 \(export\.max_int8_drop\)"):
        gate(parity(logits[::-1], logits, [0, 1], BINARY, TIE), "int8", 0.0, 0.005)


def minority_lost_at_equal_accuracy() -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Exported and PyTorch logits over 100 texts of three labels: PyTorch gets the 4 texts of the rare label right
    and 4 common ones wrong; the exported model the reverse, so accuracy is equal and the rare label's F1 is gone."""
    labels = [0] * 48 + [1] * 48 + [2] * 4
    torch_logits, exported = np.eye(3)[labels], np.eye(3)[labels]
    torch_logits[:4] = np.eye(3)[1]
    exported[96:] = np.eye(3)[0]
    return exported, torch_logits, labels


MACRO = DataConfig(train="unused", dev="unused", label_names=["a", "b", "c"], metric="macro_f1")


def test_the_int8_gate_refuses_a_loss_on_the_selection_metric_at_equal_accuracy():
    exported, torch_logits, labels = minority_lost_at_equal_accuracy()
    with pytest.raises(ExportGateError, match=r"INT8 loses 0\.\d+ dev macro_f1 \(data\.metric\)"):
        gate(parity(exported, torch_logits, labels, MACRO, TIE), "int8", 0.0, 0.005, "macro_f1")


def test_the_int8_gate_on_accuracy_passes_a_loss_it_does_not_measure():
    exported, torch_logits, labels = minority_lost_at_equal_accuracy()
    gate(parity(exported, torch_logits, labels, MACRO, TIE), "int8", 0.0, 0.005, "accuracy")


def test_parity_gives_pytorchs_figure_of_the_selection_metric():
    exported, torch_logits, labels = minority_lost_at_equal_accuracy()
    assert parity(exported, torch_logits, labels, MACRO, TIE)["torch_dev_macro_f1"] > 0.9


def test_parity_of_an_accuracy_task_adds_no_second_accuracy_key():
    logits = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert "torch_dev_f1" not in parity(logits, logits, [0, 1], BINARY, TIE)


def test_a_flip_at_a_near_tie_does_not_count_against_the_agreement_gate():
    torch_logits = np.array([[1.0, 0.95]] + [[1.0, 0.0]] * 9)
    exported = torch_logits.copy()
    exported[0] = [0.95, 1.0]
    gate(parity(exported, torch_logits, [0] * 10, BINARY, TIE), "fp16", 0.995, 0.005)


def test_parity_counts_a_flip_at_a_near_tie():
    torch_logits = np.array([[1.0, 0.95], [1.0, 0.0]])
    assert parity(torch_logits[:, ::-1], torch_logits, [0, 0], BINARY, TIE)["tie_flips"] == 1


def test_parity_counts_no_tie_flip_to_a_label_far_below_a_near_tie():
    torch_logits = np.array([[1.0, 0.95, -3.0], [1.0, 0.0, 0.0]])
    exported = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    three = DataConfig(train="unused", dev="unused", label_names=["a", "b", "c"])
    assert parity(exported, torch_logits, [0, 0], three, TIE)["tie_flips"] == 0


def test_parity_gives_agreement_beyond_ties_without_the_near_tie_flip():
    torch_logits = np.array([[1.0, 0.95], [1.0, 0.0]])
    assert parity(torch_logits[:, ::-1], torch_logits, [0, 0], BINARY, TIE)["agreement_beyond_ties"] == 0.5


def predicting(*labels: int) -> np.ndarray:
    """Two-class logits whose predictions are `labels`."""
    return np.eye(2)[list(labels)]


def test_parity_gives_the_exported_models_f1_of_the_positive_class():
    figures = parity(predicting(1, 1, 0, 0), predicting(1, 1, 0, 0), [1, 0, 0, 0], BINARY, TIE)
    assert figures["dev_f1"] == pytest.approx(2 / 3)


def test_parity_gives_the_exported_models_macro_f1():
    figures = parity(predicting(1, 1, 0, 0), predicting(1, 1, 0, 0), [1, 0, 0, 0], BINARY, TIE)
    assert figures["dev_macro_f1"] == pytest.approx((2 / 3 + 4 / 5) / 2)


def test_parity_gives_no_f1_for_a_task_without_a_positive_class():
    three = DataConfig(train="unused", dev="unused", label_names=["a", "b", "c"])
    assert "dev_f1" not in parity(np.eye(3), np.eye(3), [0, 1, 2], three, TIE)


def test_a_static_int8_bundle_calibrated_on_fewer_texts_than_asked_says_so(smoke_run, tmp_path):
    shutil.copytree(smoke_run, tmp_path / "smoke")
    transfer = sum(1 for _ in (smoke_run / "transfer" / "texts.txt").open(encoding="utf-8"))
    asked = ["--only=transformer-int8-static", "--export.calibration_sentences=1000000"]
    result = run_export(tmp_path, "bundles", str(SMOKE), *asked)
    assert f"INT8 calibration found {transfer} of the 1000000 texts" in result.stdout, result.stderr[-2000:]


def test_bundles_this_machine_cannot_run_are_left_out_with_the_reason(smoke_bundles):
    bundles = load_recipe(SMOKE).export.bundles
    result = run_export(smoke_bundles.parent, "bundles", str(SMOKE))
    assert result.returncode == 0, result.stderr[-2000:]
    for bundle_id, spec in bundles.items():
        reason = missing_here(spec.runtime, spec.providers)
        if reason is None:
            assert f"[bundle-{bundle_id}] up to date" in result.stdout
        else:
            assert f"[bundle-{bundle_id}] not built here: {reason}" in result.stdout
            assert not (smoke_bundles / f"bundle-{bundle_id}").exists()


def test_an_fp32_bundle_off_pytorch_by_more_than_the_tolerance_at_a_shape_misses_its_gate(smoke_run, monkeypatch):
    def off(runner):
        run = logits_runner(runner)
        return lambda feeds: run(feeds) + 2 * validate.FP32_TOLERANCE

    monkeypatch.setattr(validate, "logits_runner", off)
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_run.parent))
    result = run_here("export", "bundles", SMOKE, "--only=bilstm-fp32", "--force")
    assert result.returncode == 1
    # the shape check's words: the dev gate also exits 1, with "against PyTorch on dev"
    assert f"against PyTorch at batch 1, length 1, over the fp32 tolerance {validate.FP32_TOLERANCE}" in result.stderr


@pytest.mark.skipif(tensorrt_available(), reason="checks the error where TensorRT is missing")
def test_tensorrt_bundle_without_a_gpu_says_what_is_missing(smoke_bundles, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    result = run_here("export", "bundles", SMOKE, "--only=bilstm-engine")
    assert result.returncode == 2
    assert "tensorrt" in result.stderr
    assert "make setup ORT=gpu" in result.stderr
    assert not (smoke_bundles / "bundle-bilstm-engine").exists()


@pytest.mark.skipif(tensorrt_available(), reason="checks the error where TensorRT is missing")
def test_a_tensorrt_bundle_named_before_its_teacher_is_built_says_what_this_machine_lacks(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    result = run_here("export", "bundles", SMOKE, "--only=bilstm-engine")
    assert "make setup ORT=gpu" in result.stderr, result.stderr[-2000:]
    assert list(tmp_path.rglob(mf.MANIFEST)) == []


def engine_built_for(tmp_path, monkeypatch, built: dict, here: dict | None) -> str | None:
    """Why an engine bundle whose manifest records `built` (`info.tensorrt_build`) is stale on a machine whose
    TensorRT and GPU are `here` (None: it runs no engine)."""
    with mf.stage_folder(tmp_path / "bundle-x-engine") as tmp:
        (tmp / "model.plan").write_bytes(b"engine")
        base = mf.Manifest(stage="bundle-x-engine", recipe="r", recipe_hash="h", config_hash="c")
        mf.commit(tmp, tmp_path / "bundle-x-engine", base.model_copy(update={"info": {"tensorrt_build": built}}))

    def probed():
        if here is None:
            raise TensorRTUnavailable("no GPU")
        return here

    monkeypatch.setattr(stages, "require_tensorrt", probed)
    return stages.engine_of_another_machine(tmp_path / "bundle-x-engine")


H100 = {"tensorrt": "10.3.0", "gpu": "NVIDIA H100 80GB HBM3", "cuda_driver": "12.4"}


def test_an_engine_built_on_another_gpu_is_stale_naming_both(tmp_path, monkeypatch):
    why = engine_built_for(tmp_path, monkeypatch, H100 | {"gpu": "NVIDIA A10"}, H100)
    assert why == (
        "its engine was built for another machine (gpu NVIDIA A10 -> NVIDIA H100 80GB HBM3), and loads only on that one"
    )


def test_an_engine_built_by_another_tensorrt_is_stale(tmp_path, monkeypatch):
    assert "tensorrt 10.1.0 -> 10.3.0" in engine_built_for(tmp_path, monkeypatch, H100 | {"tensorrt": "10.1.0"}, H100)


def test_an_engine_built_on_this_machine_is_current(tmp_path, monkeypatch):
    assert engine_built_for(tmp_path, monkeypatch, H100 | {"cuda_driver": "12.8"}, H100) is None


def test_an_engine_on_a_machine_without_tensorrt_is_left_to_the_bundles_that_leave_it_out(tmp_path, monkeypatch):
    assert engine_built_for(tmp_path, monkeypatch, H100, None) is None


@pytest.mark.skipif(cuda_offered, reason="checks the refusal where this onnxruntime build offers no CUDA")
def test_gpu_provider_falling_back_to_cpu_is_refused(smoke_bundles, monkeypatch):
    cuda = ["--export.bundles.cnn-cuda.source=cnn", "--export.bundles.cnn-cuda.providers=[CUDAExecutionProvider]"]
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    result = run_here("export", "bundles", SMOKE, *cuda, "--only=cnn-cuda")
    assert result.returncode == 2
    assert "CUDAExecutionProvider" in result.stderr
    assert not (smoke_bundles / "bundle-cnn-cuda").exists()


@pytest.mark.skipif(cuda_offered, reason="checks the refusal where this onnxruntime build offers no CUDA")
def test_a_gpu_provider_this_onnxruntime_lacks_is_refused_before_any_parent_is_built(tmp_path, monkeypatch):
    cuda = ["--export.bundles.cnn-cuda.source=cnn", "--export.bundles.cnn-cuda.providers=[CUDAExecutionProvider]"]
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    result = run_here("export", "bundles", SMOKE, *cuda, "--only=cnn-cuda")
    assert result.returncode == 2
    assert "CUDAExecutionProvider" in result.stderr
    assert list(tmp_path.rglob(mf.MANIFEST)) == []


def test_an_fp32_bundle_on_the_tensorrt_provider_is_refused_naming_the_setting(
    smoke_run, monkeypatch, no_tf32_override
):
    trt = ["--export.bundles.cnn-trt.source=cnn", "--export.bundles.cnn-trt.providers=[TensorrtExecutionProvider]"]
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_run.parent))
    result = run_here("export", "bundles", SMOKE, *trt, "--only=cnn-trt")
    assert result.returncode == 2
    assert "export.bundles.cnn-trt.providers" in result.stderr
    assert "NVIDIA_TF32_OVERRIDE=0" in result.stderr


def test_an_fp32_bundle_on_the_tensorrt_provider_is_refused_before_any_parent_is_built(
    tmp_path, monkeypatch, no_tf32_override
):
    trt = ["--export.bundles.cnn-trt.source=cnn", "--export.bundles.cnn-trt.providers=[TensorrtExecutionProvider]"]
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    result = run_here("export", "bundles", SMOKE, *trt, "--only=cnn-trt")
    assert result.returncode == 2
    assert list(tmp_path.rglob(mf.MANIFEST)) == []


def test_fp16_conversion_keeps_fp32_io(smoke_bundles, tmp_path):
    from edgedistill.export.quantize import fp16

    fp16(smoke_bundles / "bundle-transformer-fused" / "model.onnx", tmp_path / "fp16.onnx")
    model = onnx.load(str(tmp_path / "fp16.onnx"))
    onnx.checker.check_model(model)
    weights = [i for i in model.graph.initializer if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]
    assert sum(i.data_type == onnx.TensorProto.FLOAT16 for i in weights) > len(weights) / 2
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


HUB_BUNDLES = ("teacher-int8", "bilstm-int8", "cnn-folded", "transformer-fused")


def hash_after(bundle: str, *overrides: str) -> str:
    """The config hash of the smoke recipe's bundle stage `bundle` with `overrides` given."""
    return stages.bundle(load_recipe(SMOKE, parse_overrides(list(overrides))), bundle).config_hash


def test_a_bundle_stage_at_the_default_tie_margin_hashes_no_tie_margin():
    """So bundles built before export.tie_margin existed stay current."""
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    assert "export.tie_margin" not in stages.bundle(recipe, "bilstm-int8").settings


def test_a_bundle_stage_is_stale_when_the_tie_margin_is_set():
    assert hash_after("bilstm-int8", "--export.tie_margin=0") != hash_after("bilstm-int8")


@pytest.mark.parametrize("gate", ["min_agreement", "min_fp16_agreement"])
def test_an_int8_bundle_stage_is_current_when_another_precisions_gate_changes(gate):
    """The INT8 labeller, and the transfer set it labelled, are not built again for an fp16 or fp32 gate."""
    assert hash_after("teacher-int8", f"--export.{gate}=0.9") == hash_after("teacher-int8")


def test_an_fp16_bundle_stage_is_stale_when_its_gate_changes():
    assert hash_after("cnn-folded", "--export.min_fp16_agreement=0.9") != hash_after("cnn-folded")


def test_an_fp16_bundle_stage_is_current_when_the_int8_calibration_count_changes():
    assert hash_after("cnn-folded", "--export.calibration_sentences=64") == hash_after("cnn-folded")


def test_a_static_int8_bundle_stage_is_stale_when_its_calibration_count_changes():
    assert hash_after("transformer-int8-static", "--export.calibration_sentences=64") != hash_after(
        "transformer-int8-static"
    )


def test_a_smoothed_bundle_stage_is_current_when_the_int8_calibration_count_changes():
    """A smoothed labeller, and the transfer set it labelled, are not built again for an engine's calibration."""
    assert hash_after("transformer-int8", "--export.calibration_sentences=64") == hash_after("transformer-int8")


def test_a_smoothed_bundle_stage_is_stale_when_its_smoothing_count_changes():
    assert hash_after("transformer-int8", "--export.smooth_sentences=64") != hash_after("transformer-int8")


def test_a_smoothed_bundle_recorded_with_the_calibration_count_by_an_earlier_release_is_current():
    stage = stages.bundle(load_recipe(SMOKE), "transformer-int8")
    settings = stage.hashed["settings"] | {"export.calibration_sentences": 256}
    older = mf.Manifest(
        stage=stage.name,
        recipe="smoke",
        recipe_hash="h",
        config_hash="0" * 16,
        hashed=stage.hashed | {"settings": settings},
    )
    assert stage.built(older)


def test_a_bundle_recorded_with_every_gate_by_an_earlier_release_is_current(smoke_bundles_copy, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles_copy.parent))
    stage = stages.bundle(load_recipe(SMOKE), "bilstm-int8")
    manifest = mf.load(stage.folder)
    settings = manifest.hashed["settings"] | {"export.min_fp16_agreement": 0.995, "export.min_agreement": 0.999}
    older = manifest.model_copy(update={"config_hash": "0" * 16, "hashed": manifest.hashed | {"settings": settings}})
    (stage.folder / mf.MANIFEST).write_text(older.model_dump_json(indent=2))
    assert stage.staleness() is None


@pytest.mark.parametrize("bundle_id", HUB_BUNDLES)
def test_bundle_config_has_the_manifests_labels(smoke_bundles, bundle_id):
    folder = smoke_bundles / f"bundle-{bundle_id}"
    id2label = json.loads((folder / "config.json").read_text())["id2label"]
    assert [id2label[str(i)] for i in range(len(id2label))] == load_bundle(folder).spec.labels


@pytest.mark.parametrize(
    "bundle_id, model_type",
    [("teacher-int8", "bert"), ("transformer-fused", "bert"), ("bilstm-int8", "edgedistill-bilstm")],
)
def test_bundle_config_names_the_exported_models_type(smoke_bundles, bundle_id, model_type):
    config = json.loads((smoke_bundles / f"bundle-{bundle_id}" / "config.json").read_text())
    assert config["model_type"] == model_type


def test_a_bundle_records_the_padding_id_of_the_teachers_tokenizer(smoke_bundles):
    pad_id = load_tokenizer(str(smoke_bundles / "teacher")).pad_token_id
    assert load_bundle(smoke_bundles / "bundle-bilstm-int8").spec.pad_token_id == pad_id


def test_a_bundle_records_the_recipes_text_style_for_the_server(smoke_bundles):
    assert load_bundle(smoke_bundles / "bundle-bilstm-int8").spec.text_style == "ptb_lower"  # smoke.yaml's


def test_a_bundle_records_the_dev_examples_its_figures_were_measured_on(smoke_bundles):
    recorded = mf.load(smoke_bundles / "bundle-bilstm-int8").info[DEV_EXAMPLES]
    assert recorded == load_splits(load_recipe(SMOKE).data)[1].digest()


def test_a_bundle_stage_is_stale_when_the_text_style_changes():
    before = stages.bundle(load_recipe(SMOKE), "teacher-int8").config_hash
    raw = load_recipe(SMOKE, {"transfer.text_style": "raw"})
    assert stages.bundle(raw, "teacher-int8").config_hash != before


def test_a_bundle_stage_is_stale_when_the_spec_version_changes(monkeypatch):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    before = stages.bundle(recipe, "bilstm-int8").config_hash
    monkeypatch.setattr(stages, "SPEC_VERSION", stages.SPEC_VERSION + 1)
    assert stages.bundle(recipe, "bilstm-int8").config_hash != before


def test_bundles_built_before_tokenizer_json_truncated_are_built_again(monkeypatch):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    now = stages.bundle(recipe, "bilstm-int8").config_hash
    monkeypatch.setattr(stages, "SPEC_VERSION", 2)  # whose tokenizer.json kept the source's max length
    assert stages.bundle(recipe, "bilstm-int8").config_hash != now


@pytest.mark.parametrize("bundle_id", HUB_BUNDLES)
def test_auto_tokenizer_reads_a_bundle_as_the_server_does(smoke_bundles, bundle_id):
    folder = smoke_bundles / f"bundle-{bundle_id}"
    text = " ".join(["a gripping , funny and thoroughly moving film"] * 20)  # longer than any max length
    served = TextEncoder.for_bundle(load_bundle(folder)).encode([text])
    ids = AutoTokenizer.from_pretrained(folder)(text, truncation=True)["input_ids"]
    assert ids == served[0]["input_ids"].tolist()


@pytest.mark.parametrize("bundle_id", HUB_BUNDLES)
def test_tokenizer_json_alone_reads_a_bundle_as_the_server_does(smoke_bundles, bundle_id):
    folder = smoke_bundles / f"bundle-{bundle_id}"
    text = " ".join(["a gripping , funny and thoroughly moving film"] * 20)  # longer than any max length
    served = TextEncoder.for_bundle(load_bundle(folder)).encode([text])
    assert Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids == served[0]["input_ids"].tolist()


@pytest.mark.parametrize(
    ("settings", "advice"),
    [({"quantization": "static"}, "use quantization: dynamic"), ({"int8_ops": ["Conv"]}, "use int8_ops naming")],
)
def test_int8_that_quantizes_nothing_is_refused_rather_than_shipped_as_fp32(tmp_path, settings, advice):
    config = StudentConfig(arch="cnn", vocab_size=100, embed_dim=8, max_length=32)
    source = Source(extension.BagOfWords(config).eval(), heads.TOKEN_INPUTS[:2], "bag", tmp_path)  # no MatMul
    export_onnx(source, tmp_path / "plain.onnx", opset=17)
    spec = BundleRecipe(source="bag", precision="int8", **settings)
    feeds = [{k: v.numpy() for k, v in example_inputs(source.inputs, 4, 12).items()}]
    with pytest.raises(ExportError, match=rf"bag: .* INT8 of .* quantizes nothing in this graph .*Gemm.*{advice}"):
        bundle_stage._transform(spec, source, tmp_path / "plain.onnx", tmp_path, lambda: feeds, lambda: feeds)


class Failing:
    """A bundle stage whose build fails with `error`."""

    def __init__(self, error: Exception):
        self.error = error

    def run(self, force):
        raise self.error


@pytest.mark.parametrize("error", [ExportGateError("INT8 loses 0.0100"), EngineBuildError("TensorRT failed")])
def test_a_bundle_that_fails_is_named_in_its_error(monkeypatch, error):
    monkeypatch.setattr(stages, "bundle", lambda *args: Failing(error))
    with pytest.raises(type(error), match=rf"^bundle bilstm-int8 \(export\.bundles\.bilstm-int8\): {error}$"):
        bundle_stage.build(load_recipe(SMOKE), ["bilstm-int8"])


def test_a_bundle_error_that_names_its_setting_is_not_named_twice(monkeypatch):
    error = ExportError("export.bundles.bilstm-int8.attention would not apply")
    monkeypatch.setattr(stages, "bundle", lambda *args: Failing(error))
    with pytest.raises(ExportError, match=r"^export\.bundles\.bilstm-int8\.attention would not apply$"):
        bundle_stage.build(load_recipe(SMOKE), ["bilstm-int8"])


def test_bundles_all_current_write_nothing_into_the_runs_folder(monkeypatch):
    recipe = load_recipe(SMOKE)

    class Current:
        def run(self, force):
            return mf.Manifest(stage="bundle", recipe=recipe.name, recipe_hash="", config_hash="")

    monkeypatch.setattr(stages, "bundle", lambda *args: Current())
    bundle_stage.build(recipe, ["bilstm-int8"])
    assert not run_dir(recipe).exists()


@pytest.fixture
def loads(tmp_path, monkeypatch) -> tuple[bundle_stage.SourceCache, list[str]]:
    """A source cache of the smoke recipe whose loads of a source folder are noted by the folder's manifest text (no
    model is exported: the cache's keeping of sources alone is under test)."""
    noted = []

    def load(folder):
        noted.append((folder / mf.MANIFEST).read_text())
        return folder

    monkeypatch.setattr(bundle_stage, "load_tokenizer", lambda path: type("Tok", (), {"pad_token_id": 0})())
    monkeypatch.setattr(bundle_stage, "load_source", load)
    monkeypatch.setattr(bundle_stage, "export_onnx", lambda *args: None)
    monkeypatch.setattr(bundle_stage.validate, "torch_forward", lambda source: None)
    monkeypatch.setattr(bundle_stage.validate, "dev_logits", lambda *args: np.zeros((1, 2)))
    monkeypatch.setattr(bundle_stage.SourceCache, "features", lambda self, name: {})
    for folder in ("teacher", "student-cnn"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / mf.MANIFEST).write_text(f"{folder} 1")
    return bundle_stage.SourceCache(load_recipe(ROOT / "recipes" / "smoke.yaml"), tmp_path / "scratch"), noted


def test_a_source_is_loaded_once_for_its_bundles(loads, tmp_path):
    cache, noted = loads
    for _ in range(2):
        cache.get("cnn", tmp_path / "student-cnn", tmp_path / "teacher")
    assert noted == ["student-cnn 1"]


def test_a_source_published_again_between_its_bundles_is_loaded_again(loads, tmp_path):
    cache, noted = loads
    cache.get("cnn", tmp_path / "student-cnn", tmp_path / "teacher")
    (tmp_path / "student-cnn" / mf.MANIFEST).write_text("student-cnn 2")  # another command rebuilt it meanwhile
    cache.get("cnn", tmp_path / "student-cnn", tmp_path / "teacher")
    assert noted == ["student-cnn 1", "student-cnn 2"]


def test_a_teacher_published_again_between_bundles_has_every_source_loaded_again(loads, tmp_path):
    cache, noted = loads
    cache.get("cnn", tmp_path / "student-cnn", tmp_path / "teacher")
    (tmp_path / "teacher" / mf.MANIFEST).write_text("teacher 2")  # its tokenizer tokenizes every source's features
    cache.get("cnn", tmp_path / "student-cnn", tmp_path / "teacher")
    assert noted == ["student-cnn 1", "student-cnn 1"]
