"""Lower precision: dynamic or calibrated static INT8 for CPU, FP16 for GPU bundles."""

from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.transformers.onnx_model import OnnxModel


def _clear_value_info(src: Path, dst: Path) -> Path:
    """Shape annotations from the exporter can contradict the quantized graph; drop them."""
    model = onnx.load(str(src))
    del model.graph.value_info[:]
    onnx.save(model, str(dst))
    return dst


def int8_dynamic(src: Path, dst: Path, per_channel: bool = False, op_types: list[str] | None = None) -> None:
    """Weights INT8, activations quantized on the fly: `op_types` (default: MatMul, Gemm, LSTM, Attention, Conv...)."""
    tmp = _clear_value_info(src, dst.with_name(dst.stem + ".pre.onnx"))
    quantize_dynamic(
        str(tmp),
        str(dst),
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
        op_types_to_quantize=op_types,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    tmp.unlink()


class _Batches(CalibrationDataReader):
    def __init__(self, batches: list[dict[str, np.ndarray]]):
        self._batches = iter(batches)

    def get_next(self):
        return next(self._batches, None)


def int8_static(src: Path, dst: Path, calibration: list[dict[str, np.ndarray]]) -> None:
    """Weights and activations INT8 (QDQ), activation ranges calibrated on real inputs.

    Only the large MatMuls and convolutions are quantized: the classifier head is tiny, and its
    bias cannot be given an INT32 scale when its input is a gathered [CLS] state.
    """
    tmp = _clear_value_info(src, dst.with_name(dst.stem + ".pre.onnx"))
    quantize_static(
        str(tmp),
        str(dst),
        _Batches(calibration),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul", "Conv"],
        per_channel=True,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    tmp.unlink()


def fp16(src: Path, dst: Path) -> None:
    """FP16 weights and compute with FP32 inputs and outputs (for GPU execution providers)."""
    model = OnnxModel(onnx.load(str(src)))
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(dst))
