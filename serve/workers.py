"""WORKERS=N: N server processes on one port, under a supervisor that starts, watches and stops them.

One Python process is bound by its event loop, about one core. With `WORKERS` above 1, `python -m
serve` becomes a supervisor: it reserves the port (and the health port), starts N workers, each a whole
`python -m serve` with its own model that binds the same port with SO_REUSEPORT (the kernel spreads
connections over them), and serves /metrics itself, summed over the workers with prometheus-client's
multiprocess mode (a fresh folder per start, `PROMETHEUS_MULTIPROC_DIR` for the workers). SIGTERM and
SIGINT drain every worker, SIGHUP reloads every worker, and so does a Reload call (without a path) that reached one.

A worker that exits on its own (a batcher fault, a crash) is restarted; the others keep serving meanwhile.
A worker that exits before it ever served (at start, or restarted onto a bundle that no longer loads), one that has
not served within START_TIMEOUT_S of its start (killed: it hangs in its model's load or warm-up), or
more than RESTARTS_PER_MINUTE restarts a minute, stop the supervisor: it drains the rest and exits with
that worker's status, for the orchestrator to take over; so does a worker that cannot be started or restarted for want
of a process (EAGAIN under a pids limit, EMFILE), with EXIT_NO_PROCESS. Workers die with the supervisor (Linux's
parent-death signal), so none outlives it.

`WORKERS=0` (the default) picks one worker per usable core (affinity and cgroup CPU quota), as many as the
usable memory (cgroup limit, else what is available) holds at `worker_bytes` each (WORKER_BASE_BYTES, twice the model
file as a reload holds two models, a cascade's model files being its members' together, and the messages of the calls
in progress), and at least one. `WORKERS=1` is a single process, no supervisor.
"""

import contextlib
import errno
import fcntl
import importlib.util
import json
import logging
import os
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from edgedistill.common.cascade import ServedModels
from edgedistill.common.machine import affinity_cores, usable_cores, usable_memory
from edgedistill.common.processes import die_with_parent, python_module, shell_status
from edgedistill.serve.errors import BundleRejected
from edgedistill.serve.exposition import WorkerFiles, serve_http, stop_http, workers_registry
from edgedistill.serve.malloc import arena_limit
from edgedistill.serve.ports import reserve_port
from edgedistill.serve.settings import Settings, SettingsError

log = logging.getLogger("serve")

SUPERVISOR_VAR = "SERVE_SUPERVISOR"  # "<supervisor pid>:<fd>" in a worker's environment: where to report
RELAYED = "SIGHUP from the supervisor (its workers_reload line says why)"  # a worker's reload trigger
WORKER_BASE_BYTES = 200 << 20  # resident memory of a worker before its model: Python, gRPC, ONNX Runtime, buffers
RESTARTS_PER_MINUTE = 10
STOP_MARGIN_S = 10.0  # beyond SHUTDOWN_GRACE_S, how long workers may take to exit before they are killed
KILL_WAIT_S = 2.0  # how long a killed worker may take to exit before the supervisor leaves it behind
# what a worker imports that an install may lack: the `serve` extra's, and ONNX Runtime (the `cpu` or `gpu` extra's),
# which every worker imports (`common.runtime`), one serving TensorRT engines alone too
WORKER_PACKAGES = ("grpc", "grpc_health", "grpc_reflection", "onnxruntime")
EXIT_NO_PROCESS = os.EX_OSERR  # 71 (sysexits.h: cannot fork, cannot create a pipe): a worker could not be started
SUPERVISING = "supervising"  # the `event` of a supervisor's first log line
WORKERS_SERVING = "workers_serving"  # and of its line once every worker serves


# --- how many -------------------------------------------------------------------------------------------------


