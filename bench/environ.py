"""The servers a measurement starts: their flags, the settings those give, and their environment, this process's less
the variables the measurement sets itself.

Light on imports: a peer's server reads it (`bench.peers.model`) in an environment of `make peers-setup`, which has
KServe's or MLServer's packages and ONNX Runtime, not the serving extra's gRPC health and reflection.
"""

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from edgedistill.bench import BenchError
from edgedistill.bench.ports import free_port
from edgedistill.common.cascade import ServedModels, is_cascade
from edgedistill.common.settings import SettingError, refuse_measured_variables, service_link
from edgedistill.serve.settings import Settings, env_name, load_settings

# The deployed server's metrics address and port and its probes' port, which an operator may export: a measurement
# runs its servers' metrics itself (off, or on a loopback port of its own) and checks their health on the gRPC port, so
# these variables are left out of the servers' environment, where METRICS_HOST with the metrics port off would stop the
# server, and where two servers (a cascade and its last member) would bind one health port
PORT_VARIABLES = (env_name("metrics_host"), env_name("metrics_port"), env_name("health_port"))
# A deployed cascade's overload policy, which a server of a single bundle refuses as doing nothing: left out of the
# environment of a measured single bundle (a cascade's last member alone, a student measured beside it)
CASCADE_VARIABLES = (env_name("cascade_overload"),)
# A supervisor's deadline for its workers' start, which an operator of several workers on a GPU exports and a server of
# one process refuses as doing nothing: left out of the environment of a measured server of one process
SUPERVISOR_VARIABLES = (env_name("start_timeout_s"),)


def server_environ(environ: Mapping[str, str] | None = None, left_out: tuple[str, ...] = PORT_VARIABLES) -> dict:
    """The environment of a server a measurement starts: `environ` (default this process's) less `left_out` and less
    Kubernetes service links (`service_link`), which the server would refuse where one lands on a setting's name
    (`EDGEDISTILL_PORT=tcp://...`), though the measurement's flags set those settings."""
    environ = os.environ if environ is None else environ
    return {
        name: value for name, value in environ.items() if name not in left_out and service_link(name, value) is None
    }


def flag_value(command: list[str], flag: str) -> str | None:
    """The value `command` gives `flag`, or None where it does not give it."""
    return command[command.index(flag) + 1] if flag in command else None


def left_out_of(command: list[str]) -> tuple[str, ...]:
    """The variables a measured server's `command` runs without: `PORT_VARIABLES`, `CASCADE_VARIABLES` where its
    `--bundle` (`serve_flags`) is a single bundle, and `SUPERVISOR_VARIABLES` where its `--workers` is 1."""
    bundle = flag_value(command, "--bundle")
    single = bundle is not None and not is_cascade(bundle)
    one_process = flag_value(command, "--workers") == "1"
    return PORT_VARIABLES + (CASCADE_VARIABLES if single else ()) + (SUPERVISOR_VARIABLES if one_process else ())


def measured_settings(flags: list[str]) -> Settings:
    """The settings a measured server given `flags` (`serve_flags`, which refuses TLS) runs with, in the environment
    it runs in."""
    return load_settings(flags, server_environ(left_out=left_out_of(flags)), flags_taken=False)


_said: set[str] = set()  # the variables `say_left_out` has named in this process


# Why each group of variables is left out, and of which servers: what `say_left_out` says of it
LEFT_OUT_BECAUSE = (
    (
        PORT_VARIABLES,
        "the servers measured here: the measurement sets their metrics (off, or on a loopback port of its own) and "
        "checks their health on the gRPC port; the server you deploy reads them as set",
    ),
    (
        CASCADE_VARIABLES,
        "the single bundles measured here, which take no cascade setting; a cascade runs with it, as the one you "
        "deploy does",
    ),
    (
        SUPERVISOR_VARIABLES,
        "the one-process servers measured here, which have no supervisor to time their start; servers of several "
        "workers run with it, as the one you deploy does",
    ),
)


def say_left_out(names: tuple[str, ...]) -> None:
    """Say on stderr, once per process for each of `names`, that the servers measured here run without it, and why:
    a cascade and its last member alone (`bench cascade`) leave out different sets, and each is named once."""
    new = [name for name in names if name not in _said]
    _said.update(new)
    for group, because in LEFT_OUT_BECAUSE:
        if left := [name for name in new if name in group]:
            print(f"[bench] {', '.join(left)} left out of the environment of {because}", file=sys.stderr)


def serve_flags(bundle: Path, port: int, threads: int, workers: int = 1, metrics_port: int | None = None) -> list[str]:
    """The flags of a measured `python -m serve`: `bundle` on loopback `port` with `threads` intra-op threads (0: the
    runtime's default; none for TensorRT engines alone) and `workers` processes, metrics on `metrics_port` (None:
    off), run in `server_environ`. `BenchError` where the environment sets one of the settings these flags set
    (`common.settings.refuse_measured_variables`)."""
    try:
        refuse_measured_variables()
    except SettingError as err:
        raise BenchError(str(err)) from None
    flags = ["--bundle", str(bundle), "--host", "127.0.0.1", "--port", str(port)]
    flags += ["--metrics-port", "off" if metrics_port is None else str(metrics_port), "--workers", str(workers)]
    # a TensorRT engine runs without ONNX Runtime's threads, and the server refuses THREADS for it
    return flags + (["--threads", str(threads)] if ServedModels.read(bundle).onnx_runtime else [])


def measured_server(bundle: Path, threads: int) -> tuple[list[str], Settings]:
    """The flags of one measured server process on `bundle` (`serve_flags`, on a free port) and the settings they
    give with `EDGEDISTILL_*` variables (`measured_settings`)."""
    # One server process: a driver's connection and the CPU figure sample one process.
    flags = serve_flags(bundle, free_port(), threads, workers=1)
    return flags, measured_settings(flags)


def call_metadata(settings: Settings) -> tuple:
    """The metadata a measurement's calls to a server of `settings` send: its TOKEN as a bearer token, if it has one."""
    from edgedistill.serve.client import bearer  # not at the top: it imports gRPC health, which peers lack

    return bearer(settings.token.get_secret_value() if settings.token else None)


def served_settings(bundle: Path, threads: int) -> dict:
    """The settings a measured server on `bundle` runs with (`serve_flags`, then `EDGEDISTILL_*` variables) but its
    port, bundle and reload root, tokens masked: hashed by a measurement's stage, so a changed setting measures again."""
    flags = serve_flags(bundle, 0, threads)
    settings = measured_settings(flags)
    return settings.model_dump(mode="json", exclude={"port", "bundle", "reload_root"})  # a SecretStr dumps masked
