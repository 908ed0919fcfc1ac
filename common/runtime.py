"""One way to open a model: ONNX Runtime sessions and TensorRT engines behind `Runner.infer`. Torch-free.

The export checks (smoothing's calibration pass too), the model benchmark, labelling and the server all open
models here, with the same session options, provider options and fallback policy. ONNX Runtime drops a requested
execution provider it cannot start (plain `onnxruntime` installed, or `onnxruntime-gpu` on a machine
without a GPU) and runs on the CPU with only a console warning, which would make a GPU check or
benchmark measure the CPU and a GPU server serve from the CPU. `open_session` compares what runs
with what was asked and raises `ProviderFallback` unless the caller passes `allow_cpu_fallback=True`; `missing_here`
tells beforehand, starting each GPU provider asked for once per process on a one-node model.
ONNX Runtime's own fallback, which moves a session to the CPU when a provider fails to start or fails a call, is
off: a provider that fails a call (EP_FAIL, or a CUDA, cuBLAS or cuDNN failure) raises `DeviceError`.

A TensorRT engine (`model.plan`) is deserialised once per runner and run with device buffers from
cuda-python, the one CUDA binding here (the INT8 calibrator of `export.tensorrt` uses it too).
"""

import ctypes
import functools
import hashlib
import importlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Protocol

import numpy as np
from edgedistill.common import manifest as mf
from edgedistill.common import settings
from edgedistill.common.bundle import MODEL_FILES, Bundle, BundleSpec
from edgedistill.common.cascade import MEMBERS, is_cascade
from edgedistill.common.config.export import ENGINE_BATCH, ENGINE_OPT_SEQUENCE
from edgedistill.common.manifest import ArtifactError, sha256_file
from edgedistill.common.providers import CPU, CUDA, TENSORRT, cuda_options, known_providers

try:
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import EPFail, Fail
except ModuleNotFoundError as err:  # the role extras leave ONNX Runtime to the `cpu` or `gpu` extra
    raise ModuleNotFoundError(
        "ONNX Runtime is not installed: pip install 'edgedistill[cpu]' ('edgedistill[gpu]' on an NVIDIA GPU machine)",
        name="onnxruntime",
    ) from err

log = logging.getLogger(__name__)

TRITON_PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan"}
TRITON_LABELS_FILE = "labels.txt"  # the class names beside a model in a Triton repository (export.triton)
SPIN_KEY = "session.intra_op.allow_spinning"
# ONNX Runtime prints its own log to stderr as plain text, which breaks the JSON lines there (a server's log): its
# warnings ("Removing initializer", the CUDA provider's "Memcpy nodes are added") tell nothing to act on, and its
# errors, a failed call's at every call, come back as the exception raised, so only fatal messages are let out. One
# error is only logged: a provider library that does not load, whose provider is dropped (`_dropped_why` finds why).
ORT_LOG_SEVERITY = 4
# The library ONNX Runtime loads each GPU provider from: `capi/libonnxruntime_providers_<name>.so`.
PROVIDER_LIBRARIES = {CUDA: "cuda", TENSORRT: "tensorrt"}
# y = Identity(x) on float[1] (opset 17, IR 8), serialised: the model a provider is started on to see whether it
# starts here, written out so that no install needs the `onnx` package for it.
PROBE_MODEL = bytes.fromhex(
    "080812003a3b0a100a017812017922084964656e74697479120570726f62655a0f0a0178120a0a08080112040a020801620f0a0179120a0a"
    "08080112040a02080142040a001011"
)
# Where a model built from bytes finds its external data (tensors kept in other files): by default the working
# directory, so a model could read any file below it (`/` in a container). The model file itself, inside which no
# file can be, refuses every such reference; no stage writes external data.
EXTERNAL_DATA_KEY = "session.model_external_initializers_file_folder_path"
MIN_TENSORRT_MAJOR = 10
# TensorRT builds fp32 layers in TF32 (10 mantissa bits) on Ampere and later unless its builder flag is cleared, which
# ONNX Runtime's TensorRT provider does not offer; CUDA reads this variable once, when it starts in the process.
TF32_OVERRIDE_VAR = "NVIDIA_TF32_OVERRIDE"
# ONNX Runtime's CUDA provider fails a call with status FAIL, not EP_FAIL, naming the library: "CUDA failure 700: an
# illegal memory access was encountered ; GPU=0 ...", "CUBLAS failure 14: ...", "CUDA error executing cudaMemcpy...".
GPU_FAILURE = re.compile(r"\b(?:CUDA|CUBLAS|CUDNN) (?:failure \d+|error)\b")
GPU_HINT = (
    "Install on a machine with an NVIDIA GPU and its driver: in a checkout, rm -rf .venv, then make setup ORT=gpu "
    "(and TORCH_INDEX=https://download.pytorch.org/whl/cu130 where it trains there too: .venv is made once); in an "
    "environment of one's own, pip uninstall --yes onnxruntime onnxruntime-gpu, then pip install -e '.[gpu,dev]' in "
    "a checkout (from a wheel: pip install '<wheel>[gpu]') --extra-index-url https://pypi.nvidia.com, which brings "
    "onnxruntime-gpu, tensorrt and cuda-python: onnxruntime and onnxruntime-gpu must not be installed together."
)


