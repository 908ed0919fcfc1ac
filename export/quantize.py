"""Lower precision: dynamic or calibrated static INT8 for CPU, FP16 for GPU bundles."""

import contextlib
import io
import logging
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from edgedistill.export.onnx_export import ExportError
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
from onnxruntime.transformers.onnx_model import OnnxModel

CONTRIB_DOMAIN = "com.microsoft"  # ONNX Runtime's own operators, which its fusions put in a graph


# What ONNX Runtime says unasked of a graph whose bundle is right as it is (each bundle is gated against PyTorch on
# dev). Its quantizer advises its pre-processing (`quant_pre_process`: shape inference and graph optimisation) at each
# call: the bundles are quantized from the graph as exported (fused where the recipe says), `_typed` gives static INT8
# the shapes it needs, and on the default recipe's INT8 teacher the pre-processing changes nothing but 3 constants
# (docs/benchmarks.md). Its FP16 conversion's symbolic shape inference fails on a CNN or BiLSTM student exported at
# opset 18 or later, logs a request to file an issue and prints the failure: the conversion goes on without it.
ADVICE = ("pre-processing before quantization", "Failed to run symbolic shape inference", "failed in shape inference")
# The loggers it says it on: the quantizer's on the root logger, the FP16 conversion's on its model's own.
_ADVISING_LOGGERS = ("", "onnxruntime.transformers.onnx_model")


def _is_advice(message: str) -> bool:
    return any(phrase in message for phrase in ADVICE)


class _NoAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_advice(record.getMessage())


@contextlib.contextmanager
def _without_advice():
    """ONNX Runtime's `ADVICE` held back from its loggers and from what it prints; everything else passes."""
    advice, printed = _NoAdvice(), io.StringIO()
    for name in _ADVISING_LOGGERS:
        logging.getLogger(name).addFilter(advice)
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        for name in _ADVISING_LOGGERS:
            logging.getLogger(name).removeFilter(advice)
        if sys.stdout is not None:  # None where the process runs with its stdout closed: a print writes nothing
            sys.stdout.writelines(line for line in printed.getvalue().splitlines(keepends=True) if not _is_advice(line))


def _clear_value_info(src: Path, dst: Path) -> Path:
    """Shape annotations from the exporter can contradict the quantized graph; drop them."""
    model = onnx.load(str(src))
    del model.graph.value_info[:]
    onnx.save(model, str(dst))
    return dst


def _typed(src: Path, dst: Path) -> Path:
    """`src` as `_clear_value_info` leaves it, and where it holds ONNX Runtime's fused operators (Attention,
    SkipLayerNormalization, BiasGelu), typed by ONNX Runtime's symbolic shape inference: ONNX's own cannot type their
    outputs, and static INT8 leaves every tensor it cannot type unquantized, a fused graph's activations all. Other
    graphs keep ONNX's own inference, which types them (the symbolic one fails on a student's opset-18 ReduceMax)."""
    bare = onnx.load(str(_clear_value_info(src, dst)))  # inference adds its own annotations beside any kept
    if not any(node.domain == CONTRIB_DOMAIN for node in bare.graph.node):
        return dst
    try:  # in a scratch folder: the inference writes a file into the current one where it fails
        with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
            typed = SymbolicShapeInference.infer_shapes(bare, auto_merge=True)
    except Exception as err:  # it raises a bare Exception where it cannot type a tensor
        dst.unlink()
        raise ExportError(
            f"static INT8 cannot type the fused graph {src.name} ({err or type(err).__name__}): set fused: false "
            "on this bundle, or quantization: dynamic"
        ) from err
    onnx.save(typed, str(dst))
    return dst


def int8_dynamic(src: Path, dst: Path, per_channel: bool = False, op_types: list[str] | None = None) -> dict:
    """Weights INT8, activations quantized on the fly: `op_types` (default: every type ONNX Runtime quantizes,
    `common.config.export.DYNAMIC_INT8_OPS`). Returns what was applied, for the manifest."""
    tmp = _clear_value_info(src, dst.with_name(dst.stem + ".pre.onnx"))
    with _without_advice():
        quantize_dynamic(
            str(tmp),
            str(dst),
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            op_types_to_quantize=op_types,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    tmp.unlink()
    applied = {"mode": "dynamic", "weight_type": "QInt8", "activations": "uint8, scale per batch"}
    return applied | {
        "per_channel": per_channel,
        "weight_scales": weight_scales(dst),
        "op_types": op_types or "onnxruntime's default",
    }


def weight_scales(path: Path) -> dict[str, int]:
    """How many of a dynamic INT8 graph's weights have one scale and how many one per output channel: ONNX Runtime's
    dynamic Conv (ConvInteger) takes one whatever `per_channel` says, and an LSTM's weights take either per direction
    (their scales' first axis). Its weights' scales are its only `_scale` initializers (the activations' are computed
    as it runs)."""
    graph = onnx.load(str(path)).graph
    per_direction = {name for node in graph.node if node.op_type == "DynamicQuantizeLSTM" for name in node.input}
    sizes = [
        math.prod(t.dims[1:] if t.name in per_direction else t.dims)
        for t in graph.initializer
        if t.name.endswith("_scale")
    ]
    return {"per_tensor": sum(size == 1 for size in sizes), "per_channel": sum(size > 1 for size in sizes)}


class _Batches(CalibrationDataReader):
    def __init__(self, batches: list[dict[str, np.ndarray]]):
        self._batches = iter(batches)

    def get_next(self):
        return next(self._batches, None)


STATIC_OPS = ["MatMul", "Conv"]


def static_ops(arch: str) -> list[str]:
    """The operator types static INT8 quantizes in a graph of `arch`: GPT-2's projections (transformers' `Conv1D`)
    export as Gemm, which a BERT graph uses only for its small pooler and head."""
    return [*STATIC_OPS, "Gemm"] if arch == "gpt2" else STATIC_OPS


def int8_static(
    src: Path, dst: Path, calibration: list[dict[str, np.ndarray]], op_types: list[str] = STATIC_OPS
) -> dict:
    """Weights and activations INT8 (QDQ), activation ranges calibrated (min-max) on real inputs; weights per
    channel. Returns what was applied, for the manifest: with how many activation tensors were quantized.

    Only the large MatMuls and convolutions (`op_types`, see `static_ops`) are quantized: a BERT's classifier
    head is tiny, and its bias cannot be given an INT32 scale when its input is a gathered [CLS] state.
    """
    tmp = _typed(src, dst.with_name(dst.stem + ".pre.onnx"))
    with _without_advice():
        quantize_static(
            str(tmp),
            str(dst),
            _Batches(calibration),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=op_types,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    tmp.unlink()
    activations = sum(node.op_type == "QuantizeLinear" for node in onnx.load(str(dst)).graph.node)
    applied = {"mode": "static", "format": "QDQ", "weight_type": "QInt8"}
    return (
        applied
        | {"activation_type": "QInt8" if activations else "none: weights only", "activations_quantized": activations}
        | {"calibration": "MinMax", "calibration_batches": len(calibration)}
        | {
            "per_channel": True,
            "op_types": op_types,
        }
    )


def int8_weights(path: Path) -> int:
    """How many of the graph's weights are INT8 or UINT8: 0 where the quantizer found nothing it quantizes."""
    quantized = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    return sum(t.data_type in quantized for t in onnx.load(str(path)).graph.initializer)


def fp16(src: Path, dst: Path) -> None:
    """FP16 weights and compute with FP32 inputs and outputs (for GPU execution providers)."""
    model = OnnxModel(onnx.load(str(src)))
    with _without_advice():
        model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(dst))
