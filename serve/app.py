"""Assemble and run the server: both APIs, health, reflection, call observation and auth, metrics, TLS, signals.

Lifecycle: `create_server(settings)` verifies and loads the bundle (or confidence cascade, `serve.cascade`) and
binds the port (health NOT_SERVING); `start()` opens the port and /metrics; `warm_up()` runs the model at several shapes
and flips health to SERVING; `reload()` swaps in a new bundle; `stop()` drains: health
NOT_SERVING, new calls refused, in-flight calls get `shutdown_grace_s` to finish.

A batcher fault (an internal error, or a backend call past `batch_timeout_s`) turns health NOT_SERVING
for good (the liveness probe fails) and `serve` exits with `EXIT_FAULT` for the orchestrator to restart
the process: a hung call cannot be taken back from its thread, and a fresh process starts from a known state.
A call that hangs on the event loop itself (a quick backend call run inline) blocks every coroutine, so there the
loop's watchdog (`serve.watchdog`) ends the process with `EXIT_FAULT` from its own thread, past the same limit.
"""

import asyncio
import contextlib
import gc
import importlib.util
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import grpc
from edgedistill.serve.cascade import CascadeRuntime, load_runtime
from edgedistill.serve.errors import BundleRejected, NotReady, ReloadFailed
from edgedistill.serve.exposition import check_http
from edgedistill.serve.health import HealthServicer
from edgedistill.serve.host import ModelHost, ModelRuntime
from edgedistill.serve.logs import JsonFormatter
from edgedistill.serve.malloc import limit_arenas
from edgedistill.serve.metrics import Metrics
from edgedistill.serve.observe import CallObserver, ObservedServer, status_alone
from edgedistill.serve.ports import reserve_port, unbindable
from edgedistill.serve.proto import classifier_pb2_grpc, kserve_pb2_grpc
from edgedistill.serve.reflection import ReflectionServicer
from edgedistill.serve.settings import GRPC_INT_MAX, NEVER_S, Settings, SettingsError, host_port, loopback_host
from edgedistill.serve.tls import server_credentials
from edgedistill.serve.transport import ADMIN_METHODS, CLASSIFIER, KSERVE, ClassifierServicer, InferenceServicer
from edgedistill.serve.watchdog import LoopWatchdog
from edgedistill.serve.wire import prechecks
from edgedistill.serve.workers import RELAYED, SupervisorLink
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

log = logging.getLogger("serve")

SERVICES = (CLASSIFIER, KSERVE)
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
PROBE_MESSAGE_BYTES = 1024  # largest request on the health port: a Check names a service, a few bytes
HEALTH_NAMES = ("", *SERVICES)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
EXIT_FAULT = 3  # the exit status after a batcher fault: restart me
EXIT_LINE_WAIT_S = 1.0  # longest an exit at once (`exit_with_line`) waits for its log line to be written
CLOSE_FLOOR_S = 1.0  # least time the model's queue gets to finish at stop, even with no grace left
KEEPALIVE_TIMEOUT_MS = 20_000  # how long a keepalive ping may go unanswered before the connection is closed
# Ping abuse: a client pinging more often than this without sending data gets a strike; past the strikes, GOAWAY.
# gRPC's defaults, set here so that a change of them cannot lower the bound.
MIN_PING_INTERVAL_MS = 300_000
MAX_PING_STRIKES = 2


def _ms(seconds: float) -> int:
    """A duration as gRPC's ms, NEVER_S or more (any finite float) as gRPC's never; one above 0 as 1 ms at least, not
    the 0 that gRPC reads as another setting."""
    ms = min(int(min(seconds, NEVER_S) * 1000), GRPC_INT_MAX)
    return max(ms, 1) if seconds > 0 else ms


def connection_options(settings: Settings) -> list[tuple[str, int]]:
    """gRPC options that bound what a connection may hold, and for how long: the handshake, idle and aged
    connections, unanswered keepalive pings, ping floods."""
    return [
        ("grpc.server_handshake_timeout_ms", _ms(settings.handshake_timeout_s)),
        ("grpc.max_connection_idle_ms", _ms(settings.connection_idle_s)),
        ("grpc.max_connection_age_ms", _ms(settings.connection_age_s)),
        ("grpc.max_connection_age_grace_ms", _ms(settings.connection_age_grace_s)),
        ("grpc.keepalive_time_ms", _ms(settings.keepalive_s)),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
    ]


