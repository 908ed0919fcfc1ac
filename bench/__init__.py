"""Measurements of built bundles: `python -m bench models|serving|accuracy|cascade|peers RECIPE`.

`models` times every bundle beside the teacher in PyTorch eager (`bench.models`); `serving` drives the
server, the echo and bare servers of `bench.servers` with the drivers of `bench.drivers`
(`bench.serving`); `accuracy` sends the dev split through the server by both APIs (`bench.accuracy`);
`peers` compares the server with KServe's ModelServer and MLServer (`bench.peers`), driven by h2load
(`bench.h2load`).
Each writes an artifact folder with a manifest; `bench.texts` reads the texts they send. `bench.processes` starts and stops
server subprocesses, also for `loadtests`; `bench.stats` holds the statistics and result records,
`bench.slo` the verdicts on them.
"""


class BenchError(RuntimeError):
    """A benchmark could not measure: a server did not start or stop cleanly, no call succeeded, or no texts."""
