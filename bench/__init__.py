"""Measurements of built bundles: `python -m bench models|serving|accuracy|cascade|peers|scaling RECIPE`.

`models` times every bundle beside the teacher in PyTorch eager (`bench.models`); `serving` drives the
server, the echo and bare servers of `bench.servers` with the drivers of `bench.drivers`
(`bench.serving`); `accuracy` sends the dev split through the server by both APIs (`bench.accuracy`);
`cascade` measures a cascade against its last member served alone (`bench.cascade`); `peers` compares the
server with KServe's ModelServer and MLServer (`bench.peers`) and `scaling` the server with 1, 2, ... worker
processes (`bench.scaling`), both driven by h2load (`bench.h2load`) with the call of `bench.calls`.
Each writes an artifact folder with a manifest; `bench.texts` reads the texts they send. `bench.processes` starts and
stops server subprocesses, also for `loadtests`, with the flags, settings and environment of `bench.environ`, on
ports of `bench.ports`; `bench.stats` computes the call statistics, `bench.records` holds the result records (and
what they record of the machine), `bench.slo` the verdicts on them.
"""

from edgedistill.common.grpc_core import quiet_when_run_as_module

quiet_when_run_as_module()  # `python -m bench` in a checkout, which imports this package before the root


class BenchError(RuntimeError):
    """A benchmark could not measure: a server did not start or stop cleanly, no call succeeded, or no texts."""


BUNDLE_HELP = "bundle to serve (default: runs/<recipe>/bundle-<export.deploy>)"  # every command that serves one
