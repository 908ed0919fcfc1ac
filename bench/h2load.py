"""gRPC load from nghttp2's `h2load`, a native HTTP/2 client, so the client does not eat the cores it measures.

h2load sends one prebuilt gRPC message (`frame`) over h2c for every request, paced (`--rps`) or as fast
as its streams allow, and writes each request's latency to a log. It counts HTTP statuses only, and a
gRPC error arrives as HTTP 200 with its status in the trailers (and no message, or an empty one, as the
server chooses). So replies are counted by size: a server answers the same request with a reply of the same
size (`probe` gives it) and fails every call alike (`failed_bytes` measures how, on a request it must refuse),
and the DATA bytes h2load received must be one such reply per successful call and one such failure per
other call; bytes that no count of replies explains are an error.

h2load counts the calls it sent (`started`) and those it finished (`done`); those still in flight when a `-D` run
ends are neither. Against a healthy server a saturated run ends with every stream busy (connections x streams calls)
and a paced one with about one call per connection, so they are recorded (`unanswered`), not counted as failures. A
call the server never answers holds its stream, and once all of a connection's streams wait, the calls due on it are
never sent: missing, not unanswered (an echo server that never answered every 10th call answered about 70 of the 800
calls due at 200/s over 4 s, 8 unanswered: connections x streams, as a healthy saturated run ends). So a paced run
records the share of the calls due that succeeded (`rate_share`). A call due while its connection's streams are busy is sent once one
frees, and its latency is timed from that send, not from when it was due.
"""

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import numpy as np
import psutil
from edgedistill.bench import BenchError
from edgedistill.bench.drivers import rotated
from edgedistill.bench.processes import cpu_seconds, held, release
from edgedistill.bench.stats import percentiles, require_answered, summarize
from edgedistill.bench.tables import record_line
from edgedistill.common import progress
from edgedistill.serve.settings import DIRECT

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
HEADERS = ("content-type: application/grpc", "te: trailers")
SUMMARY = {  # figure -> pattern in h2load's summary
    "started": r"requests: \d+ total, (\d+) started",
    "done": r"requests: \d+ total, \d+ started, (\d+) done",
    "succeeded": r"(\d+) succeeded",
    "data_bytes": r"traffic: .*\((\d+)\) data",
}


def frame(message: bytes) -> bytes:
    """`message` as one uncompressed gRPC length-prefixed message."""
    return b"\0" + len(message).to_bytes(4, "big") + message


def probe(port: int, body: bytes, method: str = MODEL_INFER, timeout: float = 10.0) -> bytes:
    """The serialized reply of one call of `method` on loopback `port` with the serialized request `body`;
    `BenchError` naming the status when the call fails."""
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=DIRECT) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            return call(body, timeout=timeout)
        except grpc.RpcError as err:
            raise BenchError(f"{method} on port {port} failed: {err.code().name}: {err.details()}") from None


def executable() -> str:
    """The h2load program; `BenchError` naming the package when it is missing."""
    if (found := shutil.which("h2load")) is None:
        raise BenchError("h2load not found: install Debian's nghttp2-client (`make setup-system`)")
    return found


def version() -> str:
    """h2load's version, as it prints it (e.g. `nghttp2/1.52.0`)."""
    done = subprocess.run([executable(), "--version"], capture_output=True, text=True, check=True)
    return done.stdout.split()[-1]