def intra_op_threads(threads: int, count: int) -> int:
    """Intra-op threads of each of `count` server processes (WORKERS) for THREADS=`threads`: as set, else the usable
    cores shared among them. A single process under no CPU quota keeps 0, ONNX Runtime's default (a thread per core of
    its affinity); ONNX Runtime does not see a quota, and would run more threads than the quota has CPUs, throttled."""
    if threads:
        return threads
    cores = usable_cores()
    if count == 1 and cores == affinity_cores():
        return 0
    return max(1, cores // count)


def worker_bytes(model_bytes: int, settings: Settings | None = None) -> int:
    """The memory counted for one worker serving model files of `model_bytes` with `settings` (None: the defaults):
    its base, the models twice, as a reload holds the old beside the new, and the calls clients can stall
    mid-message, MAX_CONCURRENT_RPCS of them holding about twice MAX_MESSAGE_BYTES each."""
    settings = settings or Settings()
    stalled = settings.max_concurrent_rpcs * 2 * settings.max_message_bytes
    return WORKER_BASE_BYTES + 2 * model_bytes + stalled


def worker_count(settings: Settings, models: ServedModels | None = None) -> int:
    """`settings.workers`, or for 0 one per usable core, as many as memory holds at `worker_bytes` each with the
    bundle's model files (`models`, read from the bundle where not given), and at least one. Several workers set by
    hand that memory does not hold are started all the same, with a warning: the kernel's OOM killer ends a process
    without a word, and this line says why it may."""
    if settings.workers == 1:
        return 1
    if settings.bundle is None:
        raise SettingsError("no bundle to serve: pass --bundle or set EDGEDISTILL_BUNDLE")
    models = models or ServedModels.read(settings.bundle)
    if models.refused is not None:
        if settings.workers:  # the workers refuse it, and say why
            return settings.workers
        raise BundleRejected(f"bundle refused: {models.refused}")
    per_worker = worker_bytes(models.model_bytes, settings)
    memory = usable_memory()
    if not settings.workers:
        return max(1, min(usable_cores(), memory // per_worker))
    if settings.workers * per_worker > memory:
        log.warning(
            "WORKERS=%d may not fit in the usable memory (%d MiB, the cgroup's limit or what is available): each worker "
            "counts %d MiB; the kernel may kill the server without a log line. Set EDGEDISTILL_WORKERS=0 to fit them to "
            "memory",
            settings.workers,
            memory >> 20,
            per_worker >> 20,
            extra={"event": "workers_exceed_memory", "workers": settings.workers, "usable_memory_mib": memory >> 20},
        )
    return settings.workers


def warn_oversubscribed(settings: Settings, count: int, models: ServedModels | None) -> None:
    """Warn where `count` server processes run more ONNX Runtime intra-op threads in all than the usable cores (THREADS
    set by hand, or WORKERS above the cores): they take turns on the cores, so each batch runs slower than on fewer,
    and the event loops wait for them. A TensorRT engine runs none. `models`: the bundle's (None without a bundle)."""
    if models is None or not models.onnx_runtime:
        return
    cores, each = usable_cores(), intra_op_threads(settings.threads, count)  # 0: ONNX Runtime's own, one per core
    if each * count > cores:
        log.warning(
            "%d server process(es) of %d intra-op thread(s) each run %d threads on %d usable core(s): they take turns, "
            "each batch slower than on fewer threads. Set EDGEDISTILL_THREADS=0 and EDGEDISTILL_WORKERS=0 to fit them to "
            "the cores",
            count,
            each,
            each * count,
            cores,
            extra={"event": "threads_exceed_cores", "threads": each, "workers": count, "cores": cores},
        )


# --- the worker's side ----------------------------------------------------------------------------------------


METRICS_PREFIX = "edgedistill-metrics-"


class MetricsFolder:
    """A fresh folder for the workers' metrics files, `edgedistill-metrics-*` in the temporary folder, locked (flock)
    while its supervisor lives. A start first removes this user's folders that no lock holds: those of supervisors
    killed before they could remove their own. The lock, not a pid, tells a live folder apart: a temporary folder
    shared by containers holds folders of supervisors in other pid namespaces, each of them pid 1 in its own."""

    def __init__(self):
        root = Path(tempfile.gettempdir())
        for folder in root.glob(f"{METRICS_PREFIX}*"):
            try:
                found = folder.lstat()  # a link is no folder of ours
            except FileNotFoundError:  # removed meanwhile, by the supervisor that held it
                continue
            if stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid():
                _remove_unheld(folder)
        while True:
            self.path = Path(tempfile.mkdtemp(prefix=METRICS_PREFIX))
            try:
                self.lock = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)  # not inherited: workers never hold it
            except FileNotFoundError:  # another start took it, not locked yet, for a dead one's and removed it
                continue
            fcntl.flock(self.lock, fcntl.LOCK_EX)  # waits for another start that took it for a dead one's to remove it
            if _is_open(self.lock, self.path):
                return
            os.close(self.lock)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self.lock)


def _is_open(fd: int, path: Path) -> bool:
    """Whether `path` is still the file that `fd` has open."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _remove_unheld(folder: Path) -> None:
    """Remove `folder` unless a live supervisor holds its lock."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # removed meanwhile
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass
    else:
        if _is_open(fd, folder):
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(fd)


class SupervisorLink:
    """A worker's tie to its supervisor: it dies with it, and reports on a pipe when it serves."""

    def __init__(self, fd: int):
        self.pipe = os.fdopen(fd, "w", buffering=1)

    @classmethod
    def from_environ(cls) -> "SupervisorLink | None":
        """The link when this process is a worker (SUPERVISOR_VAR set), else None; `SettingsError` for a value no
        supervisor set."""
        value = os.environ.pop(SUPERVISOR_VAR, None)
        if value is None:
            return None
        try:
            supervisor, fd = (int(part) for part in value.split(":"))
            link = cls(fd)
        except (ValueError, OSError) as err:
            reason = f" ({err.strerror})" if isinstance(err, OSError) else ""
            raise SettingsError(
                f"{SUPERVISOR_VAR}={value!r} is not a supervisor's '<pid>:<pipe>'{reason}: the variable is internal to "
                "the server's supervisor, which sets it for its workers; unset it"
            ) from err
        die_with_parent(supervisor)  # SIGTERM, a drain, when the supervisor dies
        return link

    def serving(self, port: int) -> None:
        self.pipe.write(json.dumps({"pid": os.getpid(), "port": port}) + "\n")

    def reloaded(self) -> None:
        """A Reload call reloaded this worker's served folder: the supervisor reloads the others (SIGHUP)."""
        self.pipe.write(json.dumps({"pid": os.getpid(), "reloaded": True}) + "\n")


# --- the supervisor's side ------------------------------------------------------------------------------------


@contextlib.contextmanager
def sigint_held():
    """SIGINT blocked in this thread meanwhile, and so in a worker started meanwhile, which inherits the mask: a Ctrl-C
    that reaches the worker while Python starts stays pending until its handler is set (`serve.__main__.hold_signals`
    unblocks it), where it would raise KeyboardInterrupt mid-start and end it with a traceback and status 1. A SIGINT
    to the supervisor meanwhile is not lost: another of its threads takes it, or this one once the block ends."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@dataclass(eq=False)
class Worker:
    index: int
    proc: subprocess.Popen
    reports: BinaryIO  # the read end of its report pipe
    start_deadline: float  # time.monotonic() by which it must serve (START_TIMEOUT_S after its start)
    serving: bool = False
    reload_due: bool = False  # a SIGHUP came before it served: it gets one once it does
    buffer: bytes = field(default=b"")


def signal_name(number: int) -> str:
    """`SIGKILL` for 9; a number of no name (a real-time signal's) as `signal 40`."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Supervisor:
    """Starts `count` workers from the flags `argv` (and this environment), keeps them running, stops them."""

    def __init__(self, settings: Settings, argv: list[str], count: int, models: ServedModels):
        self.settings = settings
        self.argv = argv
        self.count = count
        refuse_missing_packages()
        # each worker's intra-op threads, as it works them out; none where every model is a TensorRT engine
        self.threads = intra_op_threads(settings.threads, count) if models.onnx_runtime else None
        self.ports = [reserve_port(settings.host, settings.port, "port")]
        if settings.health_port is not None:
            self.ports.append(reserve_port(settings.host, settings.health_port, "health_port"))
        self.port = self.ports[0].port
        self.metrics_folder = MetricsFolder()
        self.metric_files = WorkerFiles(self.metrics_folder.path)
        self.metrics_http = None
        self.metrics_port: int | None = None
        self.workers: list[Worker] = []
        self.restarts: deque[float] = deque()
        self.selector = selectors.DefaultSelector()
        self.stopping = False
        self.stop_deadline = 0.0
        self.exit_status = 0
        self.received: list[int] = []  # signals caught, not yet handled

    def _command(self) -> list[str]:
        # WORKERS: how many share the cores, for a worker's intra-op threads under THREADS=0 (a worker never supervises)
        pinned = ["--workers", str(self.count), "--port", str(self.port), "--metrics-port", "off"]
        if len(self.ports) > 1:
            pinned += ["--health-port", str(self.ports[1].port)]
        return python_module("edgedistill.serve", *self.argv, *pinned)  # later flags win

    def _start(self, index: int, restarted: bool = False) -> Worker:
        """Worker `index`, started; `OSError` where its process or pipe cannot be made, with no descriptor left open."""
        read, write = os.pipe()
        env = os.environ | {
            SUPERVISOR_VAR: f"{os.getpid()}:{write}",
            "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_folder.path),
        }
        try:
            with sigint_held():
                proc = subprocess.Popen(self._command(), env=env, pass_fds=(write,))
        except OSError:
            os.close(read)
            raise
        finally:
            os.close(write)
        reports = os.fdopen(read, "rb", buffering=0)
        worker = Worker(index, proc, reports, time.monotonic() + self.settings.start_timeout_s)
        self.selector.register(reports, selectors.EVENT_READ, worker)
        self.workers.append(worker)
        log.info(
            "worker %d started, pid %d",
            index,
            proc.pid,
            extra={"event": "worker_started", "worker": index, "worker_pid": proc.pid, "restart": restarted},
        )
        return worker

    def run(self) -> int:
        """Until SIGTERM or SIGINT (exit 0 when every worker drained cleanly), a worker that cannot serve (exit with
        its status) or one that cannot be started or restarted (EXIT_NO_PROCESS)."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        os.set_blocking(wake_read, False)
        previous_wakeup = signal.set_wakeup_fd(wake_write)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, lambda number, frame: self.received.append(number))
        self.selector.register(wake_read, selectors.EVENT_READ, None)
        try:
            if self.settings.metrics_port is not None:
                registry = workers_registry(self.metric_files, self._live_pids)
                self.metrics_http = serve_http(registry, self.settings.metrics_host, self.settings.metrics_port)
                self.metrics_port = self.metrics_http.server_port
            log.info(
                "supervising %d workers on port %d",
                self.count,
                self.port,
                extra={"event": SUPERVISING, "port": self.port, "metrics_port": self.metrics_port,
                       "health_port": self.ports[1].port if len(self.ports) > 1 else None,
                       "workers": self.count, "threads": self.threads},
            )  # fmt: skip
            for index in range(self.count):
                if not self._launch(index):
                    break
            announced = False
            while self.workers:
                for key, _ in self.selector.select(timeout=1.0):
                    if key.data is None:
                        os.read(wake_read, 512)
                    else:
                        self._read_reports(key.data)
                self._take_signals()
                self._reap()
                self._time_out_starts()
                if not announced and not self.stopping and all(w.serving for w in self.workers):
                    announced = True
                    log.info(
                        "%d workers serving on port %d",
                        self.count,
                        self.port,
                        extra={"event": WORKERS_SERVING, "port": self.port, "metrics_port": self.metrics_port,
                               "workers": [w.proc.pid for w in self.workers]},
                    )  # fmt: skip
            log.info(
                "every worker exited, exit status %d",
                self.exit_status,
                extra={"event": "workers_stopped", "exit_status": self.exit_status},
            )
            return self.exit_status
        finally:
            self._kill_all()
            signal.set_wakeup_fd(previous_wakeup)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # its default action would end the exiting supervisor by it
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            os.close(wake_read)
            os.close(wake_write)
            self._close()

    def _read_reports(self, worker: Worker) -> None:
        data = worker.reports.read(4096)
        if not data:  # the worker closed its end: it is exiting
            self.selector.unregister(worker.reports)
            return
        worker.buffer += data
        *lines, worker.buffer = worker.buffer.split(b"\n")
        for line in lines:
            if not worker.serving:  # its first report
                worker.serving = True
                if worker.reload_due:
                    worker.proc.send_signal(signal.SIGHUP)
            elif json.loads(line).get("reloaded"):
                self._reload(f"a Reload call to worker {worker.index}", done=worker)

    def _take_signals(self) -> None:
        while self.received:
            self._on_signal(self.received.pop(0))

    def _on_signal(self, number: int) -> None:
        if number in (signal.SIGTERM, signal.SIGINT):
            self._stop(0, f"signal {signal.Signals(number).name}")
        elif number == signal.SIGHUP:
            self._reload("signal SIGHUP")

    def _reload(self, why: str, done: Worker | None = None) -> None:
        """SIGHUP every worker but `done` (reloaded already): each reloads its served folder, and logs `RELAYED` as
        what asked for it (this line says why)."""
        if self.stopping:
            return
        log.info("reloading every worker: %s", why, extra={"event": "workers_reload", "trigger": why})
        for worker in self.workers:
            if worker is done:
                continue
            if worker.serving:
                worker.proc.send_signal(signal.SIGHUP)
            else:  # SIGHUP would end a worker that has no handler for it yet
                worker.reload_due = True

    def _stop(self, status: int, why: str) -> None:
        """Drain every worker (SIGTERM); exit with `status` once they are gone."""
        if self.stopping:
            return
        self.stopping = True
        self.exit_status = status
        self.stop_deadline = time.monotonic() + self.settings.shutdown_grace_s + STOP_MARGIN_S
        extra = {"event": "workers_stopping", "exit_status": status, "reason": why}
        log.info("stopping the workers: %s", why, extra=extra)
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)

    def _time_out_starts(self) -> None:
        """Kill (SIGKILL) every worker that has not served by its start deadline and stop, as for one that exited
        before it served: hung in its model's load or warm-up (a hung mount, a stuck GPU), it would hold its share of
        the port's capacity for good. The supervisor stops at once, for a worker that SIGKILL cannot end yet (a mount's
        wait)."""
        if self.stopping:
            return
        now = time.monotonic()
        late = [worker for worker in self.workers if not worker.serving and now >= worker.start_deadline]
        for worker in late:
            log.error(
                "worker %d (pid %d) did not serve within %g s of its start, killed; raise EDGEDISTILL_START_TIMEOUT_S "
                "if its model takes longer to load and warm up",
                worker.index,
                worker.proc.pid,
                self.settings.start_timeout_s,
                extra={"event": "worker_start_timeout", "worker": worker.index, "worker_pid": worker.proc.pid,
                       "start_timeout_s": self.settings.start_timeout_s},
            )  # fmt: skip
            worker.proc.kill()
        if late:
            self._stop(shell_status(-signal.SIGKILL), f"worker {late[0].index} did not serve within START_TIMEOUT_S")

    def _reap(self) -> None:
        for worker in list(self.workers):
            status = worker.proc.poll()
            if status is None:
                continue
            # a Ctrl-C reaches the workers with this process: its SIGINT came first, though caught only now
            self._take_signals()
            self.workers.remove(worker)
            self._forget(worker)
            # killed by the signal: stopped before its handler was set (Ctrl-C reaches the workers too)
            drained = self.stopping and status in (0, -signal.SIGTERM, -signal.SIGINT)
            killed_by = {"signal": signal_name(-status)} if status < 0 else {}
            log.log(
                logging.INFO if drained else logging.ERROR,
                "worker %d (pid %d) exited with status %d%s",
                worker.index,
                worker.proc.pid,
                shell_status(status),
                f" (killed by {killed_by['signal']})" if killed_by else "",
                extra={"event": "worker_exited", "worker": worker.index, "worker_pid": worker.proc.pid,
                       "status": shell_status(status), **killed_by, "was_serving": worker.serving},
            )  # fmt: skip
            if self.stopping:
                if not drained and self.exit_status == 0:
                    self.exit_status = shell_status(status)
                continue
            now = time.monotonic()
            self.restarts.append(now)
            while self.restarts and self.restarts[0] < now - 60:
                self.restarts.popleft()
            if not worker.serving:
                self._stop(shell_status(status) or 1, f"worker {worker.index} exited before it served")
            elif len(self.restarts) > RESTARTS_PER_MINUTE:
                self._stop(shell_status(status) or 1, f"more than {RESTARTS_PER_MINUTE} restarts a minute")
            else:
                self._launch(worker.index, restarted=True)
        if self.stopping and time.monotonic() > self.stop_deadline:
            self._kill_all()

    def _launch(self, index: int, restarted: bool = False) -> bool:
        """Start worker `index` (again, `restarted`); whether it started. Where no process can be made, drain the
        others and exit EXIT_NO_PROCESS."""
        verb = "restart" if restarted else "start"
        try:
            self._start(index, restarted)
        except OSError as err:
            log.error(
                "cannot %s worker %d: %s; raise the container's pids or open-files limit, or lower EDGEDISTILL_WORKERS",
                verb,
                index,
                err,
                extra={"event": f"worker_{verb}_failed", "worker": index, "errno": errno.errorcode.get(err.errno)},
            )
            self._stop(EXIT_NO_PROCESS, f"worker {index} could not be {verb}ed")
            return False
        return True

    def _live_pids(self) -> dict[int, int]:
        """Worker index -> pid of each worker still running (read by the metrics thread)."""
        return {w.index: w.proc.pid for w in list(self.workers) if w.proc.returncode is None}

    def _forget(self, worker: Worker) -> None:
        """A worker that exited: its report pipe closed, its live gauges dropped from the metrics, its counters and
        histograms added to the retired workers' files."""
        if worker.reports.fileno() in self.selector.get_map():
            self.selector.unregister(worker.reports)
        worker.reports.close()
        self.metric_files.retire(worker.proc.pid)

    def _kill_all(self) -> None:
        """SIGKILL every worker still running, then wait for them to exit, KILL_WAIT_S in all. One that has not exited
        by then (asleep in the kernel: a hung mount, a GPU driver) is left behind, counted as killed, so that the
        supervisor still exits and reaps the others."""
        running = [worker for worker in self.workers if worker.proc.poll() is None]
        for worker in running:
            worker.proc.kill()
        deadline = time.monotonic() + KILL_WAIT_S
        for worker in running:
            try:
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
                left_behind = False
            except subprocess.TimeoutExpired:
                left_behind = True
                self.workers.remove(worker)
                self._forget(worker)
                self.exit_status = self.exit_status or shell_status(-signal.SIGKILL)
            log.error(
                "worker %d (pid %d) did not stop, killed%s",
                worker.index,
                worker.proc.pid,
                f"; it did not exit within {KILL_WAIT_S:g} s, left behind" if left_behind else "",
                extra={"event": "worker_killed", "worker": worker.index, "worker_pid": worker.proc.pid,
                       "exited": not left_behind},
            )  # fmt: skip

    def _close(self) -> None:
        if self.metrics_http is not None:
            stop_http(self.metrics_http)
        for reservation in self.ports:
            reservation.close()
        self.selector.close()
        self.metrics_folder.remove()


def supervise(settings: Settings, argv: list[str], count: int, models: ServedModels) -> int:
    """Run `count` workers of `python -m serve` with the flags `argv` (and the bundle's `models`, as read at start);
    the exit status (see the module doc). Refused before any worker starts: a malloc arena limit that every worker
    would refuse (`arena_limit`: `SettingsError` or OSError), told once rather than by each; a RELOAD_ROOT
    (`SettingsError`), which no worker could use: a Reload call naming a bundle reaches one."""
    arena_limit(settings.malloc_arenas)
    if settings.reload_root is not None:
        raise SettingsError(
            f"EDGEDISTILL_RELOAD_ROOT lets a Reload call name a bundle, which a server of {count} workers "
            f"(EDGEDISTILL_WORKERS={settings.workers}) refuses, as the call reaches one of them: set "
            "EDGEDISTILL_WORKERS=1, or unset EDGEDISTILL_RELOAD_ROOT"
        )
    return Supervisor(settings, argv, count, models).run()


def refuse_missing_packages() -> None:
    """`ModuleNotFoundError` naming a package the workers would import that is not installed (WORKER_PACKAGES), before
    any starts, as one server process raises it at its import (the `edgedistill` command names the install): the
    supervisor imports none of them."""
    for name in WORKER_PACKAGES:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
