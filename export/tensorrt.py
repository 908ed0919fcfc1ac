"""ONNX -> TensorRT engine (`model.plan`) with one optimization profile over batch and sequence.

Needs the `tensorrt` package (>= 10) and an NVIDIA GPU with its driver; `require_tensorrt()` says
which is missing. FP16 keeps Softmax and normalization layers in FP32 (their reductions overflow
or lose precision in half). INT8 takes either calibration batches (TensorRT's implicit
quantization, with a min-max calibrator) or a model already quantized with Q/DQ nodes.

Device memory for calibration and for `run_engine` goes through the CUDA driver library
(`libcuda`, shipped with every NVIDIA driver) via ctypes, so no CUDA Python package is needed.
"""

import ctypes
import importlib
import logging
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import onnx

log = logging.getLogger(__name__)

MIN_TENSORRT_MAJOR = 10
LIBCUDA = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
INSTALL_HINT = (
    "Install on a machine with an NVIDIA GPU and driver: pip install '.[gpu]' (installs tensorrt and "
    "onnxruntime-gpu); uninstall onnxruntime first, since onnxruntime and onnxruntime-gpu must not be "
    "installed together."
)
# Layers whose FP16 versions lose accuracy: softmax and normalization reduce over a whole axis.
FP32_LAYER_TYPES = ("SOFTMAX", "NORMALIZATION", "REDUCE")
# A LayerNorm exported before opset 17 is ReduceMean/Sub/Pow/Sqrt/Div nodes named after the module.
LAYERNORM_NAME = re.compile(r"layer_?norm", re.IGNORECASE)
QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}


class TensorRTUnavailable(RuntimeError):
    """The tensorrt package or a usable NVIDIA GPU is missing; the message says which and how to fix it."""


class EngineBuildError(RuntimeError):
    """TensorRT could not parse the ONNX model or build an engine from it."""


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


