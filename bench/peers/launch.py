"""The servers of the peer comparison, each one process tree on loopback answering KServe v2 `ModelInfer`.

`edgedistill` is the server as deployed, with the recipe's `bench.peers.workers` processes; `kserve` and `mlserver`
serve the same bundle with `bench.peers.model` from their own environments (a Python interpreter each, from `make
peers-setup`), with the server's session settings (`classifier_session`): KServe's `ModelServer` answers gRPC from
one process, and MLServer from its main process, which hands each call to one of as many inference workers as the
server has; `echo` is the do-nothing floor of `bench.servers`. Each is ready when its v2 `ModelReady` says so for the
model name it serves and, where its log shows the server's supervisor, once every worker serves (`all_serving`).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from edgedistill.bench import BenchError, servers
from edgedistill.bench.environ import measured_settings, serve_flags, server_environ
from edgedistill.bench.peers.model import session_of, session_settings
from edgedistill.bench.ports import free_port
from edgedistill.common.cascade import ServedModels
from edgedistill.common.machine import usable_memory
from edgedistill.common.processes import python_module
from edgedistill.serve.proto import kserve_pb2, kserve_pb2_grpc
from edgedistill.serve.settings import Settings
from edgedistill.serve.workers import SUPERVISING, WORKERS_SERVING, worker_bytes, worker_count

PEERS = ("kserve", "mlserver")
PEER_ENVS = Path(".venv-peers")  # under the working directory, as `make peers-setup` makes them
MODEL = "bundle"  # the model name every peer serves the bundle under


@dataclass(frozen=True)
class Server:
    """How to start one server: its command, gRPC port and the model name its `ModelInfer` calls name; `workers`:
    the processes that run its model (the server's workers, MLServer's inference workers; 1 where it has no such
    setting); `session`: the settings of its model's session (`model.session_of`; None: it runs
    no model); `clean_exit`: whether SIGTERM must end it with status 0 (the peers' exit statuses are theirs)."""

    name: str
    command: list[str]
    port: int
    model: str
    workers: int = 1
    session: dict | None = None
    clean_exit: bool = True


def model_ready(model: str) -> Callable[[grpc.Channel], bool]:
    """Readiness by the v2 `ModelReady` call for `model`."""

    def ready(channel: grpc.Channel) -> bool:
        stub = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
        return stub.ModelReady(kserve_pb2.ModelReadyRequest(name=model), timeout=1).ready

    return ready


def all_serving(log: Path, model: str) -> Callable[[grpc.Channel], bool]:
    """Readiness of a server writing `log`: `model_ready` and, under the server's supervisor, every worker serving
    (the `event`s of its JSON log lines; other lines, such as Python's warnings, are skipped)."""
    model_is_ready = model_ready(model)
    read, events = 0, set()  # bytes of `log` read, and the events of their lines

    def ready(channel: grpc.Channel) -> bool:
        nonlocal read
        if WORKERS_SERVING not in events:
            with open(log, "rb") as file:
                file.seek(read)
                text = file.read()
            whole = text[: text.rfind(b"\n") + 1]  # a line still being written is read at a later poll
            read += len(whole)
            events.update(event_of(line) for line in whole.splitlines())
        if SUPERVISING in events and WORKERS_SERVING not in events:
            return False
        return model_is_ready(channel)

    return ready


def event_of(line: bytes) -> str | None:
    """The `event` of a JSON log line; None for any other line."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    return entry.get("event") if isinstance(entry, dict) else None


def peer_python(peer: str, python: Path | None = None) -> Path:
    """The interpreter of `peer`'s environment (`python`, else `.venv-peers/<peer>/bin/python`); `BenchError`
    naming the set-up command when it is missing."""
    found = python or PEER_ENVS / peer / "bin" / "python"
    if not found.is_file():
        raise BenchError(f"no {peer} environment: {found} is missing; run `make peers-setup` (or pass --{peer}-python)")
    return found.absolute()


def zero_workers_settings(bundle: Path) -> Settings:
    """The settings of a measured server on `bundle` with WORKERS 0 (`measured_settings`), whose `EDGEDISTILL_*`
    variables (MAX_CONCURRENT_RPCS, MAX_MESSAGE_BYTES) set the memory it counts per worker; its threads (here the
    runtime's default) change no count."""
    return measured_settings(serve_flags(bundle, 0, 0, workers=0))


def memory_per_worker(bundle: Path) -> tuple[int, int]:
    """The usable memory, and what the measured server counts for each of its workers on `bundle` (`serve.workers`)."""
    return usable_memory(), worker_bytes(ServedModels.read(bundle).model_bytes, zero_workers_settings(bundle))


def resolved_workers(workers: int, bundle: Path, servers: int = 1) -> int:
    """`workers`, or for 0 the count the measured server picks on `bundle` (one per usable core, as many as memory
    holds: `serve.workers.worker_count` with `zero_workers_settings`) where `servers` such servers share the memory
    at once: resolved here once, so that the servers compared run the same count."""
    if workers:
        return workers
    memory, per_worker = memory_per_worker(bundle)
    return max(1, min(worker_count(zero_workers_settings(bundle)), memory // per_worker // servers))


def edgedistill(bundle: Path, model: str, threads: int, workers: int) -> Server:
    """The server as deployed (metrics on, as the peers' are) with `workers` processes (`resolved_workers`);
    `BenchError` when `EDGEDISTILL_*` variables give it TLS or a token, which h2load and the readiness check do not
    send."""
    port = free_port()
    flags = serve_flags(bundle, port, threads, workers, metrics_port=free_port())
    settings = measured_settings(flags)
    if settings.tls_cert is not None or settings.token is not None:
        raise BenchError("h2load calls over plaintext without a token: unset EDGEDISTILL_TLS_* and EDGEDISTILL_TOKEN")
    command = python_module("edgedistill.serve", *flags)
    return Server("edgedistill", command, port, model, workers, session_of(settings))


def classifier_session(threads: int) -> dict:
    """The session of a `model.BundleClassifier` (a peer's model, the bare server's) with `threads` intra-op threads
    in the environment a measurement's servers run in: the measured server's `EDGEDISTILL_*` session settings."""
    return session_of(session_settings(threads, server_environ()))


def echo() -> Server:
    port = free_port()
    return Server("echo", servers.command(port), port, servers.MODEL)


def kserve(python: Path, bundle: Path, threads: int) -> Server:
    """KServe's `ModelServer` with one worker, its per-request latency log and log set-up off."""
    port = free_port()
    command = python_module("edgedistill.bench.peers.kserve_server", "--bundle", str(bundle), python=python)
    command += ["--threads", str(threads), "--model_name", MODEL, "--grpc_port", str(port)]
    command += ["--http_port", str(free_port()), "--enable_latency_logging", "false", "--configure_logging", "false"]
    return Server("kserve", command, port, MODEL, session=classifier_session(threads), clean_exit=False)


def mlserver(python: Path, bundle: Path, threads: int, workers: int, folder: Path) -> Server:
    """`mlserver start` on a model repository in `folder` serving `bundle` with `workers` parallel inference workers
    (`resolved_workers`: the server's count, which Seldon's tuning guide would also size to the cores), on loopback,
    debug off, MLServer's defaults otherwise."""
    port = free_port()
    ports = {"grpc_port": port, "http_port": free_port(), "metrics_port": free_port()}
    folder.mkdir(parents=True, exist_ok=True)
    settings = {"host": "127.0.0.1", "debug": False, "metrics_dir": str(folder / "metrics")} | ports
    settings["parallel_workers"] = workers
    (folder / "settings.json").write_text(json.dumps(settings, indent=1), encoding="utf-8")
    model = {
        "name": MODEL,
        "implementation": "edgedistill.bench.peers.mlserver_runtime.BundleRuntime",
        "parameters": {"uri": str(bundle.absolute()), "extra": {"threads": threads}},
    }
    (folder / MODEL).mkdir(exist_ok=True)
    (folder / MODEL / "model-settings.json").write_text(json.dumps(model, indent=1), encoding="utf-8")
    command = [str(python.with_name("mlserver")), "start", str(folder)]
    return Server("mlserver", command, port, MODEL, workers, classifier_session(threads), clean_exit=False)