class EdgeServer:
    """The gRPC server with its model host, health servicer and metrics."""

    def __init__(
        self,
        settings: Settings,
        server: grpc.aio.Server,
        host: ModelHost,
        runtime: ModelRuntime | CascadeRuntime,
        observer: CallObserver,
        credentials: grpc.ServerCredentials | None,
    ):
        self.settings = settings
        self.grpc = server
        self.credentials = credentials  # the gRPC port's TLS (None: plaintext)
        self.host = host
        self.observer = observer
        self.metrics: Metrics = host.metrics
        self.health = HealthServicer()
        self.metrics_port: int | None = None
        self.health_server: grpc.aio.Server | None = None  # the plaintext probe port, with `health_port`
        self.health_port: int | None = None
        self._first: ModelRuntime | CascadeRuntime | None = runtime
        self._stopped = False
        self._fault_watch: asyncio.Task | None = None

    async def _set_health(self, status) -> None:
        for name in HEALTH_NAMES:
            await self.health.set(name, status)

    def bind(self) -> int:
        """Add the gRPC port (TLS with `credentials`) and the health port; the gRPC port bound."""
        port = _bind(self.grpc, self.settings, "port", self.credentials)
        if self.health_server is not None:
            self.health_port = _bind(self.health_server, self.settings, "health_port")
        return port

    async def start(self) -> None:
        """Open the bound ports (health NOT_SERVING until `warm_up`, unless warm already) and the metrics endpoint."""
        await self._set_health(SERVING if self.host.ready else NOT_SERVING)
        self._fault_watch = asyncio.get_running_loop().create_task(self._watch_faults(), name="fault-watch")
        await self.grpc.start()
        self._warn_of_plaintext_tokens()
        if self.health_server is not None:
            await self.health_server.start()
        if self.settings.metrics_port is not None:
            self.metrics_port = self.metrics.start_http(self.settings.metrics_host, self.settings.metrics_port)

    def _warn_of_plaintext_tokens(self) -> None:
        """Warn where TOKEN or ADMIN_TOKEN (which can swap the served model), naming which, is set on a plaintext gRPC
        port beyond loopback: the tokens cross the network as they are."""
        tokens = [name.upper() for name in ("token", "admin_token") if getattr(self.settings, name) is not None]
        if tokens and self.settings.tls_cert is None and not loopback_host(self.settings.host):
            log.warning(
                "%s set but the gRPC port on %s is plaintext: the tokens cross the network as they are; set "
                "TLS_CERT and TLS_KEY, unless a mesh or proxy encrypts the traffic",
                " and ".join(tokens) + (" are" if len(tokens) > 1 else " is"),
                self.settings.host,
                extra={"event": "plaintext_token", "tokens": tokens},
            )

    async def close_ports(self) -> None:
        """Close the ports at once, after a start that failed: a started gRPC server left to the garbage collector
        prints a traceback once the event loop is closed."""
        await self.grpc.stop(0)
        if self.health_server is not None:
            await self.health_server.stop(0)
        self.metrics.stop_http()

    async def _watch_faults(self) -> None:
        await self.host.faulted.wait()
        await self._set_health(NOT_SERVING)
        log.error("server fault, exiting for a restart: %s", self.host.fault, extra={"event": "server_fault"})

    async def warm_up(self) -> None:
        """Warm the first model up and report SERVING; `BundleRejected` when its outputs are wrong."""
        first, self._first = self._first, None
        await self.host.activate(first)
        await self._set_health(SERVING)

    async def reload(self, folder: str | Path | None = None, trigger: str = "a Reload call"):
        """Swap in the bundle at `folder` (default: the one being served); `ReloadFailed` keeps the old one.
        `trigger`: what asked for it, for the log."""
        return await self.host.reload(folder, trigger)

    async def stop(self, grace: float | None = None, reason: str = "stop") -> None:
        """Drain: NOT_SERVING, refuse new calls, let in-flight ones finish within `grace` seconds. `reason`: what
        stops the server, for the log."""
        if self._stopped:
            return
        grace = self.settings.shutdown_grace_s if grace is None else grace
        log.info("draining on %s (grace %.1f s)", reason, grace, extra={"event": "draining", "reason": reason})
        await self.health.enter_graceful_shutdown()
        # New calls get UNAVAILABLE (which clients retry) while queued work finishes; stopping the gRPC
        # server at once would answer calls racing the signal with CANCELLED instead.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        self.observer.grace_ends(deadline)
        await self.host.drain(deadline)
        await self.grpc.stop(max(0.0, deadline - loop.time()))
        if self.health_server is not None:
            await self.health_server.stop(0)
        await self.host.close(max(CLOSE_FLOOR_S, deadline - loop.time()))
        if self._fault_watch is not None:
            self._fault_watch.cancel()
        if self._first is not None:  # never warmed up
            await self._first.close()
            self._first = None
        self.metrics.stop_http()
        self._stopped = True
        cut = self.observer.cut_calls
        log.log(
            logging.WARNING if cut else logging.INFO,
            "stopped" + (f", {cut} call(s) cut when the grace ran out" if cut else ""),
            extra={"event": "stopped", "cut_calls": cut},
        )


