"""`python -m serve.bench --bundle runs/sst2/bundle-X`: the server's latency, capacity and batched throughput.

One run starts the server (`python -m serve`) and the two baseline servers of `serve.echo`
as subprocesses on loopback and drives them from this process with grpc.aio tasks. Each repeat measures:

- paced: single-text `Classify` calls, one at a time, paced at `--rate` for `--duration`: latency, achieved rate;
  the same against the echo server gives the latency floor of gRPC and this client;
- capacity: single-text calls with `--concurrency` in flight, unpaced, against the server, the echo server and
  the bare server (`python -m serve.echo --bundle`: the bundle's tokenizer and backend on the event loop, nothing
  else: the ceiling of any server that runs this model on its event loop);
- batched: 32-text calls, BATCH_CONCURRENCY in flight, against the server;
- raw: the bundle's backend in this process (same thread count) on the same texts, tokenized and padded
  into batches of 32: the throughput the server's batched path is compared with.

Texts are sentences sampled from SST-2 dev (`$DATA_DIR/sst2/dev.tsv`) or `--texts FILE` (one per line).
Server settings come from the flags below and `EDGEDISTILL_*` variables, as for `python -m serve`.
CPU % (100 = one core) is recorded for this process and the server, so a client-bound result shows.
Each figure is the median over `--repeats` with min and max; `bench.json` and `bench.md` go to `--out`.
Targets are reported; only `--check` turns a missed target into exit status 1.
"""

import argparse
import asyncio
import functools
import itertools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console

from common import manifest as mf
from common.bundle import Bundle, load_bundle
from common.settings import PROJECT_ROOT, defaults
from common.tables import markdown_results, print_results
from serve.backends import load_backend
from serve.batching import pad_rows
from serve.encoding import TextEncoder
from serve.proto import classifier_pb2, classifier_pb2_grpc
from serve.settings import Settings, SettingsError, load_settings

BATCH = 32
BATCH_CONCURRENCY = 4
TEXT_COUNT = 512
CALL_TIMEOUT_S = 10.0
START_TIMEOUT_S = 120.0
WARMUP_S = 1.0
P99_LIMIT_MS = 3.0
RATE_FLOOR = 0.95  # the paced target also needs this share of the asked rate, so a slow client cannot pass it
CAPACITY_FLOOR = 0.80
BATCHED_FLOOR = 0.70
PHASES = {  # phase -> table label: calls in flight x texts per call
    "paced": "server, paced {rate:g}/s",
    "echo_paced": "echo, paced {rate:g}/s",
    "capacity": "server {concurrency}x1",
    "echo": "echo {concurrency}x1",
    "bare": "bare server {concurrency}x1",
    "batched": f"server {BATCH_CONCURRENCY}x{BATCH}",
    "raw": f"raw backend 1x{BATCH}",
}


class BenchError(RuntimeError):
    """The benchmark could not measure: a server did not start or exit cleanly, or no call succeeded."""


@dataclass(frozen=True)
class Options:
    """The command's flags (defaults in `parse_options`)."""

    bundle: Path
    out: Path
    texts: Path | None
    rate: float
    duration: float
    concurrency: int
    threads: int
    repeats: int
    check: bool


