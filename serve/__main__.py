"""`python -m serve --bundle runs/sst2/bundle-cnn-small-folded [--port 50051]`: serve a bundle until SIGTERM, in one
process or, with several WORKERS, in worker processes under a supervisor (`serve.workers`)."""

import logging
import os
import signal
import sys

log = logging.getLogger("serve")


def exit_while_starting(number: int, frame) -> None:
    """SIGTERM or SIGINT before the server (or supervisor) handles it itself: exit 0 at once, with nothing to drain.
    Not by an exception: raised in the middle of an import, a library's import fallback can swallow it."""
    os._exit(0)


def hold_signals() -> None:
    """Signals while the server starts, set before its imports, which take most of a second. A container's first
    process gets no signal it has no handler for, and Python sets none for SIGTERM: a server told to stop while it
    starts would start serving, until SIGKILL. SIGINT (Ctrl-C, which reaches a supervisor's workers too) stops it as
    SIGTERM does, not with Python's KeyboardInterrupt (a worker's, blocked since its start, is taken here). SIGHUP's
    default action ends the process: ignored until the server handles it, before it reads its bundle, so no reload is
    lost."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, exit_while_starting)
    # a supervisor starts its workers with SIGINT blocked (`serve.workers.sigint_held`): one that came since is taken now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, exit_while_starting)  # last: a test waits for it to know both are set


def main(argv: list[str] | None = None, prog: str = "python -m serve") -> int:
    hold_signals()
    # the supervisor of several workers imports no more than it needs (no grpc, ONNX Runtime or request path): its
    # memory is the box's, beside the workers'
    from edgedistill.common.cascade import ServedModels
    from edgedistill.common.grpc_core import quiet_grpc_core
    from edgedistill.serve.errors import BundleRejected
    from edgedistill.serve.logs import configure_logging
    from edgedistill.serve.settings import SettingsError, load_settings, refuse_unused
    from edgedistill.serve.workers import SupervisorLink, supervise, warn_oversubscribed, worker_count

    try:
        settings = load_settings(argv, prog=prog)
    except SettingsError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    quiet_grpc_core()
    try:
        supervisor = SupervisorLink.from_environ()
        if supervisor is None:  # a worker runs with the metrics port off and the deployment's METRICS_HOST
            models = None if settings.bundle is None else ServedModels.read(settings.bundle)  # its manifests, once
            refuse_unused(settings, count := worker_count(settings, models))
            warn_oversubscribed(settings, count, models)
            if count > 1:
                return supervise(settings, sys.argv[1:] if argv is None else list(argv), count, models)
        from edgedistill.serve.app import run

        status = run(settings, supervisor)
    except (BundleRejected, SettingsError, OSError) as err:
        log.error("cannot start: %s", err, extra={"event": "start_failed"})
        return 2
    except ModuleNotFoundError:  # an extra not installed: the `edgedistill` command names the install
        raise
    except Exception:  # noqa: BLE001 - logged with its traceback; the status is the edgedistill command's for a crash
        from edgedistill.cli import CRASHED

        # a JSON line like every other, with the traceback in `exc`: a log pipeline would split a bare traceback
        log.exception("stopped by an unexpected error", extra={"event": "crashed", "exit_status": CRASHED})
        return CRASHED
    from edgedistill.serve.batching import calls_left_running

    if calls_left_running():  # a hung backend call holds a worker thread, which a normal exit would wait for
        logging.shutdown()
        os._exit(status)
    return status


if __name__ == "__main__":
    hold_signals()  # before the command's handling is imported
    from edgedistill.cli import run_module

    # as it was run: `serve` in a checkout, `edgedistill.serve`
    run_module(main, f"python -m {__spec__.parent}", "serve")