class ProviderFallback(RuntimeError):
    """A requested execution provider is not active in the session; the message names requested vs active."""


class TensorRTUnavailable(RuntimeError):
    """The tensorrt or cuda-python package or a usable NVIDIA GPU is missing; the message says which and how to fix it."""


class ModelLoadError(RuntimeError):
    """The runtime cannot load the model file: a broken ONNX graph, or an engine built for another TensorRT or GPU."""


class DeviceError(RuntimeError):
    """A CUDA or TensorRT call failed on the GPU."""


class PrecisionRefused(ValueError):
    """The requested execution providers would run the model below its precision; the message names the ways out."""


# --- ONNX Runtime ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shapes:
    """The inputs a model is opened for: each of `inputs` a (batch, sequence) tensor of 1 to `max_batch` rows and 1 to
    `max_sequence` tokens."""

    inputs: tuple[str, ...]
    max_batch: int
    max_sequence: int

    def tensorrt_profile(self) -> dict[str, str]:
        """ONNX Runtime's TensorRT provider options for one optimisation profile over these shapes, tuned where
        TensorRT engines are (`ENGINE_BATCH`'s opt batch, `ENGINE_OPT_SEQUENCE` tokens): `name:BxT,...` each."""
        points = {
            "min": (1, 1),
            "opt": (min(ENGINE_BATCH[1], self.max_batch), min(ENGINE_OPT_SEQUENCE, self.max_sequence)),
            "max": (self.max_batch, self.max_sequence),
        }
        return {
            f"trt_profile_{point}_shapes": ",".join(f"{name}:{batch}x{length}" for name in self.inputs)
            for point, (batch, length) in points.items()
        }

    @classmethod
    def of_tensorrt_profile(cls, options: dict[str, str]) -> "Shapes | None":
        """The shapes whose `tensorrt_profile` gave `options` (a TensorRT provider's options, as a session reports
        them): its maximum, each limit the smallest over the inputs; None without a profile."""
        maxima = [shape.rpartition(":") for shape in options.get("trt_profile_max_shapes", "").split(",") if shape]
        if not maxima:
            return None
        sizes = [tuple(int(size) for size in dims.split("x")) for _, _, dims in maxima]
        return cls(
            tuple(name for name, _, _ in maxima),
            min(batch for batch, _ in sizes),
            min(length for _, length in sizes),
        )


def resolve_providers(names: list[str]) -> list[str]:
    """`known_providers(names)` (`ValueError` for a typo, a name given twice or one after the CPU's), CPU appended
    when absent: ONNX Runtime runs there the nodes a GPU provider does not take."""
    ordered = known_providers(names)
    return ordered if CPU in ordered else [*ordered, CPU]


def refuse_tf32(providers: list[str], precision: str, what: str) -> None:
    """Raise `PrecisionRefused` where ONNX Runtime's TensorRT provider, among `providers`, would run `what`, a model of
    `precision` other than fp16, in TF32: unless `NVIDIA_TF32_OVERRIDE=0` is set in the environment."""
    if precision == "fp16" or TENSORRT not in resolve_providers(providers) or os.environ.get(TF32_OVERRIDE_VAR) == "0":
        return
    raise PrecisionRefused(
        f"{what}: {TENSORRT} would run this {precision} model's fp32 layers in TF32 (10 mantissa bits), as TensorRT "
        f"builds them on Ampere and later GPUs, and ONNX Runtime offers no option to turn that off. Run it on "
        f"{CUDA} (without TF32), build a TensorRT engine bundle (runtime: tensorrt, built without TF32), or set "
        f"{TF32_OVERRIDE_VAR}=0 in the environment before the process starts"
    )


