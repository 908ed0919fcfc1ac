"""ONNX -> TensorRT engine (`model.plan`) with one optimization profile over batch and sequence.

Needs the `tensorrt` (>= 10) and `cuda-python` packages and an NVIDIA GPU with its driver;
`common.runtime.require_tensorrt()` says which is missing, and `common.runtime.open_runner` loads and
runs the engine. FP16 keeps Softmax and normalization layers in FP32 (their reductions overflow or
lose precision in half). INT8 takes calibration batches (TensorRT's implicit quantization, with a
min-max calibrator whose device buffers come from `common.runtime.Cuda`).
"""

import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from edgedistill.common.atomic import atomic_write
from edgedistill.common.bundle import pad_value
from edgedistill.common.config.export import ENGINE_BATCH
from edgedistill.common.runtime import Cuda, require_tensorrt, tensorrt_logger

# Layers whose FP16 versions lose accuracy: softmax and normalization reduce over a whole axis.
FP32_LAYER_TYPES = ("SOFTMAX", "NORMALIZATION", "REDUCE")
# A LayerNorm exported before opset 17 is ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div nodes in its module's scope.
LAYERNORM_OPS = {"ReduceMean", "Sqrt"}


class EngineBuildError(RuntimeError):
    """TensorRT could not parse the ONNX model or build an engine from it, or had too few sentences to calibrate."""


def _check_range(axis: str, values: tuple[int, int, int]) -> None:
    low, opt, high = values
    if not 1 <= low <= opt <= high:
        raise ValueError(f"{axis} profile must satisfy 1 <= min <= opt <= max, got {values}")


def _check_inputs(onnx_path: Path, graph: onnx.GraphProto, inputs: list[str]) -> None:
    """Check the model's inputs are exactly `inputs`, each (batch, sequence)."""
    initializers = {init.name for init in graph.initializer}
    graph_inputs = {i.name: i for i in graph.input if i.name not in initializers}
    if set(graph_inputs) != set(inputs):
        raise ValueError(f"{onnx_path} has inputs {sorted(graph_inputs)}, the profile names {sorted(inputs)}")
    for name, value in graph_inputs.items():
        rank = len(value.type.tensor_type.shape.dim)
        if rank != 2:
            raise ValueError(f"{onnx_path}: input {name} has rank {rank}; the profile covers (batch, sequence) inputs")