@dataclass
class Tally:
    """Successful calls' latencies (seconds) and failed calls by status code."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)

    async def call(self, classify, request) -> None:
        start = time.perf_counter()
        try:
            await classify(request)
        except grpc.aio.AioRpcError as err:
            self.errors[err.code().name] += 1
            return
        self.latencies.append(time.perf_counter() - start)

    def record(self, seconds: float, texts_per_call: int) -> dict:
        """Rates over `seconds` of wall time and latency percentiles in ms."""
        if not self.latencies:
            raise BenchError(f"no call succeeded; failures by status: {dict(self.errors)}")
        p50, p95, p99, top = np.percentile(np.array(self.latencies) * 1e3, [50, 95, 99, 100]).tolist()
        calls = len(self.latencies)
        return {
            "calls": calls,
            "errors": sum(self.errors.values()),
            "error_codes": dict(self.errors),
            "seconds": seconds,
            "calls_per_s": calls / seconds,
            "texts_per_s": calls * texts_per_call / seconds,
            "p50_ms": p50,
            "p95_ms": p95,
            "p99_ms": p99,
            "max_ms": top,
        }


def load_texts(path: Path | None, count: int = TEXT_COUNT, seed: int = 0) -> tuple[list[str], str]:
    """Up to `count` shuffled texts from `path` (one per line), else from SST-2 dev; and where they came from."""
    if path is None:
        path = Path(defaults()["DATA_DIR"]) / "sst2" / "dev.tsv"
        if not path.is_file():
            raise BenchError(f"{path} not found: set DATA_DIR or pass --texts FILE (one text per line)")
        lines = path.read_text(encoding="utf-8").splitlines()[1:]  # header: sentence<TAB>label
        texts = [line.rsplit("\t", 1)[0].strip() for line in lines]
    else:
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    texts = [text for text in texts if text]
    if not texts:
        raise BenchError(f"{path} holds no texts")
    random.Random(seed).shuffle(texts)
    return texts[:count], str(path)


def batches_of(texts: list[str], size: int) -> list[list[str]]:
    """Consecutive groups of `size` texts, wrapping around so that there is at least one full group."""
    return [[texts[(k * size + j) % len(texts)] for j in range(size)] for k in range(max(1, len(texts) // size))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_serving(address: str, process: subprocess.Popen, name: str, log: Path) -> None:
    """Poll the health service until it reports SERVING; `BenchError` if the process exits or time runs out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise BenchError(f"{name} exited with {process.returncode} at start; see {log}")
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass  # not listening yet
            time.sleep(0.2)
    raise BenchError(f"{name} did not report SERVING within {START_TIMEOUT_S:.0f} s; see {log}")


@contextmanager
def running(module: str, args: list[str], port: int, log: Path) -> Iterator[psutil.Process]:
    """`python -m module args` with its output in `log`, SERVING on `port`; stopped with SIGTERM afterwards."""
    with open(log, "w") as sink:
        process = subprocess.Popen([sys.executable, "-m", module, *args], cwd=PROJECT_ROOT, stdout=sink, stderr=sink)
    try:
        wait_serving(f"127.0.0.1:{port}", process, module, log)
        yield psutil.Process(process.pid)
    finally:
        process.terminate()
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
    if code != 0:
        raise BenchError(f"{module} did not stop cleanly on SIGTERM (exit {code}); see {log}")


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def measure(load: Callable[[], Awaitable[Tally]], texts_per_call: int, server: psutil.Process | None) -> dict:
    """Await `load()`; its record plus the CPU % (100 = one core) of this process and of `server`."""
    processes = {"client": psutil.Process()} | ({"server": server} if server else {})
    before = {name: cpu_seconds(p) for name, p in processes.items()}
    start = time.perf_counter()
    tally = await load()
    seconds = time.perf_counter() - start
    usage = {f"{name}_cpu": 100 * (cpu_seconds(p) - before[name]) / seconds for name, p in processes.items()}
    return tally.record(seconds, texts_per_call) | usage


async def paced(classify, requests: list, rate: float, duration: float) -> Tally:
    """One call at a time, the i-th sent at start + i / rate (at once when behind), for `duration` seconds."""
    tally = Tally()
    start = time.perf_counter()
    end = start + duration
    for i in itertools.count():
        due = start + i / rate
        if due >= end or time.perf_counter() >= end:
            return tally
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        await tally.call(classify, requests[i % len(requests)])


async def saturate(classify, requests: list, concurrency: int, duration: float) -> Tally:
    """`concurrency` callers, each sending its next call as soon as the last returns, for `duration` seconds."""
    tally = Tally()
    end = time.perf_counter() + duration

    async def caller(first: int) -> None:
        for i in itertools.count(first, concurrency):
            if time.perf_counter() >= end:
                return
            await tally.call(classify, requests[i % len(requests)])

    await asyncio.gather(*(caller(k) for k in range(concurrency)))
    return tally


def infer_for(backend, batches: list[dict[str, np.ndarray]], duration: float) -> Tally:
    """Run the backend on `batches` in turn for `duration` seconds."""
    tally = Tally()
    end = time.perf_counter() + duration
    for i in itertools.count():
        if time.perf_counter() >= end:
            return tally
        start = time.perf_counter()
        backend.infer(batches[i % len(batches)])
        tally.latencies.append(time.perf_counter() - start)