def available_providers() -> list[str]:
    """The execution providers this onnxruntime build offers (offered is not the same as usable: `provider_problem`)."""
    return ort.get_available_providers()


def _dropped_why(provider: str) -> str:
    """Why ONNX Runtime dropped `provider`, which this build offers, without raising: the error loading its library
    (CUDA or cuDNN libraries missing), which ONNX Runtime only logs, or a guess where it loads."""
    if library := PROVIDER_LIBRARIES.get(provider):
        try:
            ctypes.CDLL(str(Path(ort.__file__).parent / "capi" / f"libonnxruntime_providers_{library}.so"))
        except OSError as err:
            return str(err)
    return "no GPU or driver?"


@functools.cache
def provider_problem(provider: str) -> str | None:
    """Why `provider`, which this onnxruntime build offers, does not start here, or None where it does: found once per
    process by opening `PROBE_MODEL` on it."""
    ort.set_default_logger_severity(ORT_LOG_SEVERITY)
    options = ort.SessionOptions()
    options.log_severity_level = ORT_LOG_SEVERITY
    try:
        session = ort.InferenceSession(PROBE_MODEL, options, providers=[provider, CPU], enable_fallback=0)
    except Exception as err:  # onnxruntime raises its own exception types
        return str(err)
    return None if provider in session.get_providers() else _dropped_why(provider)


def tensorrt_options(precision: str, digest: str, shapes: Shapes | None, root: PurePath) -> dict:
    """ONNX Runtime's TensorRT provider options for a model of sha256 `digest` and `precision` (a bundle's: fp32, fp16
    or int8): FP16 kernels for an fp16 model only (its TF32 is left to `refuse_tf32`), one optimisation profile over
    `shapes`, an engine cache of this model's and profile's own in a folder below `root`, which the provider makes
    (`root` must exist), and the timing cache in `root`. Without `shapes`, TensorRT builds an engine for the shapes
    it has met, and again for each shape outside them."""
    # The provider names an engine after the model's file name and graph (names, shapes, versions), not its weights
    # nor the FP16 flag: a retrained student of the same architecture would get its predecessor's engine. Timings of
    # layers hold whatever the weights, so the timing cache is shared.
    profile = f"-b{shapes.max_batch}-t{shapes.max_sequence}" if shapes else ""
    return {
        "trt_fp16_enable": precision == "fp16",
        # Building an engine takes minutes for a BERT; the provider also keys it by GPU and TensorRT version.
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(root / f"{digest[:16]}-{precision}{profile}"),
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": str(root),
        # An explicit profile is built once, covering every call; the shapes a first call happens to have would not.
        **(shapes.tensorrt_profile() if shapes else {}),
    }


def provider_options(provider: str, precision: str, model: bytes | Path, shapes: Shapes | None = None) -> dict:
    """Options for one provider running `model` (its bytes, or its file) of `precision`: CUDA's are `cuda_options`,
    TensorRT's `tensorrt_options` with its caches in `common.settings.trt_cache()` (made here; `SettingError` where
    they cannot be)."""
    if provider == CUDA:
        return cuda_options(precision)
    if provider != TENSORRT:
        return {}
    digest = hashlib.sha256(model).hexdigest() if isinstance(model, bytes) else sha256_file(model)
    options = tensorrt_options(precision, digest, shapes, settings.trt_cache())
    engines = Path(options["trt_engine_cache_path"])
    try:  # the provider makes only the last folder of the path, and cannot start without it
        engines.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise settings.SettingError(
            f"{settings.TRT_CACHE_VAR}: cannot make TensorRT's engine cache {engines} ({err.strerror}); set it to a "
            "writable folder"
        ) from err
    return options


