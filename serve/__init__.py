"""The gRPC server: `edgedistill.v1.Classifier` and the KServe v2 protocol over one bundle.

Layers: `transport` (gRPC servicers; `wire` checks a request's bytes before they are parsed), `batching`
(dynamic batcher, with the backend's cost model in `costmodel`), `backend` (the bundle opened by
`common.runtime`); `host` ties a bundle to them, `app` runs it; `healthcheck` is a container's probe of it. Imports
neither torch nor transformers.
"""

from edgedistill.common.grpc_core import quiet_when_run_as_module

quiet_when_run_as_module()  # `python -m serve.<module>` in a checkout, whose module imports gRPC before the root
