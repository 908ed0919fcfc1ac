import numpy as np
import onnx
import onnxruntime as ort
import pytest
from edgedistill.export.onnx_export import ExportError
from edgedistill.export.quantize import int8_dynamic
from edgedistill.export.smooth import smooth
from onnx import TensorProto, helper, numpy_helper

HIDDEN, INNER, OUTLIER = 32, 64, 3
IR_VERSION = 8  # what the exporter writes for opset 17; ONNX Runtime may not read the newest


def post_ln_block(path, shared_gamma: bool = False, norm_output: bool = False) -> None:
    """LayerNorm -> FFN (MatMul, BiasGelu, MatMul) -> residual Add, as in a post-LN encoder layer; channel
    OUTLIER of the LayerNorm's output runs 40 times larger than the others. `norm_output`: the LayerNorm's output
    is a graph output too."""
    rng = np.random.default_rng(0)
    gamma = np.ones(HIDDEN, np.float32)
    gamma[OUTLIER] = 40.0
    inits = {
        "gamma": gamma,
        "beta": rng.normal(0, 0.1, HIDDEN).astype(np.float32),
        "w1": rng.normal(0, 0.2, (HIDDEN, INNER)).astype(np.float32),
        "b1": rng.normal(0, 0.1, INNER).astype(np.float32),
        "w2": rng.normal(0, 0.2, (INNER, HIDDEN)).astype(np.float32),
    }
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], axis=-1),
        helper.make_node("MatMul", ["h", "w1"], ["a"]),
        helper.make_node("BiasGelu", ["a", "b1"], ["g"], domain="com.microsoft"),
        helper.make_node("MatMul", ["g", "w2"], ["f"]),
        helper.make_node("Add", ["f", "h"], ["y"]),
    ]
    if shared_gamma:
        nodes.append(helper.make_node("Mul", ["y", "gamma"], ["z"]))
    outputs = ["z" if shared_gamma else "y"] + (["h"] if norm_output else [])
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", "sequence", HIDDEN]) for out in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION), str(path))


def feeds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (4, 8, HIDDEN)).astype(np.float32)} for _ in range(count)]


def run(path, feed, output: int = 0) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[output]


@pytest.fixture
def block(tmp_path):
    post_ln_block(tmp_path / "block.onnx")
    return tmp_path / "block.onnx"


def test_smoothing_leaves_fp32_outputs_unchanged(block, tmp_path):
    smooth(block, tmp_path / "smoothed.onnx", feeds(4, 1), alpha=0.85)
    feed = feeds(1, 2)[0]
    np.testing.assert_allclose(run(tmp_path / "smoothed.onnx", feed), run(block, feed), rtol=1e-4, atol=1e-4)


def test_smoothing_counts_the_layernorm_and_gelu_outputs(block, tmp_path):
    assert smooth(block, tmp_path / "smoothed.onnx", feeds(2, 1), alpha=0.85) == 2


def test_smoothing_adds_a_mul_for_the_residual_and_one_for_the_gelu(block, tmp_path):
    smooth(block, tmp_path / "smoothed.onnx", feeds(2, 1), alpha=0.85)
    ops = [n.op_type for n in onnx.load(str(tmp_path / "smoothed.onnx")).graph.node]
    assert ops.count("Mul") == 2


def test_smoothing_shrinks_the_int8_error_of_an_outlier_channel(block, tmp_path):
    smooth(block, tmp_path / "smoothed.onnx", feeds(4, 1), alpha=0.85)
    int8_dynamic(block, tmp_path / "plain-int8.onnx", per_channel=True, op_types=["MatMul"])
    int8_dynamic(tmp_path / "smoothed.onnx", tmp_path / "smoothed-int8.onnx", per_channel=True, op_types=["MatMul"])
    feed = feeds(1, 3)[0]
    reference = run(block, feed)
    plain_error = np.abs(run(tmp_path / "plain-int8.onnx", feed) - reference).mean()
    smoothed_error = np.abs(run(tmp_path / "smoothed-int8.onnx", feed) - reference).mean()
    assert smoothed_error < plain_error / 2


def test_a_layernorm_output_that_the_graph_returns_keeps_its_value(tmp_path):
    post_ln_block(tmp_path / "block.onnx", norm_output=True)
    smooth(tmp_path / "block.onnx", tmp_path / "smoothed.onnx", feeds(2, 1), alpha=0.85)
    feed = feeds(1, 2)[0]
    np.testing.assert_allclose(
        run(tmp_path / "smoothed.onnx", feed, 1), run(tmp_path / "block.onnx", feed, 1), rtol=1e-5
    )


def test_a_graph_without_norm_or_gelu_before_a_matmul_is_refused(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, HIDDEN])],
        [numpy_helper.from_array(np.eye(HIDDEN, dtype=np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    onnx.save(model, str(tmp_path / "plain.onnx"))
    with pytest.raises(ExportError, match="nothing to smooth"):
        smooth(tmp_path / "plain.onnx", tmp_path / "out.onnx", [{"x": np.ones((2, HIDDEN), np.float32)}], 0.85)


def test_a_shared_layernorm_scale_is_refused(tmp_path):
    post_ln_block(tmp_path / "shared.onnx", shared_gamma=True)
    with pytest.raises(ExportError, match="gamma is shared by 2 nodes"):
        smooth(tmp_path / "shared.onnx", tmp_path / "out.onnx", feeds(1, 1), 0.85)