def missing_here(runtime: str, providers: list[str]) -> str | None:
    """Why this machine cannot run a model for `runtime` on `providers`, or None when it can."""
    if runtime == "tensorrt":  # an engine needs no execution provider
        return "; ".join(tensorrt_problems()) or None
    requested = resolve_providers(providers)
    if TENSORRT in requested:  # ONNX Runtime's TensorRT provider loads the libraries the tensorrt wheels ship
        problems = tensorrt_problems()
        if problems:
            return "; ".join(problems)
    offered = available_providers()
    if absent := [p for p in requested if p not in offered]:
        return f"{', '.join(absent)} not offered by this onnxruntime build"
    unstarted = [
        f"{p} is offered but does not start here: {why}"
        for p in requested
        if p in PROVIDER_LIBRARIES and (why := provider_problem(p))
    ]
    return "; ".join(unstarted) or None


def cascade_missing_here(export, name: str) -> str | None:
    """Why this machine cannot run cascade `name` of `export` (an `ExportConfig`): `member <id>: <reason>` for each
    member it cannot run, or None when it can run them all."""
    reasons = []
    for member in export.cascades[name].members:
        spec = export.bundles[member]
        if (reason := missing_here(spec.runtime, spec.providers)) is not None:
            reasons.append(f"member {member}: {reason}")
    return "; ".join(reasons) or None


def open_session(
    model_path: str | Path,
    providers: list[str],
    *,
    model: bytes | None = None,
    threads: int | None = None,
    spin: bool = False,
    disabled_optimizers: list[str] | None = None,
    allow_cpu_fallback: bool = False,
    precision: str = "fp32",
    shapes: Shapes | None = None,
) -> ort.InferenceSession:
    """An InferenceSession on `providers` (priority order, aliases allowed); `ProviderFallback` if one is not active.

    With `model`, the session is built from those bytes (the file at `model_path`, already read and verified)
    and the file is not opened again; `model_path` still names it in messages.
    `threads` sets intra-op threads (None or 0: ONNX Runtime's default); `spin` lets them spin while they
    wait for work; `disabled_optimizers` names graph optimizers to skip (a bundle's own list); `precision` is the
    model's and `shapes` those it will be called with (see `provider_options`); `PrecisionRefused` where TensorRT
    would run it in TF32 (`refuse_tf32`), on any machine, before a session is built. With `allow_cpu_fallback` a
    provider that is not active is logged as a warning and the session returned anyway, without each GPU provider
    that failed to start (the others keep their options, and the disabled optimizers hold). A model file ONNX Runtime
    cannot load raises `ModelLoadError`.
    """
    if not providers:
        raise ValueError("no execution providers requested (e.g. ['CPUExecutionProvider'])")
    requested = resolve_providers(providers)
    refuse_tf32(requested, precision, str(model_path))
    # the default logger logs what comes before the session's own: loading a provider's library
    ort.set_default_logger_severity(ORT_LOG_SEVERITY)
    options = ort.SessionOptions()
    options.log_severity_level = ORT_LOG_SEVERITY  # the session's load and, unless a call says otherwise, its calls
    if threads is not None:
        options.intra_op_num_threads = threads
    # ONNX Runtime spins by default; idle spinning threads keep cores busy that a server's event loop needs.
    options.add_session_config_entry(SPIN_KEY, "1" if spin else "0")
    # One model call at a time per session: the intra-op threads do the parallel work.
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if model is not None:
        options.add_session_config_entry(EXTERNAL_DATA_KEY, str(Path(model_path).absolute()))
    offered = available_providers()
    # Leave out providers this build lacks, so ONNX Runtime does not print its own fallback banner;
    # they are reported below together with those that failed to start.
    source = Path(model_path) if model is None else model
    usable = [(p, provider_options(p, precision, source, shapes)) for p in requested if p in offered]

    def build(providers: list[tuple[str, dict]]) -> ort.InferenceSession:
        # ONNX Runtime's own fallback, where a provider fails to start or fails a call, rebuilds the session on the
        # CPU without the provider options and disabled optimizers, and keeps it there: off, as that is decided here.
        return ort.InferenceSession(
            source, options, providers=providers, disabled_optimizers=disabled_optimizers or None, enable_fallback=0
        )

    # A failed start does not say whether a provider or the model is at fault, so the session is built again
    # without the GPU provider first in line (the others keep their options), down to the CPU alone: a model that
    # loads there is one a GPU provider could not take, else the model itself cannot load. The CPU attempt is that
    # test, needed even where no fallback is allowed, to raise `ModelLoadError` rather than `ProviderFallback`.
    failures: dict[str, Exception] = {}  # each GPU provider that was first in line when a start failed: its error
    attempt = usable
    while True:
        try:
            session = build(attempt)
            break
        except Exception as err:  # onnxruntime raises its own exception types for broken graphs and files
            failed = next((p for p, _ in attempt if p != CPU), None)
            if failed is None:
                before = "".join(f"; before that, {p} failed to start: {e}" for p, e in failures.items())
                raise ModelLoadError(f"onnxruntime cannot load {model_path}: {err}{before}") from err
            failures[failed] = err
            attempt = [(p, o) for p, o in attempt if p != failed]
    active = session.get_providers()
    missing = [p for p in requested if p not in active]
    if missing:
        reasons = [
            f"{p} is offered but failed to start ({failures[p] if p in failures else _dropped_why(p)})"
            if p in offered
            else f"{p} is not in this onnxruntime build"
            for p in missing
        ]
        message = f"{model_path}: requested providers {requested}, active {active}; {'; '.join(reasons)}. {GPU_HINT}"
        if not allow_cpu_fallback:
            raise ProviderFallback(message)
        log.warning(
            "falling back, as allowed: %s",
            message,
            extra={"event": "provider_fallback", "requested": requested, "active": active},
        )
    return session


