import logging
import re
import shutil
import sys
import types
import weakref
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from edgedistill.common import manifest as mf
from edgedistill.common import runtime
from edgedistill.common.bundle import BundleSpec, TensorSpec, load_bundle, read_bundle
from edgedistill.common.cascade import MEMBERS
from edgedistill.common.runtime import (
    DeviceError,
    ModelLoadError,
    PrecisionRefused,
    ProviderFallback,
    Shapes,
    TensorRTUnavailable,
    available_providers,
    missing_here,
    open_bundle,
    open_runner,
    open_session,
    provider_options,
    require_tensorrt,
    resolve_providers,
    tensorrt_available,
)
from edgedistill.common.settings import SettingError
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi.onnxruntime_pybind11_state import EPFail, Fail

cuda_offered = "CUDAExecutionProvider" in available_providers()


@pytest.fixture
def model(tmp_path):
    """x [batch, 2] -> y = relu(x + 1) and z = x + 1."""
    one = numpy_helper.from_array(np.ones(2, dtype=np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["z"]), helper.make_node("Relu", ["z"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in ("y", "z")],
        [one],
    )
    path = tmp_path / "bundle" / "model.onnx"
    path.parent.mkdir()
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    onnx.save(onnx_model, path)
    return path


@pytest.fixture
def make_bundle(tmp_path, model):
    """A loaded bundle around `model` (input x, outputs y and z), with spec `changes`."""

    def make(name="bundle-tiny", **changes):
        fields = {
            "name": "tiny",
            "labels": ["a", "b"],
            "text_inputs": ["text"],
            "max_length": 2,
            "pad_token_id": 0,
            "inputs": [TensorSpec(name="x", dtype="float32", shape=["batch", 2])],
            "outputs": [TensorSpec(name="y", dtype="float32", shape=["batch", 2])],
            "precision": "fp32",
            "runtime": "onnxruntime",
            "providers": ["CPUExecutionProvider"],
            "model_file": "model.onnx",
            "arch": "tiny",
        }
        spec = BundleSpec(**(fields | changes))
        folder = tmp_path / name
        with mf.stage_folder(folder) as tmp:
            (tmp / spec.model_file).write_bytes(model.read_bytes())
            (tmp / "tokenizer.json").write_text("{}")
            base = mf.Manifest(stage="bundle", recipe="t", recipe_hash="h", config_hash="c")
            mf.commit(tmp, folder, base.model_copy(update={"info": {"bundle": spec.model_dump()}}))
        return load_bundle(folder)

    return make


# --- ONNX Runtime sessions ---------------------------------------------------------------------------------------


def test_the_gpu_install_advice_keeps_a_checkouts_install_editable():
    assert "pip install -e '.[gpu,dev]' in a checkout" in runtime.GPU_HINT


def test_cpu_session_runs_on_cpu(model):
    session = open_session(model, ["CPUExecutionProvider"], threads=1)
    assert session.get_providers() == ["CPUExecutionProvider"]
    x = np.array([[-3.0, 0.5]], dtype=np.float32)
    np.testing.assert_allclose(session.run(["y"], {"x": x})[0], [[0.0, 1.5]])


def test_threads_reach_the_session(model):
    session = open_session(model, ["cpu"], threads=1)
    assert session.get_session_options().intra_op_num_threads == 1


@pytest.mark.parametrize("spin", [False, True])
def test_spinning_follows_the_argument(model, spin):
    options = open_session(model, ["cpu"], spin=spin).get_session_options()
    assert options.get_session_config_entry(runtime.SPIN_KEY) == ("1" if spin else "0")


def test_disabled_optimizers_reach_the_session(model, monkeypatch):
    seen, real = {}, ort.InferenceSession

    def recording(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    open_session(model, ["cpu"], disabled_optimizers=["SkipLayerNormFusion"])
    assert seen["disabled_optimizers"] == ["SkipLayerNormFusion"]


@pytest.fixture
def noisy_model(tmp_path):
    """x [n] -> y = x reshaped to [2, 2] (a call with other than 4 values fails), beside an initializer no node uses
    (ONNX Runtime warns as it removes it)."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "noisy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.array([2, 2], np.int64), "shape"), numpy_helper.from_array(np.ones(2), "unused")],
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    path = tmp_path / "noisy.onnx"
    onnx.save(onnx_model, path)
    return path


def test_opening_a_session_prints_no_plain_text_on_stderr(noisy_model, capfd):
    open_session(noisy_model, ["cpu"])
    assert capfd.readouterr().err == ""


def test_a_failed_call_prints_no_plain_text_on_stderr(noisy_model, capfd):
    session = open_session(noisy_model, ["cpu"])
    capfd.readouterr()
    with pytest.raises(Fail):
        session.run(None, {"x": np.ones(3, np.float32)})
    assert capfd.readouterr().err == ""


def test_available_providers_lists_cpu():
    assert "CPUExecutionProvider" in available_providers()


def test_provider_aliases_are_expanded_and_cpu_comes_last():
    assert resolve_providers(["cuda", "TRT", "cpu"]) == [
        "CUDAExecutionProvider",
        "TensorrtExecutionProvider",
        "CPUExecutionProvider",
    ]


def test_cpu_is_appended_when_not_requested():
    assert resolve_providers(["tensorrt", "cuda"]) == [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]


@pytest.mark.parametrize(
    "providers, message",
    [
        (["CUDAExecutionProvidr"], "no ONNX Runtime execution provider, in any build: did you mean"),
        (["cuda", "CUDAExecutionProvider"], "CUDAExecutionProvider is named twice"),
        (["cpu", "cuda"], "CUDAExecutionProvider after CPUExecutionProvider would run nothing"),
    ],
    ids=["misspelt", "twice", "after-the-cpu"],
)
def test_a_session_on_providers_onnx_runtime_would_not_run_as_named_is_refused(model, providers, message):
    with pytest.raises(ValueError, match=message):
        open_session(model, providers)


@pytest.mark.skipif(cuda_offered, reason="this onnxruntime build offers CUDA; the fallback is tested without it")
def test_missing_gpu_provider_raises_with_requested_and_active(model):
    requested = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(ProviderFallback) as err:
        open_session(model, requested)
    message = str(err.value)
    assert f"requested providers {requested}, active ['CPUExecutionProvider']" in message
    assert "CUDAExecutionProvider is not in this onnxruntime build" in message
    assert "make setup ORT=gpu" in message


@pytest.mark.skipif(cuda_offered, reason="this onnxruntime build offers CUDA; the fallback is tested without it")
def test_allowed_cpu_fallback_returns_a_cpu_session_and_warns(model, caplog, tf32_override):
    with caplog.at_level(logging.WARNING, logger=runtime.__name__):
        session = open_session(model, ["TensorrtExecutionProvider", "CUDAExecutionProvider"], allow_cpu_fallback=True)
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.run(["y"], {"x": np.zeros((3, 2), np.float32)})[0].shape == (3, 2)
    [record] = [r for r in caplog.records if r.name == runtime.__name__]
    assert record.levelno == logging.WARNING
    assert "TensorrtExecutionProvider" in record.getMessage()
    assert "active ['CPUExecutionProvider']" in record.getMessage()


def test_tensorrt_provider_for_an_fp32_model_is_refused_naming_the_ways_out(model, no_tf32_override):
    with pytest.raises(PrecisionRefused, match="CUDAExecutionProvider .*runtime: tensorrt.*NVIDIA_TF32_OVERRIDE=0"):
        open_session(model, ["tensorrt", "cuda"])


def test_tensorrt_provider_for_an_int8_model_is_refused(model, no_tf32_override):
    with pytest.raises(PrecisionRefused, match="int8 model"):
        open_session(model, ["tensorrt"], precision="int8")


def relu_of_plus_one(session) -> list:
    return session.run(["y"], {"x": np.array([[-2.0, 1.0]], dtype=np.float32)})[0].tolist()


def test_tensorrt_provider_for_an_fp16_model_is_not_refused(model, no_tf32_override):
    assert relu_of_plus_one(open_session(model, ["tensorrt"], precision="fp16", allow_cpu_fallback=True)) == [[0, 2]]


def test_tensorrt_provider_for_an_fp32_model_is_allowed_under_the_tf32_override(model, tf32_override):
    assert relu_of_plus_one(open_session(model, ["tensorrt"], allow_cpu_fallback=True)) == [[0, 2]]


def test_a_tf32_override_other_than_zero_does_not_lift_the_refusal(model, monkeypatch):
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "1")
    with pytest.raises(PrecisionRefused):
        open_session(model, ["tensorrt"], allow_cpu_fallback=True)


def test_no_requested_provider_is_an_error(model):
    with pytest.raises(ValueError, match="no execution providers requested"):
        open_session(model, [])


def test_a_broken_model_file_raises_model_load_error(tmp_path):
    broken = tmp_path / "model.onnx"
    broken.write_bytes(b"not an onnx graph")
    with pytest.raises(ModelLoadError, match=f"onnxruntime cannot load {broken}"):
        open_session(broken, ["cpu"])


def provider_names(providers: list) -> list[str]:
    """The names of the providers a session is asked for, each a name or a (name, options) pair."""
    return [p if isinstance(p, str) else p[0] for p in providers]


def fail_to_start(monkeypatch, provider: str, error: str) -> list[tuple[list[str], list[str] | None]]:
    """CUDA and TensorRT offered, but every session asked for `provider` fails to start with `error`; returns each
    session ONNX Runtime was asked to build: (its providers, its disabled optimizers)."""
    attempts, real = [], ort.InferenceSession._create_inference_session

    def create(session, providers, provider_options, disabled_optimizers=None):
        attempts.append((provider_names(providers), disabled_optimizers))
        if provider in provider_names(providers):
            session._fallback_providers = ["CPUExecutionProvider"]  # as ONNX Runtime sets it before it starts them
            raise RuntimeError(error)
        return real(session, providers, provider_options, disabled_optimizers)

    offered = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(runtime, "available_providers", lambda: offered)
    monkeypatch.setattr(ort.InferenceSession, "_create_inference_session", create)
    return attempts


@pytest.fixture
def cuda_fails_to_start(monkeypatch):
    """Every session asked for CUDA fails to start (see `fail_to_start`)."""
    return fail_to_start(monkeypatch, "CUDAExecutionProvider", "CUDA failure 35: driver too old")


@pytest.fixture
def tensorrt_fails_to_start(monkeypatch, trt_cache, tf32_override):
    """Every session asked for TensorRT fails to start (see `fail_to_start`)."""
    return fail_to_start(monkeypatch, "TensorrtExecutionProvider", "TensorRT EP failed to create engine")


@pytest.mark.skipif(cuda_offered, reason="this onnxruntime build offers CUDA; its library loads here")
@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
def test_a_gpu_provider_dropped_without_an_error_is_refused_with_why_its_library_does_not_load(model, monkeypatch):
    # this build offers no CUDA, so ONNX Runtime drops it as onnxruntime-gpu does where its CUDA libraries are missing
    monkeypatch.setattr(runtime, "available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(ProviderFallback, match=r"failed to start \(.*libonnxruntime_providers_cuda\.so: cannot open"):
        open_session(model, ["cuda"])


def test_a_gpu_provider_that_fails_to_start_is_refused_with_its_error(model, cuda_fails_to_start):
    with pytest.raises(ProviderFallback, match=r"offered but failed to start \(CUDA failure 35: driver too old\)"):
        open_session(model, ["cuda"])


def test_an_allowed_fallback_keeps_the_disabled_optimizers(model, cuda_fails_to_start):
    open_session(model, ["cuda"], disabled_optimizers=["SkipLayerNormFusion"], allow_cpu_fallback=True)
    assert cuda_fails_to_start[-1] == (["CPUExecutionProvider"], ["SkipLayerNormFusion"])


def test_tensorrt_failing_to_start_leaves_cuda_to_run_the_model(model, tensorrt_fails_to_start):
    open_session(model, ["tensorrt", "cuda"], allow_cpu_fallback=True)
    assert [providers for providers, _ in tensorrt_fails_to_start] == [
        ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
        ["CUDAExecutionProvider", "CPUExecutionProvider"],
    ]


def test_a_start_failure_is_told_of_the_provider_that_failed_alone(model, tensorrt_fails_to_start):
    # ONNX Runtime's CPU build drops CUDA without an error, as a machine without a GPU does
    with pytest.raises(ProviderFallback) as refused:
        open_session(model, ["tensorrt", "cuda"])
    assert str(refused.value).count("TensorRT EP failed to create engine") == 1


def test_a_model_the_cpu_cannot_load_either_raises_model_load_error(tmp_path, cuda_fails_to_start):
    broken = tmp_path / "model.onnx"
    broken.write_bytes(b"not an onnx graph")
    with pytest.raises(ModelLoadError, match=f"onnxruntime cannot load {broken}"):
        open_session(broken, ["cuda"], allow_cpu_fallback=True)


def test_a_model_load_error_keeps_the_gpu_providers_error(tmp_path, cuda_fails_to_start):
    broken = tmp_path / "model.onnx"
    broken.write_bytes(b"not an onnx graph")
    with pytest.raises(ModelLoadError, match="CUDAExecutionProvider failed to start: CUDA failure 35: driver too old"):
        open_session(broken, ["cuda"])


def external_data_model(location: str) -> bytes:
    """y = w, whose 4 bytes ONNX keeps in the file `location` (external data)."""
    w = numpy_helper.from_array(np.zeros(4, np.uint8), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "4")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "external",
        [],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [4])],
        [w],
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    return onnx_model.SerializeToString()


def test_a_model_from_bytes_reads_no_file_of_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.bin").write_bytes(b"SECR")
    path = tmp_path / "bundle" / "model.onnx"
    path.parent.mkdir()
    model = external_data_model("secret.bin")
    path.write_bytes(model)
    with pytest.raises(ModelLoadError, match="External data path does not exist"):
        open_session(path, ["cpu"], model=model)


@pytest.fixture
def trt_cache(tmp_path, monkeypatch):
    """`EDGEDISTILL_TRT_CACHE` set to a folder that does not exist yet, nor its parent."""
    cache = tmp_path / "cache" / "trt"
    monkeypatch.setenv("EDGEDISTILL_TRT_CACHE", str(cache))
    return cache


def test_tensorrt_options_enable_fp16_for_an_fp16_model(trt_cache):
    assert provider_options("TensorrtExecutionProvider", "fp16", b"model")["trt_fp16_enable"] is True


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_tensorrt_runs_a_model_that_is_not_fp16_without_fp16_kernels(trt_cache, precision):
    assert provider_options("TensorrtExecutionProvider", precision, b"model")["trt_fp16_enable"] is False


def test_tensorrt_keeps_timing_and_engines_where_the_setting_says(trt_cache):
    options = provider_options("TensorrtExecutionProvider", "fp16", b"model")
    assert options["trt_timing_cache_path"] == str(trt_cache)
    assert Path(options["trt_engine_cache_path"]).parent == trt_cache


def test_tensorrt_caches_in_the_users_cache_folder_not_in_the_bundle(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGEDISTILL_TRT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    options = provider_options("TensorrtExecutionProvider", "fp16", b"model")
    assert options["trt_timing_cache_path"] == str(tmp_path / "edgedistill" / "trt")


def test_tensorrt_options_make_the_engine_cache_with_its_parents(trt_cache):
    options = provider_options("TensorrtExecutionProvider", "fp32", b"model")
    assert Path(options["trt_engine_cache_path"]).is_dir()


def test_an_engine_cache_that_cannot_be_made_names_the_setting(trt_cache):
    trt_cache.parent.mkdir(parents=True, exist_ok=True)
    trt_cache.write_text("a file where the folder should be")
    with pytest.raises(SettingError, match="EDGEDISTILL_TRT_CACHE: cannot make TensorRT's engine cache"):
        provider_options("TensorrtExecutionProvider", "fp32", b"model")


def engine_cache(model: bytes | Path, precision: str = "fp32") -> str:
    return provider_options("TensorrtExecutionProvider", precision, model)["trt_engine_cache_path"]


def test_a_retrained_model_of_the_same_graph_gets_its_own_engine_cache(trt_cache):
    assert engine_cache(b"weights before") != engine_cache(b"weights after")


def test_fp16_and_fp32_runs_of_one_model_get_their_own_engine_caches(trt_cache):
    assert engine_cache(b"model", "fp16") != engine_cache(b"model", "fp32")


def test_a_model_file_and_its_bytes_share_an_engine_cache(trt_cache, model):
    assert engine_cache(model) == engine_cache(model.read_bytes())


def profile(model: Path, max_batch: int = 32, max_sequence: int = 128) -> dict:
    """TensorRT's options for `model`, for every input of the ONNX graph."""
    inputs = tuple(i.name for i in onnx.load(str(model)).graph.input)
    return provider_options("TensorrtExecutionProvider", "fp16", model, Shapes(inputs, max_batch, max_sequence))


def test_tensorrt_profile_starts_every_input_at_one_row_of_one_token(trt_cache, model):
    assert profile(model)["trt_profile_min_shapes"] == "x:1x1"


def test_tensorrt_profile_ends_every_input_at_the_callers_batch_and_the_max_length(trt_cache, model):
    assert profile(model)["trt_profile_max_shapes"] == "x:32x128"


def test_tensorrt_profile_is_tuned_where_the_engines_are(trt_cache, model):
    assert profile(model)["trt_profile_opt_shapes"] == "x:8x64"


def test_tensorrt_profile_is_tuned_within_a_smaller_maximum(trt_cache, model):
    assert profile(model, max_batch=4, max_sequence=16)["trt_profile_opt_shapes"] == "x:4x16"


def test_tensorrt_profile_names_each_input():
    shapes = Shapes(("input_ids", "attention_mask"), 16, 32)
    assert shapes.tensorrt_profile()["trt_profile_max_shapes"] == "input_ids:16x32,attention_mask:16x32"


def test_a_tensorrt_profile_gives_back_the_shapes_it_was_made_of():
    shapes = Shapes(("input_ids", "attention_mask"), 16, 32)
    assert Shapes.of_tensorrt_profile(shapes.tensorrt_profile()) == shapes


def test_the_tensorrt_providers_options_give_the_callers_batch_and_the_max_length(trt_cache, model):
    assert Shapes.of_tensorrt_profile(profile(model, max_batch=16, max_sequence=48)) == Shapes(("x",), 16, 48)


def test_a_tensorrt_profile_limits_calls_to_the_smallest_maximum_over_its_inputs():
    options = {"trt_profile_max_shapes": "input_ids:16x64,attention_mask:8x128"}
    assert Shapes.of_tensorrt_profile(options) == Shapes(("input_ids", "attention_mask"), 8, 64)


@pytest.mark.parametrize(
    "options",
    [{}, {"trt_profile_max_shapes": ""}],
    ids=["not-given", "reported-empty-by-the-session"],
)
def test_tensorrt_options_without_a_profile_give_no_shapes(options):
    assert Shapes.of_tensorrt_profile(options) is None


def test_engines_of_two_profiles_get_their_own_caches(trt_cache, model):
    assert (
        profile(model, max_batch=16)["trt_engine_cache_path"] != profile(model, max_batch=32)["trt_engine_cache_path"]
    )


def test_a_bundle_on_tensorrt_gets_a_profile_to_the_callers_batch_and_its_max_length(
    make_bundle, monkeypatch, trt_cache
):
    offered, real = {}, ort.InferenceSession._create_inference_session

    def create(session, providers, provider_options, disabled_optimizers=None):
        offered.update((name, options) for name, options in providers if name == "TensorrtExecutionProvider")
        if offered and any(name == "TensorrtExecutionProvider" for name, _ in providers):
            raise RuntimeError("no GPU here")  # the options are what is checked; the CPU runs the model
        return real(session, providers, provider_options, disabled_optimizers)

    monkeypatch.setattr(runtime, "available_providers", lambda: ["TensorrtExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort.InferenceSession, "_create_inference_session", create)
    bundle = make_bundle(precision="fp16", providers=["TensorrtExecutionProvider"])
    open_bundle(bundle, allow_cpu_fallback=True, max_batch=16).close()
    assert offered["TensorrtExecutionProvider"]["trt_profile_max_shapes"] == "x:16x2"


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_cuda_picks_cudnn_algorithms_by_heuristic(precision):
    assert provider_options("CUDAExecutionProvider", precision, b"model")["cudnn_conv_algo_search"] == "HEURISTIC"


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_cuda_runs_a_model_that_is_not_fp16_without_tf32(precision):
    assert provider_options("CUDAExecutionProvider", precision, b"model")["use_tf32"] == 0


def test_cuda_leaves_tf32_to_onnx_runtime_for_an_fp16_model():
    assert "use_tf32" not in provider_options("CUDAExecutionProvider", "fp16", b"model")


def test_cpu_has_no_provider_options():
    assert provider_options("CPUExecutionProvider", "fp32", b"model") == {}


@pytest.mark.gpu
@pytest.mark.skipif(
    not cuda_offered, reason="needs onnxruntime-gpu and an NVIDIA GPU (make setup ORT=gpu, docs/install.md)"
)
def test_cuda_session_runs_on_cuda(model):
    session = open_session(model, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    np.testing.assert_allclose(session.run(["y"], {"x": np.ones((2, 2), np.float32)})[0], np.full((2, 2), 2.0))


# --- What this machine can run ----------------------------------------------------------------------------------


def test_a_provider_this_build_lacks_is_named(monkeypatch):
    monkeypatch.setattr(runtime, "available_providers", lambda: ["CPUExecutionProvider"])
    assert missing_here("onnxruntime", ["CUDAExecutionProvider"]) == (
        "CUDAExecutionProvider not offered by this onnxruntime build"
    )


def test_cpu_is_always_runnable(monkeypatch):
    monkeypatch.setattr(runtime, "available_providers", lambda: ["CPUExecutionProvider"])
    assert missing_here("onnxruntime", ["CPUExecutionProvider"]) is None


@pytest.fixture
def probed_afresh():
    """Whether each provider starts, probed again in this test and after it (`runtime.provider_problem`)."""
    runtime.provider_problem.cache_clear()
    yield
    runtime.provider_problem.cache_clear()


@pytest.fixture
def gpu_providers_start(monkeypatch, probed_afresh):
    """CUDA and TensorRT offered, and every session starting each provider it is asked for (running on the CPU)."""
    real = ort.InferenceSession._create_inference_session

    def create(session, providers, provider_options, disabled_optimizers=None):
        real(session, ["CPUExecutionProvider"], None, disabled_optimizers)
        session._providers = provider_names(providers)

    offered = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(runtime, "available_providers", lambda: offered)
    monkeypatch.setattr(ort.InferenceSession, "_create_inference_session", create)


def test_an_offered_provider_that_starts_is_runnable(gpu_providers_start):
    assert missing_here("onnxruntime", ["cuda"]) is None


@pytest.mark.skipif(cuda_offered, reason="this onnxruntime build offers CUDA; its library loads here")
@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
def test_an_offered_provider_that_does_not_start_here_is_named_with_why(monkeypatch, probed_afresh):
    # this build offers no CUDA, so ONNX Runtime drops it as onnxruntime-gpu does where its CUDA libraries are missing
    monkeypatch.setattr(runtime, "available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert re.fullmatch(
        r"CUDAExecutionProvider is offered but does not start here: .*/libonnxruntime_providers_cuda\.so: cannot "
        r"open shared object file: No such file or directory",
        missing_here("onnxruntime", ["cuda"]),
    )


def test_an_offered_provider_that_fails_to_start_is_named_with_its_error(cuda_fails_to_start, probed_afresh):
    assert missing_here("onnxruntime", ["cuda"]) == (
        "CUDAExecutionProvider is offered but does not start here: CUDA failure 35: driver too old"
    )


def test_whether_a_provider_starts_is_probed_once_per_process(cuda_fails_to_start, probed_afresh):
    missing_here("onnxruntime", ["cuda"])
    missing_here("onnxruntime", ["cuda"])
    assert len(cuda_fails_to_start) == 1


def test_the_probe_model_is_one_identity_node_onnx_accepts():
    probe = onnx.load_from_string(runtime.PROBE_MODEL)
    onnx.checker.check_model(probe)
    assert [node.op_type for node in probe.graph.node] == ["Identity"]


def test_an_engine_needs_tensorrt_but_no_execution_provider(monkeypatch):
    monkeypatch.setattr(runtime, "available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(runtime, "tensorrt_problems", lambda: [])
    assert missing_here("tensorrt", ["tensorrt"]) is None
    monkeypatch.setattr(runtime, "tensorrt_problems", lambda: ["no GPU", "no package"])
    assert missing_here("tensorrt", ["tensorrt"]) == "no GPU; no package"


# --- Runners and bundles ----------------------------------------------------------------------------------------


def test_session_runner_returns_every_output_and_ignores_extra_feeds(model):
    runner = open_runner(model, "onnxruntime", ["cpu"], threads=1)
    x = np.array([[-3.0, 0.5]], dtype=np.float32)
    outputs = runner.infer({"x": x, "token_type_ids": np.zeros((1, 2), np.int64)})
    np.testing.assert_allclose(outputs["y"], [[0.0, 1.5]])
    np.testing.assert_allclose(outputs["z"], [[-2.0, 1.5]])
    assert runner.providers == ["CPUExecutionProvider"]
    assert runner.max_batch_size is None
    assert runner.max_sequence is None
    runner.close()


class FailingProvider:
    """An ONNX Runtime session whose execution provider fails every call with `error`."""

    def __init__(self, session, error: Exception):
        self.session, self.error = session, error

    def run(self, *args):
        raise self.error

    def __getattr__(self, name):
        return getattr(self.session, name)


# How ONNX Runtime's TensorRT provider and its CUDA provider fail a call: EP_FAIL, and FAIL naming the CUDA error
TENSORRT_FAILURE = EPFail("[ONNXRuntimeError] : 11 : EP_FAIL : TensorRT EP execution context enqueue failed.")
CUDA_FAILURE = Fail(
    "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running MatMul node. Name:'m' "
    "Status Message: CUDA failure 700: an illegal memory access was encountered ; GPU=0 ; hostname=h ; expr=x;"
)


@pytest.mark.parametrize("error", [TENSORRT_FAILURE, CUDA_FAILURE], ids=["tensorrt", "cuda"])
def test_a_provider_that_fails_a_call_raises_device_error(model, monkeypatch, error):
    runner = open_runner(model, "onnxruntime", ["cpu"], threads=1)
    monkeypatch.setattr(runner.session, "_sess", FailingProvider(runner.session._sess, error))
    with pytest.raises(DeviceError, match="CPUExecutionProvider failed running the model: "):
        runner.infer({"x": np.ones((1, 2), np.float32)})


def test_a_call_failing_without_a_gpu_error_is_not_a_device_error(model, monkeypatch):
    runner = open_runner(model, "onnxruntime", ["cpu"], threads=1)
    error = Fail("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node.")
    monkeypatch.setattr(runner.session, "_sess", FailingProvider(runner.session._sess, error))
    with pytest.raises(Fail):
        runner.infer({"x": np.ones((1, 2), np.float32)})


def test_a_provider_that_fails_a_call_keeps_its_session(model, monkeypatch):
    runner = open_runner(model, "onnxruntime", ["cpu"], threads=1)
    failing = FailingProvider(runner.session._sess, TENSORRT_FAILURE)
    monkeypatch.setattr(runner.session, "_sess", failing)
    with pytest.raises(DeviceError):
        runner.infer({"x": np.ones((1, 2), np.float32)})
    assert runner.session._sess is failing  # not rebuilt on the CPU by ONNX Runtime


def test_an_unknown_runtime_is_an_error(model):
    with pytest.raises(ValueError, match="unknown runtime 'openvino'"):
        open_runner(model, "openvino", ["cpu"])


def test_open_bundle_runs_the_bundle(make_bundle):
    runner = open_bundle(make_bundle(), threads=1)
    assert runner.infer({"x": np.ones((2, 2), np.float32)})["y"].shape == (2, 2)


@pytest.mark.skipif(cuda_offered, reason="this onnxruntime build offers CUDA; the fallback is tested without it")
def test_open_bundle_uses_the_bundle_providers_unless_given(make_bundle):
    bundle = make_bundle(providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(ProviderFallback):
        open_bundle(bundle)
    assert open_bundle(bundle, ["cpu"]).providers == ["CPUExecutionProvider"]


def test_open_bundle_passes_the_bundle_disabled_optimizers(make_bundle, monkeypatch):
    seen, real = {}, ort.InferenceSession

    def recording(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    open_bundle(make_bundle(disabled_optimizers=["SkipLayerNormFusion"]))
    assert seen["disabled_optimizers"] == ["SkipLayerNormFusion"]


def test_open_bundle_builds_the_session_from_the_verified_bytes_not_the_file(make_bundle):
    bundle, files = read_bundle(make_bundle().folder)
    bundle.model_path.write_bytes(b"not a model: the file changed after it was read and verified")
    runner = open_bundle(bundle, model=files.model, threads=1)
    assert runner.infer({"x": np.ones((2, 2), np.float32)})["y"].tolist() == [[2.0, 2.0], [2.0, 2.0]]


def test_read_bundle_reads_the_model_and_tokenizer_it_verified(make_bundle):
    bundle = make_bundle()
    _, files = read_bundle(bundle.folder)
    assert files.model == bundle.model_path.read_bytes()
    assert files.tokenizer == "{}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda path: path.write_bytes(path.read_bytes()[:-1] + b"!"), "does not match its sha256"),
        (
            lambda path: path.write_bytes(path.read_bytes() + b"!"),
            r"has \d+ bytes, the manifest says \d+ \(written to since\?\)",
        ),
        (lambda path: path.unlink(), "is listed in the manifest but missing"),
    ],
    ids=["edited", "grown", "missing"],
)
@pytest.mark.parametrize("name", ["model.onnx", "tokenizer.json"])
def test_read_bundle_refuses_a_served_file_that_differs_from_its_manifest(make_bundle, name, change, message):
    bundle = make_bundle()
    change(bundle.folder / name)
    with pytest.raises(mf.ArtifactError, match=f"{name} {message}"):
        read_bundle(bundle.folder)


def test_model_inputs_must_match_the_spec(make_bundle):
    bundle = make_bundle(inputs=[TensorSpec(name="input_ids", dtype="int64", shape=["batch", "sequence"])])
    with pytest.raises(mf.ArtifactError, match=r"takes inputs \['x'\], the bundle spec says \['input_ids'\]"):
        open_bundle(bundle)


def test_spec_outputs_must_exist_in_the_model(make_bundle):
    bundle = make_bundle(outputs=[TensorSpec(name="logits", dtype="float32", shape=["batch", 2])])
    with pytest.raises(mf.ArtifactError, match=r"has no output\(s\) \['logits'\]"):
        open_bundle(bundle)


# --- TensorRT: what is missing, and how to get it ----------------------------------------------------------------


def fake_tensorrt(monkeypatch, version):
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__=version))


def fake_cuda(monkeypatch, count_status="cudaErrorNoDevice"):
    """cuda-python whose `cudaGetDeviceCount` answers with `count_status` and no device."""
    success = types.SimpleNamespace(name="cudaSuccess")
    status = success if count_status == "cudaSuccess" else types.SimpleNamespace(name=count_status)
    cudart = types.ModuleType("cuda.bindings.runtime")
    cudart.cudaError_t = types.SimpleNamespace(cudaSuccess=success)
    cudart.cudaGetDeviceCount = lambda: (status, 0)
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", types.SimpleNamespace(runtime=cudart))
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", cudart)


def test_missing_packages_are_all_named_with_the_fix(no_tensorrt, no_cuda_python):
    with pytest.raises(TensorRTUnavailable) as err:
        require_tensorrt()
    message = str(err.value)
    assert "`tensorrt` Python package is not installed" in message
    assert "`cuda-python` package" in message
    assert "make setup ORT=gpu" in message
    assert "onnxruntime and onnxruntime-gpu must not be installed together" in message


def test_tensorrt_is_not_available_without_its_package(no_tensorrt, no_cuda_python):
    assert not tensorrt_available()


def test_package_present_but_no_gpu_names_only_the_gpu(monkeypatch):
    fake_tensorrt(monkeypatch, "10.9.0")
    fake_cuda(monkeypatch, "cudaErrorNoDevice")
    with pytest.raises(TensorRTUnavailable) as err:
        require_tensorrt()
    message = str(err.value)
    assert "no usable NVIDIA GPU or driver: cudaGetDeviceCount failed with cudaErrorNoDevice" in message
    assert "package is not installed" not in message
    assert "make setup ORT=gpu" in message


def test_a_driver_that_sees_no_device_is_named(monkeypatch):
    fake_tensorrt(monkeypatch, "10.9.0")
    fake_cuda(monkeypatch, "cudaSuccess")
    with pytest.raises(TensorRTUnavailable, match="no NVIDIA GPU: CUDA sees no device"):
        require_tensorrt()


def test_tensorrt_older_than_10_is_refused(monkeypatch):
    fake_tensorrt(monkeypatch, "8.6.1")
    fake_cuda(monkeypatch)
    with pytest.raises(TensorRTUnavailable, match=r"version 8\.6\.1; this code needs TensorRT >= 10"):
        require_tensorrt()


def test_an_engine_without_tensorrt_is_refused_before_it_is_read(tmp_path, no_tensorrt, no_cuda_python):
    with pytest.raises(TensorRTUnavailable, match="`tensorrt` Python package"):
        open_runner(tmp_path / "absent.plan", "tensorrt", [])


def test_the_gpu_hint_makes_the_checkouts_environment_afresh_before_its_gpu_setup():
    assert "rm -rf .venv, then make setup ORT=gpu" in runtime.GPU_HINT


def test_the_gpu_hint_removes_the_cpu_wheel_before_installing_the_gpu_extra_from_nvidias_index():
    assert re.search(
        r"pip uninstall .*onnxruntime .*pip install .*--extra-index-url https://pypi\.nvidia\.com", runtime.GPU_HINT
    )


# --- TensorRT engines, up to the GPU ------------------------------------------------------------------------------


class FakeCuda:
    """CUDA as `Cuda` drives it, with host bookkeeping for device memory: `cudaMalloc` of more than `limit` bytes
    fails as out of memory, and using or freeing a pointer not allocated fails, as CUDA's calls do; with `broken`,
    every `cudaFree` fails."""

    limit = 100
    broken = False

    def __init__(self):
        self.live, self.streams, self.last = set(), set(), 0

    def device_count(self) -> int:
        return 1

    def device_name(self, ordinal: int = 0) -> str:
        return "Fake GPU"

    def driver_version(self) -> str:
        return "13.0"

    def alloc(self, nbytes: int) -> int:
        if nbytes > self.limit:
            raise DeviceError("cudaMalloc failed with cudaErrorMemoryAllocation")
        self.last += 1
        self.live.add(self.last)
        return self.last

    def free(self, pointer: int) -> None:
        self._check(pointer, "cudaFree")
        if self.broken:
            raise DeviceError("cudaFree failed with cudaErrorLaunchFailure")
        self.live.remove(pointer)

    def _check(self, pointer: int, call: str) -> None:
        if pointer not in self.live:
            raise DeviceError(f"{call} failed with cudaErrorInvalidValue")

    def to_device(self, pointer: int, array: np.ndarray, stream=None) -> None:
        self._check(pointer, "cudaMemcpyAsync")

    def to_host(self, array: np.ndarray, pointer: int, stream) -> None:
        self._check(pointer, "cudaMemcpyAsync")

    def stream(self) -> int:
        self.streams.add(stream := len(self.streams) + 1)
        return stream

    def synchronize(self, stream) -> None:
        pass

    def destroy_stream(self, stream) -> None:
        self.streams.remove(stream)


def fake_engine(monkeypatch, context: bool = True, loads: bool = True) -> list:
    """The tensorrt package and CUDA as `FakeCuda`, around an engine of x [batch, 2] -> y [batch, 2] for 1 to 64
    rows; without `context`, the engine makes no execution context, as TensorRT's does out of GPU memory; without
    `loads`, no plan deserialises, as on another TensorRT version or GPU. Returns a weak reference to each engine
    deserialised."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.16.1"
    trt.nptype = np.dtype
    trt.TensorIOMode = types.SimpleNamespace(INPUT="input", OUTPUT="output")
    engines = []

    class ILogger:
        Severity = types.SimpleNamespace(INTERNAL_ERROR=0, ERROR=1, WARNING=2, INFO=3)

        def __init__(self):
            pass

    class Context:
        def set_input_shape(self, name, shape) -> bool:
            self.rows = shape[0]
            return True

        def set_tensor_address(self, name, pointer) -> None:
            pass

        def get_tensor_shape(self, name) -> tuple:
            return (self.rows, 2)

        def execute_async_v3(self, stream) -> bool:
            return True

    class Engine:
        num_io_tensors = 2

        def __init__(self, logger):
            self.logger = logger

        def create_execution_context(self):
            if context:
                return Context()
            self.logger.log(ILogger.Severity.ERROR, "Error Code 2: OutOfMemory (no memory for the context)")
            return None

        def get_tensor_name(self, index: int) -> str:
            return ("x", "y")[index]

        def get_tensor_mode(self, name: str) -> str:
            return trt.TensorIOMode.INPUT if name == "x" else trt.TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name: str):
            return np.float32

        def get_tensor_profile_shape(self, name: str, profile: int) -> list:
            return [(1, 2), (8, 2), (64, 2)]

    class Runtime:
        def __init__(self, logger):
            self.logger = logger

        def deserialize_cuda_engine(self, plan: bytes):
            if not loads:
                self.logger.log(ILogger.Severity.ERROR, "Serialization assertion stdVersionRead failed")
                return None
            engines.append(weakref.ref(engine := Engine(self.logger)))
            return engine

    trt.ILogger, trt.Runtime = ILogger, Runtime
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(runtime, "Cuda", FakeCuda)
    return engines


def rows(count: int) -> dict[str, np.ndarray]:
    return {"x": np.ones((count, 2), np.float32)}


@pytest.fixture
def engine_out_of_memory(monkeypatch):
    """An engine that has run a call of one row and failed one of 32, for which CUDA had no memory left."""
    fake_engine(monkeypatch)
    runner = open_runner("bundle-engine/model.plan", "tensorrt", [], model=b"plan")
    runner.infer(rows(1))
    with pytest.raises(DeviceError, match="cudaMalloc failed with cudaErrorMemoryAllocation"):
        runner.infer(rows(32))
    return runner


def test_an_engine_that_failed_to_grow_a_buffer_runs_the_next_call_in_a_new_one(engine_out_of_memory):
    assert engine_out_of_memory.infer(rows(1))["y"].shape == (1, 2)


def test_an_engine_that_failed_to_grow_a_buffer_frees_each_of_its_buffers_once_on_close(engine_out_of_memory):
    engine_out_of_memory.close()
    assert not engine_out_of_memory.cuda.live


def test_an_engine_whose_buffers_cannot_be_freed_destroys_its_stream_on_close(monkeypatch):
    fake_engine(monkeypatch)
    runner = open_runner("bundle-engine/model.plan", "tensorrt", [], model=b"plan")
    runner.infer(rows(1))
    runner.cuda.broken = True
    with pytest.raises(DeviceError, match="cudaFree failed"):
        runner.close()
    assert not runner.cuda.streams


def test_an_engine_without_an_execution_context_raises_device_error_naming_the_plan_and_tensorrts_error(monkeypatch):
    fake_engine(monkeypatch, context=False)
    with pytest.raises(DeviceError, match=r"execution context for bundle-engine/model\.plan: .*OutOfMemory"):
        open_runner("bundle-engine/model.plan", "tensorrt", [], model=b"plan")


def test_an_engine_without_an_execution_context_is_released(monkeypatch):
    engines = fake_engine(monkeypatch, context=False)
    with pytest.raises(DeviceError):
        open_runner("bundle-engine/model.plan", "tensorrt", [], model=b"plan")
    assert [engine() for engine in engines] == [None]


def test_an_engine_whose_cuda_stream_cannot_be_made_is_released(monkeypatch):
    engines = fake_engine(monkeypatch)

    def no_stream(cuda):
        raise DeviceError("cudaStreamCreate failed with cudaErrorMemoryAllocation")

    monkeypatch.setattr(FakeCuda, "stream", no_stream)
    with pytest.raises(DeviceError) as refused:  # kept: its traceback holds the runner that was being made
        open_runner("bundle-engine/model.plan", "tensorrt", [], model=b"plan")
    assert [engine() for engine in engines] == [None], refused.value


def write_engine_bundle(folder: Path, stage: str) -> Path:
    """An engine bundle (a placeholder plan of x [batch, 2] -> y [batch, 2]) in `folder`, its manifest's stage
    `stage`."""
    spec = BundleSpec(
        name="tiny",
        labels=["a", "b"],
        text_inputs=["text"],
        max_length=2,
        pad_token_id=0,
        inputs=[TensorSpec(name="x", dtype="float32", shape=["batch", 2])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=["batch", 2])],
        precision="fp16",
        runtime="tensorrt",
        providers=["TensorrtExecutionProvider"],
        model_file="model.plan",
        arch="tiny",
    )
    with mf.stage_folder(folder) as tmp:
        (tmp / spec.model_file).write_bytes(b"plan built elsewhere")
        (tmp / "tokenizer.json").write_text("{}")
        base = mf.Manifest(stage=stage, recipe="t", recipe_hash="h", config_hash="c")
        mf.commit(tmp, folder, base.model_copy(update={"info": {"bundle": spec.model_dump()}}))
    return folder


def engine_load_error(folder: Path) -> str:
    """The error of opening the engine bundle in `folder` where no plan deserialises."""
    with pytest.raises(ModelLoadError) as err:
        open_bundle(load_bundle(folder))
    return str(err.value)


def test_an_engine_that_does_not_load_names_its_bundles_rebuild_from_its_manifest_not_its_mount(tmp_path, monkeypatch):
    fake_engine(monkeypatch, loads=False)
    mounted = write_engine_bundle(tmp_path / "models" / "bundle", "bundle-teacher-engine-fp16")
    assert "(`edgedistill bundles RECIPE --only teacher-engine-fp16`)" in engine_load_error(mounted)


def test_a_cascade_members_engine_that_does_not_load_names_the_members_rebuild_then_the_cascades(tmp_path, monkeypatch):
    fake_engine(monkeypatch, loads=False)
    member = write_engine_bundle(tmp_path / "bundle-teacher-engine-fp16", "bundle-teacher-engine-fp16")
    cascade = tmp_path / "models" / "bundle"
    with mf.stage_folder(cascade) as tmp:
        shutil.copytree(member, tmp / MEMBERS / "teacher-engine-fp16")
        base = mf.Manifest(stage="bundle-engine-cascade", recipe="t", recipe_hash="h", config_hash="c")
        mf.commit(tmp, cascade, base.model_copy(update={"info": {"cascade": {}}}))
    command = "edgedistill bundles RECIPE --only teacher-engine-fp16 --only engine-cascade"
    assert f"(`{command}`)" in engine_load_error(cascade / MEMBERS / "teacher-engine-fp16")
