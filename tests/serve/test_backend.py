"""The served model's runner: providers, threads and spinning from the settings, the CPU-fallback policy, and
TensorRT's errors without TensorRT or a GPU."""

import asyncio
import logging
import sys
import types
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from edgedistill.common import runtime
from edgedistill.common.bundle import TensorSpec, load_bundle
from edgedistill.common.runtime import SPIN_KEY, tensorrt_available
from edgedistill.serve import backend as served_backend
from edgedistill.serve.app import create_server
from edgedistill.serve.backend import BackendUnavailable, load_backend
from edgedistill.serve.batching import pad_rows
from edgedistill.serve.encoding import TextEncoder
from edgedistill.serve.errors import BundleRejected, InvalidInput
from edgedistill.serve.settings import Settings, load_settings
from tokenizers import normalizers

from tests.serve.conftest import MAX_LENGTH, PAIR_INPUTS, settings_for, tiny_model, tiny_tokenizer

cuda_offered = "CUDAExecutionProvider" in ort.get_available_providers()


def positive_logits(backend) -> np.ndarray:
    ids = np.array([[2, 4, 3]], np.int64)  # [CLS] great [SEP]
    return backend.infer({"input_ids": ids, "attention_mask": np.ones_like(ids)})["logits"]


def test_cpu_fallback_is_refused_by_default():
    assert load_settings([], {}).allow_cpu_fallback is False


def test_cpu_fallback_setting_reads_its_variable():
    assert load_settings([], {"EDGEDISTILL_ALLOW_CPU_FALLBACK": "true"}).allow_cpu_fallback is True


@pytest.mark.skipif(cuda_offered, reason="CUDA is available here")
def test_requested_gpu_provider_is_refused_naming_requested_active_and_the_fix(bundle):
    with pytest.raises(BackendUnavailable) as err:
        load_backend(load_bundle(bundle), Settings(providers=["cuda"], threads=1))
    message = str(err.value)
    assert "requested providers ['CUDAExecutionProvider', 'CPUExecutionProvider'], active ['CPUExecutionProvider']" in (
        message
    )
    assert "make setup ORT=gpu" in message
    assert "EDGEDISTILL_ALLOW_CPU_FALLBACK=true" in message


@pytest.mark.skipif(cuda_offered, reason="CUDA is available here")
def test_server_refuses_a_gpu_bundle_without_its_provider(make_bundle):
    folder = make_bundle("cuda", providers=["CUDAExecutionProvider", "CPUExecutionProvider"])

    async def build():
        create_server(settings_for(folder))

    with pytest.raises(BackendUnavailable, match="CUDAExecutionProvider"):
        asyncio.run(build())


@pytest.mark.skipif(cuda_offered, reason="CUDA is available here")
def test_allowed_cpu_fallback_serves_on_the_cpu_with_a_warning(bundle, caplog):
    with caplog.at_level(logging.WARNING, logger="edgedistill.common.runtime"):
        backend = load_backend(load_bundle(bundle), Settings(providers=["cuda"], threads=1, allow_cpu_fallback=True))
    assert backend.providers == ["CPUExecutionProvider"]
    assert any(
        "CUDAExecutionProvider" in r.getMessage() and "make setup ORT=gpu" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
    )
    logits = positive_logits(backend)
    assert logits.shape == (1, 2)
    assert logits[0, 1] > logits[0, 0]  # "great" is positive


def test_threads_setting_reaches_the_session(bundle):
    backend = load_backend(load_bundle(bundle), Settings(providers=["cpu"], threads=1))
    assert backend.session.get_session_options().intra_op_num_threads == 1