class Runner(Protocol):
    """A loaded model: numpy inputs by name in, numpy outputs by name out. Not thread-safe: one caller at a time."""

    providers: list[str]
    """What actually runs the model, e.g. ['CUDAExecutionProvider', 'CPUExecutionProvider'] or ['TensorRT 10.9.0']."""

    max_batch_size: int | None
    """The most rows one call accepts (an engine's or the TensorRT provider's optimisation profile), None when
    unbounded."""

    max_sequence: int | None
    """The longest sequence one call accepts (an engine's or the TensorRT provider's optimisation profile), None when
    unbounded."""

    input_names: list[str]
    output_names: list[str]

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output by name; `inputs` may hold more arrays than the model takes."""

    def close(self) -> None:
        """Release the session or the engine and its device memory; `infer` must not be called afterwards."""


class SessionRunner:
    """A `Runner` over an ONNX Runtime session; on the TensorRT provider with an optimisation profile, its limits are
    the profile's maximum (the session refuses a call beyond it), else None."""

    def __init__(self, session: ort.InferenceSession):
        self.session = session
        self.providers = session.get_providers()
        profile = Shapes.of_tensorrt_profile(session.get_provider_options().get(TENSORRT, {}))
        self.max_batch_size = None if profile is None else profile.max_batch
        self.max_sequence = None if profile is None else profile.max_sequence
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`Runner.infer`; `DeviceError` where the execution provider fails the call (never retried on the CPU)."""
        try:
            values = self.session.run(self.output_names, {name: inputs[name] for name in self.input_names})
        except (EPFail, Fail) as err:
            if isinstance(err, Fail) and not GPU_FAILURE.search(str(err)):
                raise
            raise DeviceError(f"{self.providers[0]} failed running the model: {err}") from err
        return dict(zip(self.output_names, values, strict=True))

    def close(self) -> None:
        del self.session


# --- TensorRT and CUDA ------------------------------------------------------------------------------------------


def _cudart():
    """cuda-python's CUDA runtime module (ImportError without cuda-python)."""
    try:
        from cuda.bindings import runtime  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart as runtime  # the older layout
    return runtime


