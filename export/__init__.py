"""Export: ONNX (fused, INT8/FP16), TensorRT engines, parity gates and bundles."""
