"""The gRPC server: `edgedistill.v1.Classifier` and the KServe v2 protocol over one bundle.

Layers: `transport` (gRPC servicers), `batching` (dynamic batcher), `backends` (ONNX Runtime,
TensorRT); `model` ties a bundle to them, `app` runs it. Imports neither torch nor transformers.
"""