def create_server(settings: Settings, supervisor: SupervisorLink | None = None) -> tuple[EdgeServer, int | None]:
    """Load and verify the bundle, build the server and bind its port (0: any free port); call from a running loop.
    As a worker of `supervisor` the ports are left for `EdgeServer.bind`, and bound with SO_REUSEPORT; else a port in
    use is refused."""
    share_port = supervisor is not None
    if settings.bundle is None:
        raise SettingsError("no bundle to serve: pass --bundle or set EDGEDISTILL_BUNDLE")
    # Before the bundle loads, which takes long: a port in use or a host that does not resolve, named as the
    # supervisor names it (gRPC's bind names no reason), and TLS files that cannot be used
    for field in () if share_port else ("port", "health_port"):
        if getattr(settings, field) is not None:
            reserve_port(settings.host, getattr(settings, field), field).close()
    if settings.metrics_port is not None:  # a worker's is off: the supervisor serves /metrics
        check_http(settings.metrics_host, settings.metrics_port)
    credentials = server_credentials(settings)
    metrics = Metrics(shared=share_port)
    host = ModelHost(settings, metrics, load_runtime)
    runtime = load_runtime(settings.bundle, settings, metrics, host.on_fault)
    # Only what clients send is limited: a reply is bounded by the request limits (MAX_TEXTS rows of the labels'
    # values), and a send limit would fail a call the model had answered, with RESOURCE_EXHAUSTED that clients retry.
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_concurrent_streams", settings.streams_per_connection),
            ("grpc.so_reuseport", int(share_port)),
            *connection_options(settings),
        ],
        maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
    )
    token = settings.token.get_secret_value() if settings.token is not None else None
    admin_token = settings.admin_token.get_secret_value() if settings.admin_token is not None else None
    observer = CallObserver(
        metrics, settings.access_log, token, admin_token, ADMIN_METHODS, prechecks(settings.max_texts)
    )
    edge = EdgeServer(settings, server, host, runtime, observer, credentials)
    observed = ObservedServer(server, observer)
    classifier_pb2_grpc.add_ClassifierServicer_to_server(ClassifierServicer(host, settings, supervisor), observed)
    kserve_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(host, settings), observed)
    health_pb2_grpc.add_HealthServicer_to_server(edge.health, observed)
    names = (*SERVICES, HEALTH, reflection.SERVICE_NAME)
    pool = MethodSymbolPool(descriptor_pool.Default())
    servicer = ReflectionServicer(names, pool, settings.stream_idle_s, host.shutting_down)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, observed)
    observed.check()
    if settings.health_port is not None:
        # plaintext, with only the health check (the same statuses): for probes that cannot speak TLS
        edge.health_server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", PROBE_MESSAGE_BYTES),
                ("grpc.so_reuseport", int(share_port)),
                *connection_options(settings),
            ]
        )
        edge.health_server.add_generic_rpc_handlers((probe_handler(edge.health),))
    return edge, None if share_port else edge.bind()