class Cuda:
    """The CUDA runtime calls an engine needs (device buffers, copies, a stream), through cuda-python.

    The runtime API works on the device's primary context, the one TensorRT uses, made current in
    whichever thread calls it.
    """

    def __init__(self):
        self.rt = _cudart()

    def _check(self, result: tuple, call: str):
        """The values after the status of a cuda-python call, or `DeviceError` naming the call and the status."""
        status, *values = result
        if status != self.rt.cudaError_t.cudaSuccess:
            raise DeviceError(f"{call} failed with {getattr(status, 'name', status)}")
        return values[0] if len(values) == 1 else values

    def device_count(self) -> int:
        return int(self._check(self.rt.cudaGetDeviceCount(), "cudaGetDeviceCount"))

    def device_name(self, ordinal: int = 0) -> str:
        properties = self._check(self.rt.cudaGetDeviceProperties(ordinal), "cudaGetDeviceProperties")
        name = properties.name
        return (name.decode(errors="replace") if isinstance(name, bytes) else str(name)).rstrip("\x00")

    def driver_version(self) -> str:
        version = int(self._check(self.rt.cudaDriverGetVersion(), "cudaDriverGetVersion"))
        return f"{version // 1000}.{version % 1000 // 10}"

    def alloc(self, nbytes: int) -> int:
        return int(self._check(self.rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))

    def free(self, pointer: int) -> None:
        self._check(self.rt.cudaFree(pointer), "cudaFree")

    def to_device(self, pointer: int, array: np.ndarray, stream=None) -> None:
        """Copy a C-contiguous `array` to `pointer`; queued on `stream` when given (keep `array` alive until then)."""
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        if stream is None:
            self._check(self.rt.cudaMemcpy(pointer, array.ctypes.data, array.nbytes, kind), "cudaMemcpy")
        else:
            self._check(
                self.rt.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes, kind, stream), "cudaMemcpyAsync"
            )

    def to_host(self, array: np.ndarray, pointer: int, stream) -> None:
        """Queue a copy from `pointer` into `array` (C-contiguous, of the right size) on `stream`."""
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self.rt.cudaMemcpyAsync(array.ctypes.data, pointer, array.nbytes, kind, stream), "cudaMemcpyAsync")

    def stream(self):
        return self._check(self.rt.cudaStreamCreate(), "cudaStreamCreate")

    def synchronize(self, stream) -> None:
        self._check(self.rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def destroy_stream(self, stream) -> None:
        self._check(self.rt.cudaStreamDestroy(stream), "cudaStreamDestroy")


def _tensorrt_problem() -> tuple[str | None, str | None]:
    """(version, None) when a usable tensorrt imports, else (None, what is wrong)."""
    try:
        trt = importlib.import_module("tensorrt")
    except (ImportError, OSError) as err:  # OSError: the wheel is there but its CUDA libraries are not
        return None, f"the `tensorrt` Python package is not installed or does not import ({err})"
    version = getattr(trt, "__version__", "0")
    major = version.split(".")[0]
    if not major.isdigit() or int(major) < MIN_TENSORRT_MAJOR:
        return None, f"the `tensorrt` package is version {version}; this code needs TensorRT >= {MIN_TENSORRT_MAJOR}"
    return version, None


def _gpu_problem() -> tuple[dict[str, str], str | None]:
    """({"gpu", "cuda_driver"}, None) when CUDA sees a GPU through cuda-python, else ({}, what is wrong)."""
    try:
        cuda = Cuda()
    except ImportError as err:
        return {}, f"the `cuda-python` package (CUDA buffers for TensorRT) is not installed or does not import ({err})"
    try:
        if cuda.device_count() == 0:
            return {}, "no NVIDIA GPU: CUDA sees no device"
        return {"gpu": cuda.device_name(), "cuda_driver": cuda.driver_version()}, None
    except DeviceError as err:  # e.g. cudaErrorNoDevice, cudaErrorInsufficientDriver
        return {}, f"no usable NVIDIA GPU or driver: {err}"


def _probe() -> tuple[dict[str, str], list[str]]:
    version, package_problem = _tensorrt_problem()
    device, gpu_problem = _gpu_problem()
    return {"tensorrt": version, **device}, [p for p in (package_problem, gpu_problem) if p]


def tensorrt_problems() -> list[str]:
    """What keeps TensorRT from running here (no package, no cuda-python, no GPU), empty when nothing does."""
    return _probe()[1]


def require_tensorrt() -> dict[str, str]:
    """Check for TensorRT >= 10, cuda-python and a CUDA GPU; return their versions, or raise `TensorRTUnavailable`
    naming what is missing."""
    versions, problems = _probe()
    if problems:
        raise TensorRTUnavailable(
            "TensorRT engines need the tensorrt and cuda-python packages and an NVIDIA GPU; missing here:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + f"\n{GPU_HINT}"
        )
    return versions


def tensorrt_available() -> bool:
    """True when `require_tensorrt()` passes (what the TensorRT tests skip on)."""
    return not tensorrt_problems()


def tensorrt_logger(trt):
    """A `trt.ILogger` that forwards TensorRT's messages to `logging` and keeps the errors in `.errors`."""

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(msg)
                log.error("TensorRT: %s", msg)
            elif severity == trt.ILogger.Severity.WARNING:
                log.warning("TensorRT: %s", msg)
            else:
                log.debug("TensorRT: %s", msg)

    return Logger()


class EngineRunner:
    """A `Runner` over a TensorRT engine: deserialised once (from `plan`, the bytes of `plan_path` already read,
    where given), run on one CUDA stream with device buffers that grow (never shrink) with the batch. FP16 outputs
    come back as float32."""

    def __init__(self, plan_path: str | Path, plan: bytes | None = None):
        versions = require_tensorrt()
        import tensorrt as trt

        self.cuda = Cuda()
        self.logger = tensorrt_logger(trt)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(Path(plan_path).read_bytes() if plan is None else plan)
        if self.engine is None:
            raise ModelLoadError(
                f"TensorRT {versions['tensorrt']} cannot deserialise {plan_path} ({'; '.join(self.logger.errors)}): "
                "an engine only loads on the TensorRT version and GPU it was built for"
            )
        self.context = self.engine.create_execution_context()
        if self.context is None:  # TensorRT's answer where the GPU has no memory left for the context's
            errors = "; ".join(self.logger.errors) or "see the log above"
            del self.engine  # and its weights on the GPU
            raise DeviceError(f"TensorRT cannot make an execution context for {plan_path}: {errors}")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        highest = [self.engine.get_tensor_profile_shape(n, 0)[2] for n in self.input_names]  # (min, opt, max)[max]
        self.max_batch_size = min(int(shape[0]) for shape in highest)
        lengths = [int(shape[1]) for shape in highest if len(shape) > 1]
        self.max_sequence = min(lengths) if lengths else None
        self.providers = [f"TensorRT {versions['tensorrt']}"]
        try:
            self.stream = self.cuda.stream()
        except DeviceError:
            del self.context, self.engine  # and their memory on the GPU
            raise
        self._buffers: dict[str, tuple[int, int]] = {}

    def _buffer(self, name: str, nbytes: int) -> int:
        """A device buffer of at least `nbytes` for tensor `name`."""
        pointer, capacity = self._buffers.get(name, (0, 0))
        if capacity < nbytes:
            if pointer:  # forgotten before it is freed: a failed allocation next leaves no freed pointer to reuse
                self.cuda.free(self._buffers.pop(name)[0])
            pointer = self.cuda.alloc(nbytes)
            self._buffers[name] = (pointer, nbytes)
        return pointer

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise ValueError(f"the engine needs inputs {missing} too")
        host_inputs = []  # kept alive until the stream is synchronised
        for name in self.input_names:
            array = np.ascontiguousarray(inputs[name], dtype=self.dtypes[name])
            if not self.context.set_input_shape(name, array.shape):
                raise ValueError(f"input {name} of shape {array.shape} is outside the engine's optimisation profile")
            pointer = self._buffer(name, array.nbytes)
            self.cuda.to_device(pointer, array, self.stream)
            self.context.set_tensor_address(name, pointer)
            host_inputs.append(array)
        results = {}
        for name in self.output_names:
            result = np.empty(tuple(self.context.get_tensor_shape(name)), dtype=self.dtypes[name])
            self.context.set_tensor_address(name, self._buffer(name, result.nbytes))
            results[name] = result
        if not self.context.execute_async_v3(int(self.stream)):
            raise DeviceError("TensorRT execution failed: " + ("; ".join(self.logger.errors) or "see the log above"))
        for name, result in results.items():
            self.cuda.to_host(result, self._buffers[name][0], self.stream)
        self.cuda.synchronize(self.stream)
        return {
            name: value.astype(np.float32) if value.dtype == np.float16 else value for name, value in results.items()
        }

    def close(self) -> None:
        """`Runner.close`: each buffer freed once, the stream destroyed even where freeing one fails."""
        try:
            while self._buffers:
                self.cuda.free(self._buffers.popitem()[1][0])
        finally:
            self.cuda.destroy_stream(self.stream)
            del self.context, self.engine


# --- Opening a model or a bundle --------------------------------------------------------------------------------


def open_runner(
    model_path: str | Path,
    runtime: str,
    providers: list[str],
    *,
    model: bytes | None = None,
    threads: int | None = None,
    spin: bool = False,
    disabled_optimizers: list[str] | None = None,
    allow_cpu_fallback: bool = False,
    precision: str = "fp32",
    shapes: Shapes | None = None,
) -> Runner:
    """A `Runner` for `model_path` (from its bytes `model`, where given) on `runtime` ('onnxruntime' or 'tensorrt').

    The other keyword arguments and `providers` apply to ONNX Runtime (see `open_session`); an engine runs on
    the GPU or not at all (`TensorRTUnavailable`).
    """
    if runtime == "onnxruntime":
        return SessionRunner(
            open_session(
                model_path,
                providers,
                model=model,
                threads=threads,
                spin=spin,
                disabled_optimizers=disabled_optimizers,
                allow_cpu_fallback=allow_cpu_fallback,
                precision=precision,
                shapes=shapes,
            )
        )
    if runtime == "tensorrt":
        return EngineRunner(model_path, model)
    raise ValueError(f"unknown runtime {runtime!r}; known: {', '.join(MODEL_FILES)}")


def _io_mismatch(runner: Runner, spec: BundleSpec, model_path: Path) -> str | None:
    """How the loaded model's inputs, outputs and profile disagree with the bundle spec, or None."""
    if set(runner.input_names) != set(spec.input_names):
        return (
            f"{model_path} takes inputs {sorted(runner.input_names)}, the bundle spec says {sorted(spec.input_names)}"
        )
    missing = [o.name for o in spec.outputs if o.name not in runner.output_names]
    if missing:
        return f"{model_path} has no output(s) {missing} named in the bundle spec"
    if runner.max_sequence is not None and runner.max_sequence < spec.max_length:
        return (
            f"{model_path}: the engine's profile allows sequences up to {runner.max_sequence} tokens, the bundle's "
            f"max_length is {spec.max_length}; rebuild the engine with a larger profile"
        )
    return None


def _rebuild_command(bundle: Bundle) -> str:
    """The command that builds `bundle` again, named by its manifest's stage (its folder may be a mount's, e.g.
    /models/bundle); for a cascade's member (`members/<id>`), the member's and then the cascade's, which copies it."""
    ids = [bundle.manifest.stage.removeprefix("bundle-")]
    if bundle.folder.parent.name == MEMBERS and is_cascade(cascade := bundle.folder.parent.parent):
        ids.append(mf.load(cascade, verify=False).stage.removeprefix("bundle-"))
    return "edgedistill bundles RECIPE" + "".join(f" --only {bundle_id}" for bundle_id in ids)


def open_bundle(
    bundle: Bundle,
    providers: list[str] | None = None,
    *,
    model: bytes | None = None,
    threads: int | None = None,
    spin: bool = False,
    allow_cpu_fallback: bool = False,
    max_batch: int = ENGINE_BATCH[2],
) -> Runner:
    """A `Runner` for a loaded bundle (from `model`, its model file's verified bytes, where given: see
    `common.bundle.read_bundle`), on `providers` (empty or None: the bundle's), with the bundle's disabled
    optimizers, at its precision, for calls of up to `max_batch` rows and the bundle's max length; `ArtifactError`
    when the model's inputs, outputs or profile disagree with its spec, and `ModelLoadError` for an engine that does not
    load here naming the command that builds it again."""
    spec = bundle.spec
    try:
        runner = open_runner(
            bundle.model_path,
            spec.runtime,
            providers or spec.providers,
            model=model,
            threads=threads,
            spin=spin,
            disabled_optimizers=spec.disabled_optimizers,
            allow_cpu_fallback=allow_cpu_fallback,
            precision=spec.precision,
            shapes=Shapes(tuple(spec.input_names), max_batch, spec.max_length),
        )
    except ModelLoadError as err:
        if spec.runtime != "tensorrt":
            raise
        raise ModelLoadError(f"{err}; rebuild it on this machine (`{_rebuild_command(bundle)}`)") from err
    problem = _io_mismatch(runner, spec, bundle.model_path)
    if problem is not None:
        runner.close()
        raise ArtifactError(problem)
    return runner