@dataclass(frozen=True)
class Load:
    """What h2load sends: `connections` x `streams` calls in flight at most, for `duration_s`, at `rate`
    calls/s over all connections (None: as fast as the streams allow), from `threads` client threads.

    One h2load paces each connection on its own timer, all started together, so its connections send their paced
    calls in bursts. `clients` splits the load over that many h2load processes (the connections and the rate
    shared out evenly), started 1/`rate` s apart, so that their calls interleave instead."""

    connections: int
    streams: int
    duration_s: float
    rate: float | None = None
    threads: int = 1
    clients: int = 1

    def __post_init__(self):
        if self.connections % self.clients:
            raise BenchError(f"{self.connections} connections do not split evenly over {self.clients} h2load clients")

    def part(self) -> "Load":
        """What each of the `clients` processes sends."""
        rate = None if self.rate is None else self.rate / self.clients
        return replace(self, connections=self.connections // self.clients, rate=rate, clients=1)

    def flags(self) -> list[str]:
        """The flags of one h2load process sending this load (after `part` when `clients` is above 1)."""
        flags = [
            "-t",
            str(min(self.threads, self.connections)),  # h2load refuses more threads than connections
            "-c",
            str(self.connections),
            "-m",
            str(self.streams),
            "-D",
            f"{round(self.duration_s * 1000)}ms",
        ]
        if self.rate is not None:
            flags += ["--rps", f"{self.rate / self.connections:g}"]
        return flags


def command(port: int, request: Path, flags: list[str]) -> list[str]:
    """The h2load command line sending the framed `request` file to `ModelInfer` on loopback `port`, with `flags`."""
    line = [executable(), *flags, "-d", str(request)]
    for header in HEADERS:
        line += ["-H", header]
    return [*line, f"http://127.0.0.1:{port}{MODEL_INFER}"]


def summary_of(returncode: int, output: str) -> dict[str, int]:
    """`parse_summary` of a finished h2load's output; `BenchError` with its output's end when it failed."""
    if returncode != 0:
        raise BenchError(f"h2load exited with {returncode}: {output[-2000:]}")
    return parse_summary(output)


def parse_summary(text: str) -> dict[str, int]:
    """The request counts and DATA bytes of h2load's summary; `BenchError` when one is missing."""
    figures = {}
    for name, pattern in SUMMARY.items():
        if (match := re.search(pattern, text)) is None:
            raise BenchError(f"h2load printed no {name!r} figure; its output ends:\n{text[-2000:]}")
        figures[name] = int(match.group(1))
    return figures


def latencies_ms(log: Path) -> np.ndarray:
    """The latency (ms) of each request of h2load's log (start µs, HTTP status, µs to the end), any status."""
    if not log.stat().st_size:  # no call finished: a client whose every stream waits on a call never answered
        return np.empty(0)
    return np.loadtxt(log, dtype=np.int64, ndmin=2)[:, 2] / 1e3


@dataclass(frozen=True)
class Replies:
    """The DATA bytes a server sends for one call of a request: `ok` for its framed reply, `failed` when the call
    fails (0: trailers only; 5: an empty message, its flag byte and length, beside the error status)."""

    ok: int
    failed: int

    def __post_init__(self):
        if self.failed >= self.ok:
            raise BenchError(f"a failed call sends {self.failed} bytes, a reply {self.ok}: replies cannot be counted")

    @classmethod
    def measure(cls, port: int, reply: bytes, refused: bytes, work: Path) -> "Replies":
        """A server's `reply` (serialized, as `probe` gives it) framed, and its failure measured on the serialized
        request `refused` (`failed_bytes`)."""
        return cls(len(frame(reply)), failed_bytes(port, refused, work))

    def count(self, summary: dict[str, int]) -> int:
        """How many of the summary's calls got a complete reply; `BenchError` when its DATA bytes are not whole
        replies and failures."""
        done, data = summary["done"], summary["data_bytes"]
        ok, rest = divmod(data - done * self.failed, self.ok - self.failed)
        if rest or not 0 <= ok <= done:
            raise BenchError(
                f"h2load received {data} bytes of replies for {done} calls: not {self.ok}-byte replies"
                f" and failed calls of {self.failed} bytes"
            )
        return ok


def failed_bytes(port: int, body: bytes, work: Path) -> int:
    """The DATA bytes loopback `port` sends for a failed call, measured with h2load on the serialized request
    `body`, which the server must refuse; `BenchError` when it answers it instead."""
    try:
        probe(port, body)
    except BenchError:
        pass
    else:
        raise BenchError(f"the server on port {port} answered a request it must refuse; its failures are unknown")
    request = work / "refused.request"
    request.write_bytes(frame(body))
    done = subprocess.run(
        command(port, request, ["-n", "1", "-c", "1"]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    request.unlink()
    summary = summary_of(done.returncode, done.stdout)
    if summary["done"] != 1:
        raise BenchError(f"h2load finished {summary['done']} of the one call to port {port}")
    return summary["data_bytes"]


def run(port: int, request: Path, replies: Replies, load: Load, log: Path, server: psutil.Process | None) -> dict:
    """One run of `load` against `ModelInfer` on loopback `port`, sending the framed `request` file, which the
    server answers with `replies`: calls finished and failures (calls without a complete reply), calls still
    unanswered when it ended, successful calls/s, for a paced load the calls due and the share of them that succeeded,
    latency percentiles of every finished call (from its send), and the CPU % (100 = one core) of h2load and of `server`
    with its child processes. Per-request latencies go to `log` (`log.<i>` for each of several clients). `BenchError`
    when no call finished, or when a process of `server` exited during the run."""
    part = load.part()
    logs = [log] if load.clients == 1 else [log.with_name(f"{log.name}.{i}") for i in range(load.clients)]
    gap = 1 / load.rate if load.rate and load.clients > 1 else 0.0
    tree = [] if server is None else [server, *server.children(recursive=True)]
    clients = []
    try:
        for part_log in logs:
            part_log.unlink(missing_ok=True)
            line = command(port, request, [*part.flags(), "--log-file", str(part_log)])
            clients.append(held(line, stderr=subprocess.STDOUT))
        launchers = sum(cpu_seconds(psutil.Process(client.pid)) for client in clients)  # not h2load's: left out
        before = server_seconds(port, tree)
        client_before = os.times()
        start = time.perf_counter()
        for index, client in enumerate(clients):
            if index:
                time.sleep(gap)
            release(client)
        outputs = [client.communicate()[0].decode(errors="replace") for client in clients]
    finally:  # an error or Ctrl-C while clients run leaves none running on
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
    seconds = time.perf_counter() - start
    client_times = os.times()
    server_time = server_seconds(port, tree) - before  # first: a server that lost a process explains what follows
    parts = [summary_of(client.returncode, output) for client, output in zip(clients, outputs, strict=True)]
    summary = {figure: sum(p[figure] for p in parts) for figure in SUMMARY}
    if not summary["done"]:  # nothing to time: a server that stopped, or took no connection
        raise BenchError(
            f"h2load finished no call to port {port} in {load.duration_s:g} s: the server there answered none"
        )
    ok = replies.count(summary)
    ms = np.concatenate([latencies_ms(part_log) for part_log in logs])
    due = None if load.rate is None else load.rate * load.duration_s
    record = {
        "requests": summary["done"],
        "failures": summary["done"] - ok,
        "unanswered": summary["started"] - summary["done"],
        "error_rate": (summary["done"] - ok) / summary["done"],
        "requests_per_s": ok / load.duration_s,
        "offered_rate": load.rate,
        "offered_calls": due,
        "rate_share": None if due is None else ok / due,
        "mean_ms": float(ms.mean()) if ms.size else None,
    } | percentiles(ms)
    client_cpu = (
        (client_times.children_user - client_before.children_user)
        + (client_times.children_system - client_before.children_system)
        - launchers
    )
    usage = {"client_cpu": 100 * client_cpu / seconds}
    if server is not None:
        usage["server_cpu"] = 100 * server_time / seconds
    return record | {"seconds": load.duration_s} | usage


def server_seconds(port: int, tree: list[psutil.Process]) -> float:
    """The CPU seconds of the processes `tree` of the server on loopback `port`; `BenchError` when one has exited (a
    worker killed for memory, say): the run measured a server that changed under it."""
    try:
        return sum(cpu_seconds(process) for process in tree)
    except psutil.NoSuchProcess as gone:
        raise BenchError(f"process {gone.pid} of the server on port {port} exited during the run") from None


@dataclass(frozen=True)
class Target:
    """A server under load: its loopback port, the framed request file it is sent, the bytes of a reply or failure,
    its process (for its CPU; None: not measured) and the load of each phase."""

    port: int
    request: Path
    replies: Replies
    process: psutil.Process | None
    loads: dict[str, Load]


def interleaved(targets: dict[str, Target], repeats: int, work: Path, desc: str) -> dict[str, list[dict]]:
    """Every phase of every target `repeats` times, the targets in an order rotated by one each repeat so that none
    always runs first, each finished phase reported as progress; the records by '<target> <phase>'. The
    per-request logs go to `work` and are removed once read. `BenchError` where no call of a phase's median repeat
    succeeded (`require_answered`), raised while the servers run, so that their logs are quoted
    (`bench.processes.serving`)."""
    order = list(targets)
    runs: dict[str, list[dict]] = {f"{name} {phase}": [] for name in order for phase in targets[name].loads}
    bar = progress.bar(len(runs) * repeats, desc=desc, unit="phase")
    for repeat in range(repeats):
        for name in rotated(order, repeat):
            target = targets[name]
            for phase, load in target.loads.items():
                record = run(target.port, target.request, target.replies, load, work / "h2load.log", target.process)
                runs[f"{name} {phase}"].append(record)
                bar.set_postfix_str(f"repeat {repeat + 1} {name} {phase}: {record_line(record)}", refresh=False)
                bar.update()
    bar.close()
    for log in work.glob("h2load.log*"):
        log.unlink()
    require_answered({key: summarize(records) for key, records in runs.items()})
    return runs
