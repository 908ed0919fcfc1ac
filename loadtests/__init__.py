"""Locust load tests of the gRPC server: `python -m loadtests RECIPE --profile NAME`.

Only `grpc_user`, `pacing`, `shapes` and `locustfile` import locust (which monkey-patches the process with
gevent on import); the runner and the analysis run in plain processes. The server process, the
call statistics and the SLO verdicts are those of `bench` (`bench.processes`, `bench.stats`, `bench.slo`).
"""

from edgedistill.common.grpc_core import quiet_when_run_as_module

quiet_when_run_as_module()  # `python -m loadtests` in a checkout, which imports gRPC before the root