def calibration_batches(
    batches: list[dict[str, np.ndarray]],
    inputs: list[str],
    batch: tuple[int, int, int],
    sequence: tuple[int, int, int],
    pad_id: int = 0,
) -> list[dict[str, np.ndarray]]:
    """Re-cut token-id batches of any shape into the one shape TensorRT calibrates at: the `batch` profile's opt
    batch of rows as long as the longest, within the `sequence` profile's max, so that no row loses its tail.

    Rows are padded on the right (`common.bundle.pad_value`, `input_ids` with `pad_id`) to that length, and one
    longer than the profile's max is cut to it. TensorRT calibrates on full batches: the last one is filled with the
    first rows again, so that every row given calibrates.
    """
    fed = []
    for index, given in enumerate(batches):
        missing = set(inputs) - set(given)
        if missing:
            raise ValueError(f"calibration batch {index} lacks inputs {sorted(missing)}")
        arrays = {name: np.asarray(given[name]) for name in inputs}
        for name, array in arrays.items():
            if array.ndim != 2:
                raise ValueError(f"calibration batch {index}: {name} has shape {array.shape}, want (batch, sequence)")
        fed.append(arrays)
    length = min(sequence[2], max((arrays[inputs[0]].shape[1] for arrays in fed), default=1))
    columns: dict[str, list[np.ndarray]] = {name: [] for name in inputs}
    for arrays in fed:
        for name, array in arrays.items():
            fitted = np.full((array.shape[0], length), pad_value(name, pad_id), dtype=np.int64)
            width = min(length, array.shape[1])
            fitted[:, :width] = array[:, :width]
            columns[name].append(fitted)
    rows = {
        name: np.concatenate(parts) if parts else np.zeros((0, length), np.int64) for name, parts in columns.items()
    }
    total, batch_size = len(next(iter(rows.values()))), batch[1]
    if total < batch_size:
        raise EngineBuildError(
            f"{total} calibration sentences, fewer than one batch of the profile's opt batch size {batch_size}: "
            f"TensorRT INT8 calibrates on full batches, so the transfer set needs at least {batch_size} texts"
        )
    order = np.arange(-(-total // batch_size) * batch_size) % total  # the rows, then the first again to a full batch
    return [
        {name: rows[name][order[start : start + batch_size]] for name in inputs}
        for start in range(0, len(order), batch_size)
    ]


def _calibration_profile(builder, batch: dict[str, np.ndarray]):
    """A profile of `batch`'s one shape: TensorRT calibrates at its calibration profile's opt shape, and the
    engine's opt length would cut longer rows."""
    profile = builder.create_optimization_profile()
    for name, array in batch.items():
        profile.set_shape(name, array.shape, array.shape, array.shape)
    return profile


def _calibrator(trt, cuda: Cuda, batches: list[dict[str, np.ndarray]], dtypes: dict[str, np.dtype]):
    # Min-max rather than entropy: TensorRT recommends it for NLP, where clipping activation outliers hurts.
    class TokenCalibrator(trt.IInt8MinMaxCalibrator):
        """Feeds fixed-shape token-id batches to the builder from one device buffer per input."""

        def __init__(self):
            trt.IInt8MinMaxCalibrator.__init__(self)
            self.position = 0
            first = batches[0]
            self.buffers = {name: cuda.alloc(first[name].astype(dtypes[name]).nbytes) for name in first}

        def get_batch_size(self):
            return len(next(iter(batches[0].values())))

        def get_batch(self, names):
            if self.position == len(batches):
                return None
            batch = batches[self.position]
            self.position += 1
            for name in names:
                cuda.to_device(self.buffers[name], np.ascontiguousarray(batch[name], dtype=dtypes[name]))
            return [self.buffers[name] for name in names]

        def read_calibration_cache(self):
            return None

        def write_calibration_cache(self, cache):
            return None

        def close(self):
            for pointer in self.buffers.values():
                cuda.free(pointer)
            self.buffers = {}

    return TokenCalibrator()


def scope(name: str) -> str:
    """A node's module scope: its name up to the last `/` (torch names a node `/<module path>/<op>`)."""
    return name.rpartition("/")[0]


def layernorm_scopes(graph: onnx.GraphProto) -> set[str]:
    """The scopes of LayerNorms decomposed into ONNX operators: those holding a ReduceMean and a Sqrt.

    Found by structure, not by module name (GPT-2 names its LayerNorms `ln_1`, `ln_2`, `ln_f`). TensorRT's ONNX
    parser names each layer after its node, so a layer of one of these scopes belongs to a LayerNorm.
    """
    ops = defaultdict(set)
    for node in graph.node:
        ops[scope(node.name)].add(node.op_type)
    return {name for name, kinds in ops.items() if name and kinds >= LAYERNORM_OPS}


def _keep_fp32(trt, network, layernorms: set[str]) -> list[str]:
    """Pin softmax, normalization and the layers of the `layernorms` scopes to FP32; return their names."""
    pinned_types = [getattr(trt.LayerType, name) for name in FP32_LAYER_TYPES if hasattr(trt.LayerType, name)]
    floats = (trt.float32, trt.float16)
    kept = []
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if layer.type == trt.LayerType.CONSTANT:
            continue
        if layer.type not in pinned_types and scope(layer.name) not in layernorms:
            continue
        float_outputs = [j for j in range(layer.num_outputs) if layer.get_output(j).dtype in floats]
        if not float_outputs:
            continue  # shape and index arithmetic inside the pattern
        layer.precision = trt.float32
        for j in float_outputs:
            layer.set_output_type(j, trt.float32)
        kept.append(layer.name)
    return kept


def build_engine(
    onnx_path: str | Path,
    plan_path: str | Path,
    inputs: list[str],
    batch: tuple[int, int, int] = ENGINE_BATCH,
    sequence: tuple[int, int, int] = (1, 64, 128),
    fp16: bool = True,
    int8: bool = False,
    calibration: list[dict[str, np.ndarray]] | None = None,
    pad_id: int = 0,
    workspace_gb: float = 2.0,
) -> dict:
    """Build `plan_path` from `onnx_path` for inputs of shape (batch, sequence) within (min, opt, max); return build info.

    INT8 needs `calibration` (token-id batches keyed by input name, re-cut by `calibration_batches`); `pad_id` pads
    their token ids. The returned dict is meant for the manifest.
    """
    onnx_path, plan_path = Path(onnx_path), Path(plan_path)
    _check_range("batch", batch)
    _check_range("sequence", sequence)
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    _check_inputs(onnx_path, graph, inputs)
    if calibration is not None and not int8:
        raise ValueError("calibration batches are only used with int8=True")
    if int8 and calibration is None:
        raise ValueError(f"INT8 for {onnx_path} needs calibration batches")
    batches = calibration_batches(calibration, inputs, batch, sequence, pad_id) if int8 else None
    versions = require_tensorrt()
    import tensorrt as trt

    start = time.perf_counter()
    logger = tensorrt_logger(trt)
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
    elif not int8:  # TensorRT computes fp32 MatMuls in TF32 on Ampere and later unless told not to
        config.clear_flag(trt.BuilderFlag.TF32)
    calibrator = None
    if int8:
        config.set_flag(trt.BuilderFlag.INT8)
        dtypes = {}
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            dtypes[tensor.name] = np.dtype(trt.nptype(tensor.dtype))
        if not config.set_calibration_profile(_calibration_profile(builder, batches[0])):
            raise EngineBuildError(f"TensorRT refused a calibration profile of shape {batches[0][inputs[0]].shape}")
        calibrator = _calibrator(trt, Cuda(), batches, dtypes)
        config.int8_calibrator = calibrator
    fp32_layers = _keep_fp32(trt, network, layernorm_scopes(graph)) if fp16 or int8 else []
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
    atomic_write(plan_path, lambda tmp: tmp.write_bytes(serialized))
    return {
        **versions,
        "precision": {
            "fp16": fp16,
            "int8": int8,
            "tf32": fp16 or int8,
            "obey_precision_constraints": bool(fp32_layers),
        },
        "profile": shapes,
        "fp32_layers": fp32_layers,
        "calibration_batches": len(batches) if batches else 0,
        "calibration_shape": list(batches[0][inputs[0]].shape) if batches else None,
        "workspace_gb": workspace_gb,
        "plan_bytes": plan_path.stat().st_size,
        "build_seconds": round(time.perf_counter() - start, 2),
    }
