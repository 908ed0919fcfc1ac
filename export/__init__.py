"""Export: ONNX (fused, INT8/FP16), TensorRT engines, parity gates, bundles and the benchmark."""
