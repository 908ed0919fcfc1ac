"""Servers under h2load, set up as the peer comparison and the scaling benchmark both do: the call they are sent,
each server started, probed, checked and warmed, until the measurement ends, and the loads of its phases."""

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from edgedistill.bench import h2load
from edgedistill.bench.calls import ABSENT_MODEL, check_reply, infer_request, median_example
from edgedistill.bench.peers.launch import Server, all_serving
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.bench.processes import serving
from edgedistill.bench.texts import load_texts
from edgedistill.common.bundle import BundleSpec
from edgedistill.common.config.measure import H2loadBenchConfig
from edgedistill.common.config.training import DataConfig

CAPACITY, PACED = PHASES = ("capacity", "paced")  # each server's phases: saturated, and paced at the recipe's rate


@dataclass(frozen=True)
class Example:
    """The call every server is sent: the example of median length among the dev examples the serving benchmark
    samples (`load_texts`: 512, shuffled; `text`, and its `pair` for a pair model), and the `logits` the bundle
    `spec` gives it, which a reply must carry."""

    text: str
    pair: str | None
    logits: np.ndarray
    spec: BundleSpec

    @classmethod
    def of(cls, data: DataConfig, bundle: Path, threads: int) -> "Example":
        """The example of `data`'s dev split for `bundle`, run here with `threads` intra-op threads; `BenchError`
        when h2load is missing."""
        h2load.executable()
        model = BundleClassifier(bundle, threads)
        text, pair = median_example(load_texts(data, model.spec.pairs, None, None))
        return cls(text, pair, model.logits([text], None if pair is None else [pair]), model.spec)


def started(
    stack: ExitStack,
    server: Server,
    name: str,
    files: tuple[Path, Path],
    example: Example,
    loads: dict[str, h2load.Load],
    warm: h2load.Load,
    work: Path,
) -> h2load.Target:
    """`server` started (`files`: its log, and the framed request h2load sends it) and ready, every worker serving
    (`all_serving`), stopped when `stack` closes; its reply to `example` probed and checked (any logits from the echo
    server), its replies and failures sized, and loaded with `warm` unless that lasts no time: the h2load target of
    the phases `loads`."""
    log, request = files
    ready = all_serving(log, server.model)
    process = stack.enter_context(serving(server.command, server.port, log, ready, server.clean_exit))
    body = infer_request(server.model, example.text, example.pair)
    reply = h2load.probe(server.port, body)
    check_reply(name, reply, None if server.name == "echo" else example.logits)
    request.write_bytes(h2load.frame(body))
    replies = h2load.Replies.measure(server.port, reply, infer_request(ABSENT_MODEL, example.text, example.pair), work)
    if warm.duration_s:
        h2load.run(server.port, request, replies, warm, work / "h2load.log", None)
    return h2load.Target(server.port, request, replies, process, loads)


def phases(cfg: H2loadBenchConfig, capacity: h2load.Load) -> dict[str, h2load.Load]:
    """The load of each of PHASES on a server: `capacity`, and `cfg.rate` calls/s over `cfg.paced_connections`, one
    h2load per connection, started 1/rate s apart, so that the calls spread evenly over time and over the workers."""
    paced = h2load.Load(cfg.paced_connections, cfg.streams, cfg.duration_s, cfg.rate, 1, cfg.paced_connections)
    return {CAPACITY: capacity, PACED: paced}