def test_bundle_disabled_optimizers_reach_the_session(make_bundle, monkeypatch):
    seen, real = {}, ort.InferenceSession

    def recording(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    folder = make_bundle(disabled_optimizers=["SkipLayerNormFusion"])
    backend = load_backend(load_bundle(folder), Settings(threads=1))
    assert seen["disabled_optimizers"] == ["SkipLayerNormFusion"]
    assert positive_logits(backend).shape == (1, 2)


@pytest.mark.parametrize("spin", [False, True])
def test_spinning_follows_the_setting(bundle, spin):
    backend = load_backend(load_bundle(bundle), Settings(threads=2, spin=spin))
    options = backend.session.get_session_options()
    assert options.get_session_config_entry(SPIN_KEY) == ("1" if spin else "0")
    assert options.intra_op_num_threads == 2


def test_model_inputs_must_match_the_spec(make_bundle):
    folder = make_bundle(
        inputs=[
            TensorSpec(name="input_ids", dtype="int64", shape=["batch", "sequence"]),
            TensorSpec(name="attention_mask", dtype="int64", shape=["batch", "sequence"]),
            TensorSpec(name="token_type_ids", dtype="int64", shape=["batch", "sequence"]),
        ]
    )
    with pytest.raises(BundleRejected, match="the bundle spec says"):
        load_backend(load_bundle(folder), Settings(threads=1))


def test_a_model_onnxruntime_cannot_load_is_rejected(make_bundle):
    folder = make_bundle("broken", model=b"not an onnx graph")
    with pytest.raises(BundleRejected, match="onnxruntime cannot load"):
        load_backend(load_bundle(folder), Settings(threads=1))


def test_encoder_truncates_to_max_length_and_drops_saved_padding(bundle):
    loaded = load_bundle(bundle)
    encoder = TextEncoder.for_bundle(loaded)
    short, long = encoder.encode(["good", "good " * 100])
    assert short["input_ids"].tolist() == [2, 5, 3]  # [CLS] good [SEP], no padding although the file pads
    assert len(long["input_ids"]) == MAX_LENGTH and long["input_ids"][-1] == 3
    assert encoder.pad_id == 0 and encoder.vocab_size == 30


def bert_cleaning_encoder() -> TextEncoder:
    """The tiny tokenizer with BERT's normalizer, which drops control and zero-width characters as BERT's do."""
    tok = tiny_tokenizer()
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    inputs = {name: "int64" for name in PAIR_INPUTS}
    return TextEncoder(Path("tokenizer.json"), MAX_LENGTH, inputs, 0, tokenizer_json=tok.to_str())


def test_a_text_the_tokenizer_keeps_nothing_of_is_invalid_input_naming_it():
    with pytest.raises(InvalidInput, match="text 1 holds nothing the tokenizer keeps"):
        bert_cleaning_encoder().encode(["good", "\u200b\x00\ufeff"])


def test_a_pair_the_tokenizer_keeps_nothing_of_is_invalid_input_naming_it():
    with pytest.raises(InvalidInput, match="text pair 0 holds nothing the tokenizer keeps"):
        bert_cleaning_encoder().encode(["good"], ["\u200d\u2060"])


def test_encoder_pads_with_the_id_the_bundle_spec_names(make_bundle):
    encoder = TextEncoder.for_bundle(load_bundle(make_bundle(pad_token_id=7)))  # not the tokenizer's [PAD] (0)
    assert encoder.pad_values["input_ids"] == 7


def test_a_served_batch_pads_its_shorter_rows_with_the_specs_id(make_bundle):
    encoder = TextEncoder.for_bundle(load_bundle(make_bundle(pad_token_id=7)))
    batch = pad_rows(encoder.encode(["good", "good good good"]), encoder.pad_values)
    assert batch["input_ids"][0].tolist() == [2, 5, 3, 7, 7]


def test_a_padding_id_outside_the_vocabulary_is_refused(make_bundle):
    with pytest.raises(BundleRejected, match="pad_token_id 30 is outside the tokenizer's 30 ids"):
        TextEncoder.for_bundle(load_bundle(make_bundle(pad_token_id=30)))


@pytest.fixture
def trt_bundle(make_bundle):
    return make_bundle(
        "trt", model=b"engine", runtime="tensorrt", model_file="model.plan", providers=["TensorrtExecutionProvider"]
    )


def _fake_module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def backend_ready(bundle: Path, settings: Settings, caplog) -> logging.LogRecord:
    """The backend_ready log record of loading `bundle` with `settings`."""
    with caplog.at_level(logging.INFO, logger=served_backend.__name__):
        load_backend(load_bundle(bundle), settings)
    return next(record for record in caplog.records if getattr(record, "event", None) == "backend_ready")


@pytest.fixture
def engine_ready(trt_bundle, monkeypatch, caplog) -> logging.LogRecord:
    """The backend_ready record of an engine bundle served by two workers (whose ONNX Runtime would share the cores),
    its engine opened by a stand-in: TensorRT cannot run here."""
    engine = types.SimpleNamespace(providers=["TensorRT 10.0"])
    monkeypatch.setattr(served_backend, "open_bundle", lambda *args, **kwargs: engine)
    return backend_ready(trt_bundle, Settings(workers=2), caplog)


def test_an_onnx_bundles_ready_line_gives_its_intra_op_threads_and_spinning(bundle, caplog):
    record = backend_ready(bundle, Settings(providers=["cpu"], threads=2), caplog)
    assert record.getMessage() == "onnxruntime ready on ['CPUExecutionProvider'], 2 intra-op threads, spinning off"


def test_a_tensorrt_engines_ready_line_names_no_intra_op_threads(engine_ready):
    assert engine_ready.getMessage() == "tensorrt ready on ['TensorRT 10.0']"


def test_a_tensorrt_engines_ready_event_gives_no_thread_count(engine_ready):
    assert engine_ready.threads is None


def test_a_tensorrt_engines_ready_event_gives_no_spinning(engine_ready):
    assert engine_ready.spin is None


def test_tensorrt_bundle_without_tensorrt_names_the_fix(trt_bundle, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # importing it raises ImportError
    with pytest.raises(BackendUnavailable, match=r"(?s)`tensorrt` Python package is not installed.*make setup ORT=gpu"):
        load_backend(load_bundle(trt_bundle), Settings(threads=1))


def test_tensorrt_without_cuda_python_names_it(trt_bundle, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_module("tensorrt", __version__="10.0"))
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(BackendUnavailable, match=r"(?s)`cuda-python` package.*make setup ORT=gpu"):
        load_backend(load_bundle(trt_bundle), Settings(threads=1))


def test_tensorrt_without_a_gpu_says_so(trt_bundle, monkeypatch):
    class CudaError:
        cudaSuccess = 0

    no_device = types.SimpleNamespace(name="cudaErrorNoDevice")
    cudart = _fake_module("cuda.bindings.runtime", cudaError_t=CudaError, cudaGetDeviceCount=lambda: (no_device, 0))
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_module("tensorrt", __version__="10.0"))
    monkeypatch.setitem(sys.modules, "cuda", _fake_module("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", _fake_module("cuda.bindings", runtime=cudart))
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", cudart)
    with pytest.raises(BackendUnavailable, match="no usable NVIDIA GPU or driver: .*cudaErrorNoDevice"):
        load_backend(load_bundle(trt_bundle), Settings(threads=1))


def test_an_engine_the_gpu_has_no_memory_for_is_refused_as_a_bundle_that_cannot_start(trt_bundle, monkeypatch):
    def full_gpu(*args, **kwargs):
        raise runtime.DeviceError("TensorRT cannot make an execution context for model.plan: OutOfMemory")

    monkeypatch.setattr(served_backend, "open_bundle", full_gpu)
    with pytest.raises(BackendUnavailable, match="cannot start on its GPU: TensorRT cannot make an execution context"):
        load_backend(load_bundle(trt_bundle), Settings())


def test_server_refuses_a_tensorrt_bundle_it_cannot_run(trt_bundle, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)

    async def build():
        create_server(settings_for(trt_bundle, threads=0))  # THREADS 0: the default, which an engine leaves unused

    with pytest.raises(BackendUnavailable, match="the `tensorrt` Python package is not installed"):
        asyncio.run(build())


@pytest.mark.gpu
@pytest.mark.skipif(
    not tensorrt_available(),
    reason="needs TensorRT, cuda-python (make setup ORT=gpu, docs/install.md) and an NVIDIA GPU",
)
def test_tensorrt_engine_matches_onnxruntime(bundle, make_bundle):
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(tiny_model().SerializeToString()), [parser.get_error(i) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    config.clear_flag(trt.BuilderFlag.TF32)  # fp32 MatMuls, as the fp32 reference computes them
    profile = builder.create_optimization_profile()
    for name in ("input_ids", "attention_mask"):
        profile.set_shape(name, (1, 1), (4, 8), (8, MAX_LENGTH))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None
    folder = make_bundle("trt-real", model=bytes(plan), runtime="tensorrt", model_file="model.plan")
    engine = load_backend(load_bundle(folder), Settings(threads=1))
    reference = load_backend(load_bundle(bundle), Settings(threads=1))
    ids = np.array([[2, 4, 7, 3, 0], [2, 10, 3, 0, 0]], np.int64)
    inputs = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}
    np.testing.assert_allclose(engine.infer(inputs)["logits"], reference.infer(inputs)["logits"], atol=1e-4)
    assert engine.max_batch_size == 8
    engine.close()


def test_an_fp32_bundle_the_providers_setting_sends_to_tensorrt_is_refused_naming_it(bundle, no_tf32_override):
    with pytest.raises(BackendUnavailable, match="NVIDIA_TF32_OVERRIDE=0.*EDGEDISTILL_PROVIDERS names"):
        load_backend(load_bundle(bundle), Settings(providers=["tensorrt"], threads=1))


def profile_batches(bundle, monkeypatch, **batching) -> set[int]:
    """The max batches of the profiles the TensorRT provider is given (offered, as on a GPU machine) for `bundle` served
    with the `batching` settings."""
    profiles, real = [], runtime.provider_options

    def recording(provider, precision, model, shapes=None):
        profiles.append(shapes)
        return real(provider, precision, model, shapes)

    monkeypatch.setenv("EDGEDISTILL_TRT_CACHE", str(bundle.parent / "trt"))
    monkeypatch.setattr(runtime, "provider_options", recording)
    monkeypatch.setattr(runtime, "available_providers", lambda: ["TensorrtExecutionProvider", "CPUExecutionProvider"])
    settings = Settings(providers=["tensorrt"], threads=1, allow_cpu_fallback=True, **batching)
    load_backend(load_bundle(bundle), settings).close()
    return {shapes.max_batch for shapes in profiles}


def test_the_tensorrt_provider_is_given_a_profile_up_to_the_max_batch_size_setting(bundle, monkeypatch, tf32_override):
    assert profile_batches(bundle, monkeypatch, max_batch_size=8) == {8}


def test_the_tensorrt_provider_is_given_a_profile_no_larger_than_the_queue(bundle, monkeypatch, tf32_override):
    assert profile_batches(bundle, monkeypatch, max_batch_size=4096, max_queued=64) == {64}


def test_an_engine_cache_that_cannot_be_made_refuses_the_bundle_naming_the_setting(
    bundle, tmp_path, monkeypatch, tf32_override
):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EDGEDISTILL_TRT_CACHE", str(blocker / "trt"))
    # the TensorRT provider offered, as on a GPU machine: its options are built before any session
    monkeypatch.setattr(runtime, "available_providers", lambda: ["TensorrtExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(BackendUnavailable, match="EDGEDISTILL_TRT_CACHE"):
        load_backend(load_bundle(bundle), Settings(providers=["tensorrt"], threads=1))
