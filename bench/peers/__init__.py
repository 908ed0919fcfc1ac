"""The peer comparison (`python -m bench peers`): the server against the Python model servers a user might
pick instead, serving the same bundle.

`model.BundleClassifier` is the model every peer serves: the bundle verified and loaded as the server
loads it, its tokenizer and its ONNX Runtime session, with nothing of the server around it.
`kserve_server` runs it under KServe's `ModelServer` and `mlserver_runtime` under Seldon MLServer, each
in that framework's own environment (`make peers-setup`), never in the project's. `launch` starts every
server of the comparison; `compare` is the stage that measures them with `bench.h2load`.
"""
