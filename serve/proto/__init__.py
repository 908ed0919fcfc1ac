"""Protocol buffers of the two gRPC APIs; the `*_pb2*.py` modules are generated (`python -m serve.proto.generate`)."""
