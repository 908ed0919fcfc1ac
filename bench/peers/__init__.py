"""The Python model servers a user might pick instead of edgedistill's, serving a bundle as ours does.

`model.BundleClassifier` is the model every peer serves: the bundle verified and loaded as the
server loads it, its tokenizer and its ONNX Runtime session, with nothing of the server around it.
`kserve_server` runs it under KServe's `ModelServer` and `mlserver_runtime` under Seldon MLServer;
each runs in that framework's own environment (`make peers-setup`), never in the project's.
"""
