import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from edgedistill.common.runtime import TensorRTUnavailable, open_runner, tensorrt_available
from edgedistill.export import tensorrt as trt_export
from edgedistill.export.onnx_export import Source, export_onnx
from edgedistill.export.tensorrt import EngineBuildError, build_engine, layernorm_scopes, scope
from onnx import TensorProto, helper, numpy_helper
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2ForSequenceClassification

INPUTS = ["input_ids", "attention_mask"]
VOCAB, HIDDEN = 32, 8

requires_tensorrt_gpu = pytest.mark.skipif(
    not tensorrt_available(),
    reason="needs TensorRT >= 10, cuda-python and an NVIDIA GPU with its driver (make setup ORT=gpu, docs/install.md)",
)


def tiny_classifier(path):
    """(input_ids, attention_mask) int64 [batch, sequence] -> embed, LayerNorm, masked mean, linear -> logits, Softmax probs."""
    rng = np.random.default_rng(0)
    weights = {
        "embedding": rng.normal(size=(VOCAB, HIDDEN)),
        "gamma": np.ones(HIDDEN),
        "beta": np.zeros(HIDDEN),
        "weight": rng.normal(size=(HIDDEN, 2)),
        "bias": np.array([0.1, -0.1]),
        "one": np.array(1.0),
    }
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    initializers += [numpy_helper.from_array(np.array(a, dtype=np.int64), n) for n, a in (("ax1", [1]), ("ax2", [2]))]
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["embedded"]),
        helper.make_node("LayerNormalization", ["embedded", "gamma", "beta"], ["normed"], axis=-1, name="LayerNorm"),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "ax2"], ["mask3"]),
        helper.make_node("Mul", ["normed", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "ax1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "ax1"], ["count"], keepdims=0),
        helper.make_node("Max", ["count", "one"], ["safe_count"]),
        helper.make_node("Div", ["summed", "safe_count"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "weight"], ["projected"]),
        helper.make_node("Add", ["projected", "bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="Softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"]) for n in INPUTS],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in ("logits", "probs")],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def feeds(batch, length, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), dtype=np.int64)
    mask[0, length // 2 :] = 0
    return {"input_ids": rng.integers(0, VOCAB, size=(batch, length), dtype=np.int64), "attention_mask": mask}


def test_build_engine_without_tensorrt_raises_and_writes_nothing(tmp_path, no_tensorrt, no_cuda_python):
    model = tiny_classifier(tmp_path / "model.onnx")
    with pytest.raises(TensorRTUnavailable) as err:
        build_engine(model, tmp_path / "model.plan", INPUTS)
    assert all(part in str(err.value) for part in ("`tensorrt`", "`cuda-python`", "make setup ORT=gpu"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch": (8, 1, 64)}, "batch profile must satisfy"),
        ({"sequence": (0, 64, 128)}, "sequence profile must satisfy"),
        ({"inputs": ["input_ids"]}, "the profile names"),
        ({"int8": True}, "needs calibration batches"),
        ({"calibration": [feeds(8, 64)]}, "only used with int8=True"),
        ({"int8": True, "calibration": [{"input_ids": np.zeros((8, 64), np.int64)}]}, "lacks inputs"),
    ],
)
def test_arguments_are_checked_before_tensorrt_is_needed(tmp_path, no_tensorrt, kwargs, message):
    model = tiny_classifier(tmp_path / "model.onnx")
    kwargs = {"inputs": INPUTS, **kwargs}
    with pytest.raises(ValueError, match=message):
        build_engine(model, tmp_path / "model.plan", **kwargs)


def test_too_few_calibration_sentences_are_refused_before_tensorrt_is_needed(tmp_path, no_tensorrt):
    model = tiny_classifier(tmp_path / "model.onnx")
    with pytest.raises(EngineBuildError, match="4 calibration sentences, fewer than one batch .* at least 8 texts"):
        build_engine(model, tmp_path / "model.plan", INPUTS, batch=(1, 8, 64), int8=True, calibration=[feeds(4, 64)])


def test_calibration_batches_are_recut_to_one_shape_within_the_profile():
    ragged = [
        {"input_ids": np.full((3, 5), 7), "attention_mask": np.ones((3, 5))},
        {"input_ids": np.full((4, 12), 9), "attention_mask": np.ones((4, 12))},
    ]
    batches = trt_export.calibration_batches(ragged, INPUTS, (1, 2, 4), (1, 4, 8))
    assert len(batches) == 4, "7 rows make 4 batches of 2, the last filled with the first row again"
    for batch in batches:
        assert {k: v.shape for k, v in batch.items()} == {"input_ids": (2, 8), "attention_mask": (2, 8)}
        assert all(v.dtype == np.int64 for v in batch.values())
    first = batches[0]
    assert first["input_ids"][0].tolist() == [7] * 5 + [0] * 3, "short rows are padded with id 0"
    assert first["attention_mask"][0].tolist() == [1] * 5 + [0] * 3, "and masked out"
    assert batches[2]["input_ids"][1].tolist() == [9] * 8, "rows longer than the profile's max are truncated"


def test_calibration_batches_calibrate_on_every_row_given():
    rows = [{"input_ids": np.arange(7)[:, None].repeat(3, 1), "attention_mask": np.ones((7, 3))}]
    batches = trt_export.calibration_batches(rows, INPUTS, (1, 2, 4), (1, 4, 8))
    assert [int(row[0]) for batch in batches for row in batch["input_ids"]] == [0, 1, 2, 3, 4, 5, 6, 0]


# two rows of 3 tokens, then two of 5: the first batch of 2 is padded to 5
SHORT_THEN_LONGER = [{"input_ids": np.full((2, 3), 7), "attention_mask": np.ones((2, 3))}, feeds(2, 5)]


def test_calibration_batches_pad_token_ids_with_the_tokenizers_pad_id():
    batch = trt_export.calibration_batches(SHORT_THEN_LONGER, INPUTS, (1, 2, 4), (1, 4, 8), pad_id=50256)[0]
    assert batch["input_ids"][0].tolist() == [7, 7, 7, 50256, 50256]


def test_a_calibration_row_longer_than_the_profiles_opt_length_keeps_its_last_token():
    long_row = {"input_ids": np.arange(1, 101)[None], "attention_mask": np.ones((1, 100))}  # a pair's final [SEP]: 100
    rows = [long_row, {"input_ids": np.full((1, 10), 7), "attention_mask": np.ones((1, 10))}]
    batch = trt_export.calibration_batches(rows, INPUTS, (1, 2, 64), (1, 64, 128))[0]
    assert batch["input_ids"][0, -1] == 100


def test_calibration_batches_pad_the_attention_mask_with_zeros_whatever_the_pad_id():
    batch = trt_export.calibration_batches(SHORT_THEN_LONGER, INPUTS, (1, 2, 4), (1, 4, 8), pad_id=50256)[0]
    assert batch["attention_mask"][0].tolist() == [1, 1, 1, 0, 0]


class Logits(torch.nn.Module):
    """A Hugging Face classifier as `(input_ids, attention_mask) -> logits`."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def exported_at_opset_16(tmp_path, model) -> onnx.GraphProto:
    """The graph of `model` exported at opset 16, which has no LayerNormalization: each LayerNorm is decomposed."""
    export_onnx(Source(Logits(model.eval()), tuple(INPUTS), "tiny", tmp_path), tmp_path / "plain.onnx", opset=16)
    return onnx.load(str(tmp_path / "plain.onnx")).graph


def test_a_gpt2s_decomposed_layernorms_are_kept_in_fp32_whatever_their_module_name(tmp_path):
    config = GPT2Config(vocab_size=120, n_embd=16, n_layer=1, n_head=2, n_positions=64, pad_token_id=0)
    graph = exported_at_opset_16(tmp_path, GPT2ForSequenceClassification(config))
    ln = {"/model/transformer/h.0/ln_1", "/model/transformer/h.0/ln_2", "/model/transformer/ln_f"}
    assert layernorm_scopes(graph) == ln, "and not the GELU's Pow"


def test_a_berts_decomposed_layernorms_are_kept_in_fp32(tmp_path):
    config = BertConfig(
        vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    graph = exported_at_opset_16(tmp_path, BertForSequenceClassification(config))
    layer = "/model/bert/encoder/layer.0"
    want = {"/model/bert/embeddings/LayerNorm", f"{layer}/attention/output/LayerNorm", f"{layer}/output/LayerNorm"}
    assert layernorm_scopes(graph) == want


def test_every_node_of_a_gpt2s_decomposed_layernorm_is_in_its_scope(tmp_path):
    config = GPT2Config(vocab_size=120, n_embd=16, n_layer=1, n_head=2, n_positions=64, pad_token_id=0)
    graph = exported_at_opset_16(tmp_path, GPT2ForSequenceClassification(config))
    ops = {node.op_type for node in graph.node if scope(node.name) in layernorm_scopes(graph)}
    assert ops >= {"ReduceMean", "Sub", "Pow", "Add", "Sqrt", "Div"}


def _ort_outputs(model, inputs):
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return dict(zip(["logits", "probs"], session.run(["logits", "probs"], inputs), strict=True))


@pytest.mark.gpu
@requires_tensorrt_gpu
def test_fp16_engine_builds_runs_and_matches_onnxruntime(tmp_path):
    model = tiny_classifier(tmp_path / "model.onnx")
    plan = tmp_path / "model.plan"
    info = build_engine(model, plan, INPUTS, batch=(1, 4, 8), sequence=(1, 16, 32), fp16=True, workspace_gb=0.5)
    assert plan.is_file()
    assert info["plan_bytes"] == plan.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.plan"], "no temporary file left"
    assert int(info["tensorrt"].split(".")[0]) >= 10
    assert info["gpu"]
    assert info["precision"] == {
        "fp16": True,
        "int8": False,
        "tf32": True,
        "obey_precision_constraints": True,
    }
    assert info["profile"]["input_ids"] == {"min": [1, 1], "opt": [4, 16], "max": [8, 32]}
    assert any("Softmax" in name for name in info["fp32_layers"])
    assert any("LayerNorm" in name for name in info["fp32_layers"])
    engine = open_runner(plan, "tensorrt", [])
    assert engine.max_batch_size == 8
    assert engine.max_sequence == 32
    for batch, length in [(1, 1), (3, 17), (8, 32)]:
        inputs = feeds(batch, length, seed=batch)
        got = engine.infer(inputs)
        want = _ort_outputs(model, inputs)
        assert got["logits"].shape == (batch, 2)
        np.testing.assert_allclose(got["logits"], want["logits"], atol=2e-2, rtol=2e-2)
        np.testing.assert_allclose(got["probs"], want["probs"], atol=1e-2)
    engine.close()


@pytest.mark.gpu
@requires_tensorrt_gpu
def test_calibrated_int8_engine_builds_and_runs(tmp_path):
    model = tiny_classifier(tmp_path / "model.onnx")
    plan = tmp_path / "model.plan"
    calibration = [feeds(5, 24, seed=s) for s in range(4)]  # rows longer than the profile's opt length, 16
    info = build_engine(
        model, plan, INPUTS, batch=(1, 4, 8), sequence=(1, 16, 32), int8=True, calibration=calibration, workspace_gb=0.5
    )
    assert info["calibration_batches"] == 5
    assert info["calibration_shape"] == [4, 24]
    got = open_runner(plan, "tensorrt", []).infer(feeds(2, 9))
    assert got["logits"].shape == (2, 2)
    assert np.isfinite(got["logits"]).all()


@pytest.mark.gpu
@requires_tensorrt_gpu
def test_parse_errors_carry_the_parser_messages(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Mystery", ["input_ids"], ["logits"], domain="com.example")],
        "unsupported",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(EngineBuildError, match=r"(?s)could not parse .*Mystery"):
        build_engine(tmp_path / "model.onnx", tmp_path / "model.plan", ["input_ids"])
    assert not (tmp_path / "model.plan").exists()