class CudaDriver:
    """The few CUDA driver calls that calibration and `run_engine` need, through ctypes."""

    def __init__(self, ordinal: int = 0):
        self.lib = ctypes.CDLL(LIBCUDA)  # OSError when no driver is installed
        lib, c = self.lib, ctypes
        lib.cuGetErrorName.argtypes = [c.c_int, c.POINTER(c.c_char_p)]
        lib.cuDeviceGetName.argtypes = [c.c_char_p, c.c_int, c.c_int]
        lib.cuDevicePrimaryCtxRetain.argtypes = [c.POINTER(c.c_void_p), c.c_int]
        lib.cuCtxSetCurrent.argtypes = [c.c_void_p]
        lib.cuMemAlloc_v2.argtypes = [c.POINTER(c.c_uint64), c.c_size_t]
        lib.cuMemFree_v2.argtypes = [c.c_uint64]
        lib.cuMemcpyHtoD_v2.argtypes = [c.c_uint64, c.c_void_p, c.c_size_t]
        lib.cuMemcpyDtoH_v2.argtypes = [c.c_void_p, c.c_uint64, c.c_size_t]
        lib.cuStreamCreate.argtypes = [c.POINTER(c.c_void_p), c.c_uint]
        lib.cuStreamSynchronize.argtypes = [c.c_void_p]
        lib.cuStreamDestroy_v2.argtypes = [c.c_void_p]
        self._check(lib.cuInit(0), "cuInit")
        self.ordinal = ordinal

    def _check(self, result: int, call: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(name))
            raise CudaError(f"{call} failed with {name.value.decode() if name.value else result}")

    def device_count(self) -> int:
        count = ctypes.c_int()
        self._check(self.lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
        return count.value

    def device_name(self) -> str:
        name = ctypes.create_string_buffer(256)
        self._check(self.lib.cuDeviceGetName(name, len(name), self.ordinal), "cuDeviceGetName")
        return name.value.decode()

    def driver_version(self) -> str:
        version = ctypes.c_int()
        self._check(self.lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
        return f"{version.value // 1000}.{version.value % 1000 // 10}"

    def activate(self) -> None:
        """Make the device's primary context (the one the CUDA runtime and TensorRT use) current."""
        context = ctypes.c_void_p()
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), self.ordinal), "cuDevicePrimaryCtxRetain")
        self._check(self.lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    def alloc(self, nbytes: int) -> int:
        pointer = ctypes.c_uint64()
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(pointer), max(nbytes, 1)), "cuMemAlloc")
        return pointer.value

    def free(self, pointer: int) -> None:
        self._check(self.lib.cuMemFree_v2(pointer), "cuMemFree")

    def to_device(self, pointer: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        self._check(self.lib.cuMemcpyHtoD_v2(pointer, array.ctypes.data, array.nbytes), "cuMemcpyHtoD")

    def to_host(self, pointer: int, array: np.ndarray) -> None:
        """Copy into `array` (C-contiguous, already of the right size)."""
        self._check(self.lib.cuMemcpyDtoH_v2(array.ctypes.data, pointer, array.nbytes), "cuMemcpyDtoH")

    def stream(self) -> int:
        stream = ctypes.c_void_p()
        self._check(self.lib.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
        return stream.value or 0

    def synchronize(self, stream: int) -> None:
        self._check(self.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def destroy_stream(self, stream: int) -> None:
        self._check(self.lib.cuStreamDestroy_v2(stream), "cuStreamDestroy")


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
    """({"gpu", "cuda_driver"}, None) when the CUDA driver sees a GPU, else ({}, what is wrong)."""
    try:
        driver = CudaDriver()
        if driver.device_count() == 0:
            return {}, "no NVIDIA GPU: the CUDA driver sees no device"
        return {"gpu": driver.device_name(), "cuda_driver": driver.driver_version()}, None
    except OSError as err:
        return {}, f"no NVIDIA GPU driver: {LIBCUDA} could not be loaded ({err})"
    except CudaError as err:
        return {}, f"no usable NVIDIA GPU: {err}"


def _probe() -> tuple[dict[str, str], list[str]]:
    version, package_problem = _tensorrt_problem()
    device, gpu_problem = _gpu_problem()
    return {"tensorrt": version, **device}, [p for p in (package_problem, gpu_problem) if p]


def tensorrt_problems() -> list[str]:
    """What keeps TensorRT from running here (no package, no GPU), empty when nothing does."""
    return _probe()[1]


def require_tensorrt() -> dict[str, str]:
    """Check for TensorRT >= 10 and a CUDA GPU; return their versions, or raise `TensorRTUnavailable` naming what is missing."""
    versions, problems = _probe()
    if problems:
        raise TensorRTUnavailable(
            "TensorRT engines need the tensorrt package and an NVIDIA GPU; missing here:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + f"\n{INSTALL_HINT}"
        )
    return versions


def tensorrt_available() -> bool:
    """True when `require_tensorrt()` passes (for skipping GPU tests and choosing a runtime)."""
    return not tensorrt_problems()


def _check_range(axis: str, values: tuple[int, int, int]) -> None:
    low, opt, high = values
    if not 1 <= low <= opt <= high:
        raise ValueError(f"{axis} profile must satisfy 1 <= min <= opt <= max, got {values}")


def _inspect_onnx(onnx_path: Path, inputs: list[str]) -> bool:
    """Check the model's inputs are exactly `inputs`, each (batch, sequence); return whether it has Q/DQ nodes."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = {i.name: i for i in model.graph.input if i.name not in initializers}
    if set(graph_inputs) != set(inputs):
        raise ValueError(f"{onnx_path} has inputs {sorted(graph_inputs)}, the profile names {sorted(inputs)}")
    for name, value in graph_inputs.items():
        rank = len(value.type.tensor_type.shape.dim)
        if rank != 2:
            raise ValueError(f"{onnx_path}: input {name} has rank {rank}; the profile covers (batch, sequence) inputs")
    return any(node.op_type in QDQ_OPS for node in model.graph.node)


def calibration_batches(
    batches: list[dict[str, np.ndarray]], inputs: list[str], batch_size: int, sequence: int
) -> list[dict[str, np.ndarray]]:
    """Re-cut token-id batches of any shape into (batch_size, sequence) batches, as dynamic-shape calibration needs.

    TensorRT calibrates at the profile's opt shape. Rows are zero-padded (pad id 0, attention mask 0)
    or truncated to `sequence`; rows left over after the last full batch are dropped.
    """
    columns: dict[str, list[np.ndarray]] = {name: [] for name in inputs}
    for index, batch in enumerate(batches):
        missing = set(inputs) - set(batch)
        if missing:
            raise ValueError(f"calibration batch {index} lacks inputs {sorted(missing)}")
        for name in inputs:
            array = np.asarray(batch[name])
            if array.ndim != 2:
                raise ValueError(f"calibration batch {index}: {name} has shape {array.shape}, want (batch, sequence)")
            fitted = np.zeros((array.shape[0], sequence), dtype=np.int64)
            width = min(sequence, array.shape[1])
            fitted[:, :width] = array[:, :width]
            columns[name].append(fitted)
    rows = {
        name: np.concatenate(parts) if parts else np.zeros((0, sequence), np.int64) for name, parts in columns.items()
    }
    total = len(next(iter(rows.values())))
    if total < batch_size:
        raise ValueError(f"{total} calibration rows, fewer than one batch of the profile's opt batch size {batch_size}")
    return [
        {name: rows[name][start : start + batch_size] for name in inputs}
        for start in range(0, total - batch_size + 1, batch_size)
    ]


def _logger(trt):
    class Logger(trt.ILogger):
        """Forwards TensorRT messages to `logging` and keeps the errors for the exception message."""

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


def _calibrator(trt, driver: CudaDriver, batches: list[dict[str, np.ndarray]], dtypes: dict[str, np.dtype]):
    # Min-max rather than entropy: TensorRT recommends it for NLP, where clipping activation outliers hurts.
    class TokenCalibrator(trt.IInt8MinMaxCalibrator):
        """Feeds fixed-shape token-id batches to the builder from one device buffer per input."""

        def __init__(self):
            trt.IInt8MinMaxCalibrator.__init__(self)
            self.position = 0
            first = batches[0]
            self.buffers = {name: driver.alloc(first[name].astype(dtypes[name]).nbytes) for name in first}

        def get_batch_size(self):
            return len(next(iter(batches[0].values())))

        def get_batch(self, names):
            if self.position == len(batches):
                return None
            batch = batches[self.position]
            self.position += 1
            for name in names:
                driver.to_device(self.buffers[name], batch[name].astype(dtypes[name]))
            return [self.buffers[name] for name in names]

        def read_calibration_cache(self):
            return None

        def write_calibration_cache(self, cache):
            return None

        def close(self):
            for pointer in self.buffers.values():
                driver.free(pointer)
            self.buffers = {}

    return TokenCalibrator()


def _keep_fp32(trt, network) -> list[str]:
    """Pin softmax, normalization and LayerNorm-pattern layers to FP32; return their names."""
    pinned_types = [getattr(trt.LayerType, name) for name in FP32_LAYER_TYPES if hasattr(trt.LayerType, name)]
    skipped_types = (trt.LayerType.CONSTANT, trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE)
    floats = (trt.float32, trt.float16)
    kept = []
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if layer.type in skipped_types:
            continue
        if layer.type not in pinned_types and not LAYERNORM_NAME.search(layer.name):
            continue
        float_outputs = [j for j in range(layer.num_outputs) if layer.get_output(j).dtype in floats]
        if not float_outputs:
            continue  # shape and index arithmetic inside the pattern
        layer.precision = trt.float32
        for j in float_outputs:
            layer.set_output_type(j, trt.float32)
        kept.append(layer.name)
    return kept


def _write_atomic(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def build_engine(
    onnx_path: str | Path,
    plan_path: str | Path,
    inputs: list[str],
    batch: tuple[int, int, int] = (1, 8, 64),
    sequence: tuple[int, int, int] = (1, 64, 128),
    fp16: bool = True,
    int8: bool = False,
    calibration: list[dict[str, np.ndarray]] | None = None,
    workspace_gb: float = 2.0,
) -> dict:
    """Build `plan_path` from `onnx_path` for inputs of shape (batch, sequence) within (min, opt, max); return build info.

    INT8 needs either `calibration` (token-id batches keyed by input name, re-cut to the opt shape)
    or a model with Q/DQ nodes, never both. The returned dict is meant for the manifest.
    """
    onnx_path, plan_path = Path(onnx_path), Path(plan_path)
    _check_range("batch", batch)
    _check_range("sequence", sequence)
    quantized = _inspect_onnx(onnx_path, inputs)
    if quantized and not int8:
        raise ValueError(f"{onnx_path} has Q/DQ nodes; build it with int8=True")
    if calibration is not None and not int8:
        raise ValueError("calibration batches are only used with int8=True")
    if int8 and quantized and calibration is not None:
        raise ValueError(f"{onnx_path} is already quantized (Q/DQ nodes); drop the calibration batches")
    if int8 and not quantized and calibration is None:
        raise ValueError(
            f"INT8 for {onnx_path} needs calibration batches, or a model quantized with Q/DQ nodes (static QDQ quantization)"
        )
    batches = calibration_batches(calibration, inputs, batch[1], sequence[1]) if calibration is not None else None
    versions = require_tensorrt()
    import tensorrt as trt

    start = time.perf_counter()
    logger = _logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)] or logger.errors
        raise EngineBuildError(f"TensorRT could not parse {onnx_path}:\n" + "\n".join(f"  {e}" for e in errors))

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * 2**30))
    profile = builder.create_optimization_profile()
    shapes = {}
    for name in inputs:
        low, opt, high = zip(batch, sequence, strict=True)
        profile.set_shape(name, low, opt, high)
        shapes[name] = {"min": list(low), "opt": list(opt), "max": list(high)}
    config.add_optimization_profile(profile)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    calibrator = None
    if int8:
        config.set_flag(trt.BuilderFlag.INT8)
        if batches is not None:
            driver = CudaDriver()
            driver.activate()
            dtypes = {}
            for i in range(network.num_inputs):
                tensor = network.get_input(i)
                dtypes[tensor.name] = np.dtype(trt.nptype(tensor.dtype))
            calibrator = _calibrator(trt, driver, batches, dtypes)
            config.int8_calibrator = calibrator
            config.set_calibration_profile(profile)
    fp32_layers = _keep_fp32(trt, network) if fp16 or int8 else []
    if fp32_layers:
        config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)

    try:
        serialized = builder.build_serialized_network(network, config)
    finally:
        if calibrator is not None:
            calibrator.close()
    if serialized is None:
        detail = "\n".join(f"  {e}" for e in logger.errors) or "  (no error message from TensorRT)"
        raise EngineBuildError(f"TensorRT failed to build an engine from {onnx_path}:\n{detail}")
    _write_atomic(plan_path, serialized)
    return {
        **versions,
        "precision": {
            "fp16": fp16,
            "int8": int8,
            "int8_mode": ("qdq" if quantized else "calibrated") if int8 else None,
            "obey_precision_constraints": bool(fp32_layers),
        },
        "profile": shapes,
        "fp32_layers": fp32_layers,
        "calibration_batches": len(batches) if batches else 0,
        "workspace_gb": workspace_gb,
        "plan_bytes": plan_path.stat().st_size,
        "build_seconds": round(time.perf_counter() - start, 2),
    }


def run_engine(plan_path: str | Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a plan once on the GPU: numpy inputs by name in, numpy outputs by name out (for parity checks)."""
    require_tensorrt()
    import tensorrt as trt

    driver = CudaDriver()
    driver.activate()
    logger = _logger(trt)
    engine = trt.Runtime(logger).deserialize_cuda_engine(Path(plan_path).read_bytes())
    if engine is None:
        raise EngineBuildError(f"TensorRT could not load {plan_path}: " + "; ".join(logger.errors))
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    missing = set(input_names) - set(feeds)
    if missing:
        raise ValueError(f"{plan_path} needs inputs {sorted(missing)} too")
    pointers: list[int] = []
    outputs: dict[str, tuple[int, np.ndarray]] = {}
    stream = driver.stream()
    try:
        for name in input_names:
            array = np.ascontiguousarray(feeds[name], dtype=trt.nptype(engine.get_tensor_dtype(name)))
            if not context.set_input_shape(name, array.shape):
                raise ValueError(f"{plan_path}: input {name} shape {array.shape} is outside the engine's profile")
            pointers.append(driver.alloc(array.nbytes))
            driver.to_device(pointers[-1], array)
            context.set_tensor_address(name, pointers[-1])
        for name in names:
            if name in input_names:
                continue
            array = np.empty(tuple(context.get_tensor_shape(name)), dtype=trt.nptype(engine.get_tensor_dtype(name)))
            pointers.append(driver.alloc(array.nbytes))
            context.set_tensor_address(name, pointers[-1])
            outputs[name] = (pointers[-1], array)
        if not context.execute_async_v3(stream):
            raise EngineBuildError(f"TensorRT failed to run {plan_path}: " + "; ".join(logger.errors))
        driver.synchronize(stream)
        for pointer, array in outputs.values():
            driver.to_host(pointer, array)
    finally:
        for pointer in pointers:
            driver.free(pointer)
        driver.destroy_stream(stream)
    return {name: array for name, (_, array) in outputs.items()}
