import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from common.providers import provider_options
from export import providers
from export.providers import ProviderFallback, available, session_for

cuda_offered = "CUDAExecutionProvider" in available()


@pytest.fixture
def model(tmp_path):
    """x [batch, 2] -> relu(x + 1)."""
    one = numpy_helper.from_array(np.ones(2, dtype=np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["shifted"]), helper.make_node("Relu", ["shifted"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [one],
    )
    path = tmp_path / "bundle" / "model.onnx"
    path.parent.mkdir()
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    onnx.save(onnx_model, path)
    return path


def test_cpu_session_runs_on_cpu(model):
    session = session_for(model, ["CPUExecutionProvider"], threads=1)
    assert session.get_providers() == ["CPUExecutionProvider"]
    x = np.array([[-3.0, 0.5]], dtype=np.float32)
    np.testing.assert_allclose(session.run(["y"], {"x": x})[0], [[0.0, 1.5]])
    assert session.get_session_options().intra_op_num_threads == 1


def test_available_lists_cpu():
    assert "CPUExecutionProvider" in available()


@pytest.mark.skipif(cuda_offered, reason="this onnxruntime build offers CUDA; the fallback is tested without it")
def test_missing_gpu_provider_raises_with_requested_and_active(model):
    requested = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(ProviderFallback) as err:
        session_for(model, requested)
    message = str(err.value)
    assert f"requested providers {requested}, active ['CPUExecutionProvider']" in message
    assert "CUDAExecutionProvider is not in this onnxruntime build" in message
    assert "pip install '.[gpu]'" in message


@pytest.mark.skipif(cuda_offered, reason="this onnxruntime build offers CUDA; the fallback is tested without it")
def test_allow_fallback_returns_a_cpu_session_and_warns(model, caplog):
    with caplog.at_level(logging.WARNING, logger=providers.__name__):
        session = session_for(model, ["TensorrtExecutionProvider", "CUDAExecutionProvider"], allow_fallback=True)
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.run(["y"], {"x": np.zeros((3, 2), np.float32)})[0].shape == (3, 2)
    [record] = [r for r in caplog.records if r.name == providers.__name__]
    assert record.levelno == logging.WARNING
    assert (
        "TensorrtExecutionProvider" in record.getMessage() and "active ['CPUExecutionProvider']" in record.getMessage()
    )


def test_no_requested_provider_is_an_error(model):
    with pytest.raises(ValueError, match="no execution providers requested"):
        session_for(model, [])


def test_tensorrt_options_enable_fp16_and_cache_under_the_bundle(model, tmp_path):
    options = provider_options("TensorrtExecutionProvider", model)
    assert options["trt_fp16_enable"] is True and options["trt_engine_cache_enable"] is True
    assert options["trt_engine_cache_path"] == str(model.parent / "trt_cache")
    assert provider_options("TensorrtExecutionProvider", model, fp16=False, cache_dir=tmp_path / "c") == {
        **options,
        "trt_fp16_enable": False,
        "trt_engine_cache_path": str(tmp_path / "c"),
        "trt_timing_cache_path": str(tmp_path / "c"),
    }
    assert provider_options("CUDAExecutionProvider", model) == {"cudnn_conv_algo_search": "HEURISTIC"}
    assert provider_options("CPUExecutionProvider", model) == {}


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_offered, reason="needs onnxruntime-gpu and an NVIDIA GPU (pip install '.[gpu]')")
def test_cuda_session_runs_on_cuda(model):
    session = session_for(model, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    np.testing.assert_allclose(session.run(["y"], {"x": np.ones((2, 2), np.float32)})[0], np.full((2, 2), 2.0))


def test_bench_times_a_gpu_bundle_only_where_its_provider_is_offered(monkeypatch):
    from common.recipe import BundleRecipe
    from export import bench

    cuda = BundleRecipe(source="teacher", providers=["CUDAExecutionProvider"])
    monkeypatch.setattr(providers, "available", lambda: ["CPUExecutionProvider"])
    assert bench._left_out(cuda) == "CUDAExecutionProvider not offered by this onnxruntime build"
    assert bench._left_out(BundleRecipe(source="teacher")) is None
    assert "runtime tensorrt" in bench._left_out(BundleRecipe(source="teacher", runtime="tensorrt"))
    monkeypatch.setattr(providers, "available", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert bench._left_out(cuda) is None
