"""Measurements of built bundles: `python -m bench models RECIPE` and `python -m bench serving RECIPE`.

`models` times every bundle beside the teacher in PyTorch eager (`bench.models`); `serving` drives the
server, the echo and bare servers of `bench.servers` with the drivers of `bench.drivers`
(`bench.serving`). Both write an artifact folder with a manifest. `bench.processes` starts and stops
server subprocesses, also for `loadtests`; `bench.stats` holds the statistics and result records,
`bench.slo` the verdicts on them.
"""


class BenchError(RuntimeError):
    """A benchmark could not measure: a server did not start or stop cleanly, no call succeeded, or no texts."""