class MethodSymbolPool:
    """A descriptor pool for the reflection service that also finds the file of an RPC by its full name
    (`pkg.Service.Method`), as the reflection protocol asks (`grpcurl describe` sends it); protobuf's upb pool finds
    messages, fields, enums and services but not methods (grpc/grpc#34743). Everything else is the pool's."""

    def __init__(self, pool: descriptor_pool.DescriptorPool):
        self._pool = pool

    def __getattr__(self, name: str):
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, full_name: str):  # the pool's own name, which reflection calls
        try:
            return self._pool.FindFileContainingSymbol(full_name)
        except KeyError:
            service, _, method = full_name.rpartition(".")
            try:
                found = self._pool.FindServiceByName(service)
            except KeyError:
                found = None
            if found is None or method not in found.methods_by_name:
                raise
            return found.file


def probe_handler(servicer: HealthServicer) -> grpc.GenericRpcHandler:
    """The health port's one method, grpc.health.v1's `Check`, which ends at once. The port has no call limit (a
    limit full of held calls would fail the probes) and no token, so `Watch`, a call held open for as long as its
    client likes (about 20 KB of the server's memory each), is left to the gRPC port, under MAX_CONCURRENT_RPCS."""
    check = grpc.unary_unary_rpc_method_handler(
        status_alone(servicer.Check),
        request_deserializer=health_pb2.HealthCheckRequest.FromString,
        response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(HEALTH, {"Check": check})


def _bind(
    server: grpc.aio.Server, settings: Settings, field: str, credentials: grpc.ServerCredentials | None = None
) -> int:
    """Add the listening port of the port setting `field` (TLS with `credentials`) to `server`; the port bound."""
    port = getattr(settings, field)
    address = host_port(settings.host, port)
    try:
        return server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as err:
        raise unbindable(field, settings.host, port, str(err)) from err


def loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop `settings.event_loop` asks for (None: asyncio's own); `SettingsError` for uvloop where it is
    not installed."""
    installed = importlib.util.find_spec("uvloop") is not None
    if settings.event_loop == "uvloop" and not installed:
        raise SettingsError(
            "EDGEDISTILL_EVENT_LOOP=uvloop, but uvloop is not installed: pip install 'edgedistill[serve]'"
        )
    if settings.event_loop == "asyncio" or not installed:
        return None
    import uvloop

    return uvloop.new_event_loop


def run(settings: Settings, supervisor: SupervisorLink | None = None) -> int:
    """`serve` on the event loop that `settings` asks for; its exit status."""
    limit_arenas(settings.malloc_arenas)
    with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
        return runner.run(serve(settings, supervisor))


async def serve(settings: Settings, supervisor: SupervisorLink | None = None) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or a batcher fault (`EXIT_FAULT`), then drain (a SIGTERM/SIGINT during
    the warm-up ends the process at once, with 0, as there is nothing to drain); SIGHUP reloads the bundle
    (one that comes while the first model loads or warms up, once it serves). A reload still running at shutdown
    installs nothing: the drain waits for the step it is in (`ModelHost.close`), but after a fault, which exits at once
    and leaves it in its thread. As a worker of `supervisor`, share the port and report there once serving."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reloads: set[asyncio.Task] = set()  # held: the loop keeps only weak references to its tasks
    warm = reload_due = False

    async def reload_on_signal():
        # ReloadFailed: logged by the host, the current model keeps serving; NotReady: shutdown began, nothing to load
        with contextlib.suppress(ReloadFailed, NotReady):
            await server.reload(trigger="SIGHUP" if supervisor is None else RELAYED)

    def on_hangup():
        nonlocal reload_due
        if not warm:  # the first model is loading or warming up: a reload now could finish first, then be replaced
            reload_due = True
            return
        task = loop.create_task(reload_on_signal())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    def hung_up(number: int, frame) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the process is exiting, the SIGHUP is ignored
            loop.call_soon_threadsafe(on_hangup)

    # Before the bundle is read: a SIGHUP while it loads asks for what the folder holds by then (the default action
    # would end the process). Not the loop's handler: removing that puts back the default action before SIG_IGN
    # replaces it, and a SIGHUP in between would end the drained process by SIGHUP rather than with its status.
    signal.signal(signal.SIGHUP, hung_up)
    server, port = create_server(settings, supervisor)

    async def open_port() -> None:
        await server.start()
        log.info(
            "listening on port %d, %s",
            port,
            "calls need the bearer token EDGEDISTILL_TOKEN"
            if settings.token
            else "calls need no token (set EDGEDISTILL_TOKEN to require one)",
            extra={
                "event": "listening",
                "port": port,
                "metrics_port": server.metrics_port,
                "health_port": server.health_port,
                "tls": settings.tls_cert is not None,
                "token": settings.token is not None,
            },
        )

    stopped_by: list[str] = []

    def on_stop(sig: signal.Signals) -> None:
        stopped_by.append(f"signal {sig.name}")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop, sig)
    try:
        if supervisor is None:  # health says NOT_SERVING until warm, for the probes
            await open_port()
        warming = loop.create_task(server.warm_up(), name="warm-up")
        stopping = loop.create_task(stop.wait())
        await asyncio.wait((warming, stopping), return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not warming.done():  # stopped before serving: no call to drain, and the warm-up's thread cannot be stopped
            # the warm-up's thread may hold a log handler, stuck writing to a full stderr
            exit_with_line(
                0,
                logging.INFO,
                "stopped on %s while warming up",
                (stopped_by[0],),
                {"event": "stopped", "reason": stopped_by[0], "cut_calls": 0},
            )
        try:
            warming.result()
        except BundleRejected as err:
            log.error("warm-up failed: %s", err, extra={"event": "warmup_failed"})
            await server.stop(0, "a failed warm-up")
            return 2
        if supervisor is not None:  # a worker listens once warm: the kernel sends it connections as soon as it listens
            port = server.bind()
            await open_port()
    except Exception:
        await server.close_ports()
        raise
    gc.collect()
    gc.freeze()  # the loaded model and server objects leave the collector's scans: shorter GC pauses
    log.info(
        "serving on port %d",
        port,
        extra={
            "event": "serving",
            "port": port,
            "metrics_port": server.metrics_port,
            "event_loop": type(loop).__module__.split(".")[0],
            "served": asdict(server.host.current.describe()),
        },
    )
    if supervisor is not None:
        supervisor.serving(port)
    warm = True
    if reload_due:
        on_hangup()
    watchdog = LoopWatchdog(loop, settings.batch_timeout_s, exit_on_stall)
    watchdog.start()
    try:
        waits = [loop.create_task(stop.wait()), loop.create_task(server.host.faulted.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        await server.stop(reason=stopped_by[0] if stopped_by else "a server fault")
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the drain is over: a SIGHUP as the process exits is ignored
    finally:
        watchdog.stop()
    if server.host.fault is None:
        return 0
    if server.host.reloading:  # its thread cannot be stopped, and closing the loop would wait for it
        exit_with_line(
            EXIT_FAULT,
            logging.WARNING,
            "exiting with a reload still in its load or warm-up, left in its thread",
            (),
            {"event": "reload_left_running"},
        )
    return EXIT_FAULT


def exit_on_stall(seconds: float) -> None:
    """The event loop ran nothing for `seconds`, past `batch_timeout_s`: a call on it hung, and no coroutine can fail
    the waiting calls or report NOT_SERVING. Exit at once with `EXIT_FAULT` (from the watchdog's thread) for a restart;
    the clients' calls end with UNAVAILABLE as the connections close. The loop may be stuck inside the logging module,
    holding a handler's lock, hence `exit_with_line`."""
    exit_with_line(
        EXIT_FAULT,
        logging.ERROR,
        "server fault, exiting for a restart: the event loop ran nothing for %.1f s (a call on it hung)",
        (seconds,),
        {"event": "server_fault", "stalled_s": round(seconds, 3)},
    )


def exit_with_line(status: int, level: int, message: str, args: tuple, extra: dict) -> None:
    """Exit with `status` at once, after one log line written straight to stderr, past the logging module: another
    thread may hold a handler's lock, blocked writing to stderr (a full pipe). A line not written within
    EXIT_LINE_WAIT_S is left out."""
    record = log.makeRecord(log.name, level, __file__, 0, message, args, None, extra=extra)
    line = (JsonFormatter().format(record) + "\n").encode()
    writer = threading.Thread(target=_write_stderr, args=(line,), name="exit-line", daemon=True)
    writer.start()
    writer.join(EXIT_LINE_WAIT_S)
    os._exit(status)


def _write_stderr(data: bytes) -> None:
    with contextlib.suppress(OSError):  # best effort: the process exits either way
        os.write(2, data)