def summarize(runs: list[dict]) -> dict:
    """Median, min and max over repeats of every numeric field."""
    numeric = [key for key, value in runs[0].items() if isinstance(value, int | float)]
    return {
        key: {
            "median": statistics.median(r[key] for r in runs),
            "min": min(r[key] for r in runs),
            "max": max(r[key] for r in runs),
        }
        for key in numeric
    }


def evaluate(summary: dict, rate: float) -> tuple[dict, list[dict]]:
    """The ratios (of medians) and each target with its measured value and verdict."""
    median = {phase: {key: stats["median"] for key, stats in fields.items()} for phase, fields in summary.items()}
    ratios = {
        "capacity_vs_echo": median["capacity"]["calls_per_s"] / median["echo"]["calls_per_s"],
        "batched_vs_raw": median["batched"]["texts_per_s"] / median["raw"]["texts_per_s"],
        "bare_vs_echo": median["bare"]["calls_per_s"] / median["echo"]["calls_per_s"],
        "capacity_vs_bare": median["capacity"]["calls_per_s"] / median["bare"]["calls_per_s"],
    }
    paced_ok = median["paced"]["calls_per_s"] >= RATE_FLOOR * rate and median["paced"]["errors"] == 0
    targets = [
        {
            "name": f"paced p99 ms at {rate:g}/s",
            "measured": median["paced"]["p99_ms"],
            "target": f"<= {P99_LIMIT_MS:g} (achieved >= {RATE_FLOOR:.0%} of the rate, no errors)",
            "passed": median["paced"]["p99_ms"] <= P99_LIMIT_MS and paced_ok,
        },
        {
            "name": "capacity, server / echo",
            "measured": ratios["capacity_vs_echo"],
            "target": f">= {CAPACITY_FLOOR:.2f}",
            "passed": ratios["capacity_vs_echo"] >= CAPACITY_FLOOR,
        },
        {
            "name": f"batch-{BATCH} texts/s, server / raw",
            "measured": ratios["batched_vs_raw"],
            "target": f">= {BATCHED_FLOOR:.2f}",
            "passed": ratios["batched_vs_raw"] >= BATCHED_FLOOR,
        },
    ]
    return ratios, targets


def server_settings(options: Options) -> tuple[list[str], Settings]:
    """The server's flags and the settings they give together with `EDGEDISTILL_*` variables."""
    flags = ["--bundle", str(options.bundle), "--host", "127.0.0.1", "--port", str(free_port())]
    flags += ["--metrics-port", "off", "--threads", str(options.threads)]
    settings = load_settings(flags)
    if settings.tls_cert is not None:
        raise BenchError("the benchmark calls over plaintext loopback: unset EDGEDISTILL_TLS_CERT and _KEY")
    return flags, settings


def raw_batches(bundle: Bundle, texts: list[str]) -> list[dict[str, np.ndarray]]:
    """The texts tokenized with the bundle's tokenizer, padded into batches of BATCH."""
    encoder = TextEncoder(bundle.tokenizer_path, bundle.spec.max_length, {t.name: t.dtype for t in bundle.spec.inputs})
    return [pad_rows(encoder.encode(group), encoder.pad_values) for group in batches_of(texts, BATCH)]


async def classify_call(stack: AsyncExitStack, port: int, metadata: tuple = ()) -> Callable:
    """`Classify` on loopback `port` with the benchmark's timeout, over a channel that `stack` closes."""
    channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
    return functools.partial(
        classifier_pb2_grpc.ClassifierStub(channel).Classify, timeout=CALL_TIMEOUT_S, metadata=metadata
    )


async def measure_all(
    options: Options, bundle: Bundle, flags: list[str], settings: Settings, texts: list[str], console: Console
) -> dict[str, list[dict]]:
    """Start the three servers, warm everything up, then run every phase `options.repeats` times, interleaved."""
    batches = raw_batches(bundle, texts)
    singles = [classifier_pb2.ClassifyRequest(texts=[text]) for text in texts]
    grouped = [classifier_pb2.ClassifyRequest(texts=group) for group in batches_of(texts, BATCH)]
    metadata = (("authorization", f"Bearer {settings.token.get_secret_value()}"),) if settings.token else ()
    echo_port, bare_port = free_port(), free_port()
    runs: dict[str, list[dict]] = {phase: [] for phase in PHASES}
    async with AsyncExitStack() as stack:
        backend = load_backend(bundle, settings.providers, settings.threads, settings.spin)
        stack.callback(backend.close)
        server = stack.enter_context(running("serve", flags, settings.port, options.out / "server.log"))
        echo_flags = ["--host", "127.0.0.1", "--port", str(echo_port)]
        echo = stack.enter_context(running("serve.echo", echo_flags, echo_port, options.out / "echo.log"))
        bare_flags = ["--host", "127.0.0.1", "--port", str(bare_port), "--bundle", str(options.bundle)]
        bare_flags += ["--threads", str(options.threads)]
        bare = stack.enter_context(running("serve.echo", bare_flags, bare_port, options.out / "bare.log"))
        call = await classify_call(stack, settings.port, metadata)
        echo_call, bare_call = await classify_call(stack, echo_port), await classify_call(stack, bare_port)
        await saturate(call, singles, options.concurrency, WARMUP_S)
        await saturate(call, grouped, BATCH_CONCURRENCY, WARMUP_S)
        await saturate(echo_call, singles, options.concurrency, WARMUP_S)
        await saturate(bare_call, singles, options.concurrency, WARMUP_S)
        infer_for(backend, batches, WARMUP_S)
        seconds = options.duration
        phases = {
            "paced": (functools.partial(paced, call, singles, options.rate, seconds), 1, server),
            "echo_paced": (functools.partial(paced, echo_call, singles, options.rate, seconds), 1, echo),
            "capacity": (functools.partial(saturate, call, singles, options.concurrency, seconds), 1, server),
            "echo": (functools.partial(saturate, echo_call, singles, options.concurrency, seconds), 1, echo),
            "bare": (functools.partial(saturate, bare_call, singles, options.concurrency, seconds), 1, bare),
            "batched": (functools.partial(saturate, call, grouped, BATCH_CONCURRENCY, seconds), BATCH, server),
            "raw": (functools.partial(asyncio.to_thread, infer_for, backend, batches, seconds), BATCH, None),
        }
        for repeat in range(1, options.repeats + 1):
            for phase, (load, texts_per_call, process) in phases.items():
                record = await measure(load, texts_per_call, process)
                runs[phase].append(record)
                console.print(f"[dim]repeat {repeat}/{options.repeats} {phase}: {progress(record)}[/]")
    return runs


def progress(record: dict) -> str:
    return (
        f"{record['calls_per_s']:.0f} calls/s, {record['texts_per_s']:.0f} texts/s, p99 {record['p99_ms']:.2f} ms, "
        f"{record['errors']} errors, client CPU {record['client_cpu']:.0f} %"
        + (f", server CPU {record['server_cpu']:.0f} %" if "server_cpu" in record else "")
    )


def run(options: Options, console: Console | None = None) -> dict:
    """Measure, write `bench.json` and `bench.md` into `options.out`, print the tables; returns the result."""
    console = console or Console(width=200)
    options.out.mkdir(parents=True, exist_ok=True)
    texts, source = load_texts(options.texts)
    bundle = load_bundle(options.bundle)
    flags, settings = server_settings(options)
    load_before = os.getloadavg()
    runs = asyncio.run(measure_all(options, bundle, flags, settings, texts, console))
    summary = {phase: summarize(records) for phase, records in runs.items()}
    ratios, targets = evaluate(summary, options.rate)
    lengths = [len(text) for text in texts]
    result = {
        "bundle": {
            "path": str(options.bundle),
            **bundle.spec.model_dump(include={"name", "version", "arch", "precision", "runtime"}),
        },
        "settings": settings.model_dump(mode="json", exclude={"token", "port"}),
        "options": {
            "rate": options.rate,
            "duration_s": options.duration,
            "concurrency": options.concurrency,
            "batch": BATCH,
            "batch_concurrency": BATCH_CONCURRENCY,
            "threads": options.threads,
            "repeats": options.repeats,
        },
        "texts": {
            "source": source,
            "count": len(texts),
            "chars": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
            "versions": mf.package_versions(),
        },
        "runs": runs,
        "summary": summary,
        "ratios": ratios,
        "targets": targets,
        "passed": all(t["passed"] for t in targets),
    }
    write_atomic(options.out / "bench.json", json.dumps(result, indent=1) + "\n")
    write_atomic(options.out / "bench.md", markdown(result))
    print_tables(result, console)
    return result


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


COLUMNS = {  # summary field -> table column
    "calls_per_s": "calls/s",
    "texts_per_s": "texts/s",
    "p50_ms": "p50 ms",
    "p95_ms": "p95 ms",
    "p99_ms": "p99 ms",
    "max_ms": "max ms",
    "errors": "errors",
    "client_cpu": "client CPU %",
    "server_cpu": "server CPU %",
}


def cell(stats: dict | None, digits: int) -> str:
    """'median (min-max)', or only the median when the repeats agree."""
    if stats is None:
        return "-"
    median, low, high = (f"{stats[k]:.{digits}f}" for k in ("median", "min", "max"))
    return median if low == high else f"{median} ({low}-{high})"


def table_rows(result: dict) -> list[list[str]]:
    names = {phase: label.format(**result["options"]) for phase, label in PHASES.items()}
    return [
        [names[phase]] + [cell(fields.get(key), 2 if key.endswith("_ms") else 0) for key in COLUMNS]
        for phase, fields in result["summary"].items()
    ]


def target_rows(result: dict) -> list[list[str]]:
    return [
        [t["name"], f"{t['measured']:.2f}", t["target"], "pass" if t["passed"] else "MISS"] for t in result["targets"]
    ]


def heading(result: dict) -> str:
    o, b = result["options"], result["bundle"]
    return (
        f"{b['name']} ({b['arch']}, {b['precision']}, {b['runtime']}), {o['threads']} intra-op threads, "
        f"{result['machine']['cpus']} CPUs; median (min-max) of {o['repeats']} repeats of {o['duration_s']:g} s"
    )


def baseline_line(result: dict) -> str:
    ratios = result["ratios"]
    return (
        f"The bare server (this bundle's tokenizer and backend on the event loop, nothing else) reached "
        f"{ratios['bare_vs_echo']:.2f} of the echo server's calls/s; the server reached "
        f"{ratios['capacity_vs_bare']:.2f} of the bare server's."
    )


def markdown(result: dict) -> str:
    lines = [f"Serving benchmark: {heading(result)}.", ""]
    lines += markdown_results(["phase", *COLUMNS.values()], table_rows(result), ("target", target_rows(result)))
    lines += ["", baseline_line(result)]
    lines += [
        "",
        "CPU %: 100 = one core. Client CPU near 100 % means the client, not the server, limited the rate;",
        "for the raw backend it is the benchmark process running the model.",
    ]
    return "\n".join(lines) + "\n"


def print_tables(result: dict, console: Console) -> None:
    header = ["phase", *COLUMNS.values()]
    print_results(console, heading(result), header, table_rows(result), ("targets", "target", target_rows(result)))
    console.print(baseline_line(result))


def parse_options(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m serve.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True, help="bundle folder to serve")
    parser.add_argument("--rate", type=float, default=200.0, help="paced calls per second (default 200)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per phase and repeat (default 20)")
    parser.add_argument("--concurrency", type=int, default=12, help="calls in flight for capacity (default 12)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads, server and raw backend (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of every phase (default 3)")
    parser.add_argument("--texts", type=Path, help="texts, one per line (default: SST-2 dev from $DATA_DIR)")
    parser.add_argument("--out", type=Path, help="results folder (default: <bundle>/../serve-bench)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or min(args.concurrency, args.repeats) < 1 or args.threads < 0:
        parser.error("--rate and --duration must be > 0, --concurrency and --repeats >= 1, --threads >= 0")
    args.bundle = args.bundle.resolve()
    args.out = (args.out or args.bundle.parent / "serve-bench").resolve()
    return Options(**vars(args))


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    try:
        result = run(options)
    except (BenchError, SettingsError, mf.ArtifactError) as err:
        print(f"python -m serve.bench: {err}", file=sys.stderr)
        return 2
    return 1 if options.check and not result["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())
