"""Server settings: typed, from flags and `EDGEDISTILL_*` environment variables (flags win).

Each field is declared once; its flag (`--max-batch-size`) and variable (`EDGEDISTILL_MAX_BATCH_SIZE`)
are derived from the name. Unknown `EDGEDISTILL_*` variables and wrong values fail at load; Kubernetes' service links
(`common.settings.service_link`) are no settings, and one that sets a setting's variable is refused as such.
"""

import argparse
import ipaddress
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from edgedistill.common.arguments import ArgumentParser
from edgedistill.common.machine import usable_cores, usable_memory
from edgedistill.common.names import did_you_mean
from edgedistill.common.providers import known_providers
from edgedistill.common.settings import ENV_PREFIX, PIPELINE, SettingError, service_link, under_home
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

# The largest integer option gRPC takes (a C int): a message size, a call count, a time in ms. gRPC reads that time
# as never: a duration of NEVER_S seconds or more (capped there as ms) never runs out.
GRPC_INT_MAX = 2**31 - 1
NEVER_S = math.ceil(GRPC_INT_MAX / 1000)
MIN_MESSAGE_BYTES = 1024  # the smallest MAX_MESSAGE_BYTES: a request this small fits every server
DEFAULT_PORT = 50051  # gRPC's customary port: the server's, and the one the client calls on localhost


class SettingsError(SettingError):
    """Server settings that cannot be used, with the flag and the variable to fix: a `SettingError`, so that one
    `except` takes a bad setting of the pipeline's or the server's."""


def folder_problem(path: Path) -> str | None:
    """Why `path` is no folder to read (it does not exist, is a file, cannot be looked at), or None for a folder."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    return None if stat.S_ISDIR(mode) else "is a file, not a folder"


def blank(value) -> bool:
    """Whether a value given as text says 'nothing': empty, whitespace, 'none' or 'off'."""
    return isinstance(value, str) and value.strip().lower() in ("", "off", "none")


def sendable(token: str) -> bool:
    """Whether gRPC metadata can carry `token`: printable ASCII, as its values are."""
    return token.isascii() and token.isprintable()


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    bundle: Path | None = Field(None, description="bundle folder to serve, e.g. runs/sst2/bundle-cnn-small-folded")
    host: str = Field("[::]", description="address to bind the gRPC port (and the health port) to")
    metrics_host: str = Field(
        "127.0.0.1",
        description="address to bind the metrics port to: loopback, so only this machine reads it; '[::]' or "
        "'0.0.0.0' exposes it (a Kubernetes scrape needs that); refused with METRICS_PORT off",
    )
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="gRPC port (0: any free port)")
    metrics_port: int | None = Field(
        8002, ge=0, le=65535, description="Prometheus /metrics HTTP port (0: any free port; 'off': none)"
    )
    health_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="a second, plaintext port serving only grpc.health.v1's Check, for probes when the main port uses "
        "TLS (0: any free port; 'off': none)",
    )
    max_batch_size: int = Field(
        32,
        ge=1,
        description="most rows (texts) per backend call; above MAX_QUEUED, which no batch outgrows, MAX_QUEUED",
    )
    max_queue_delay_ms: float = Field(
        0.0,
        ge=0,
        description="longest a row waits for a batch to fill; 0 runs a batch as soon as the backend is free, "
        "batching the rows that arrived while it was busy",
    )
    inline_infer_ms: float = Field(
        1.0,
        ge=0,
        description="a batch the backend is expected to finish within this many ms runs on the event loop, "
        "saving the hop to the worker thread and back: lower latency at light load; smaller values keep more "
        "batches in the thread, which overlaps them with the event loop's work: more calls/s at saturation; "
        "0: always the worker thread",
    )
    # ModelInfo and ModelConfig carry MAX_TEXTS and the batch size (at most MAX_QUEUED) as int32
    max_queued: int = Field(1024, ge=1, le=GRPC_INT_MAX, description="rows allowed to wait; more: RESOURCE_EXHAUSTED")
    max_texts: int = Field(64, ge=1, le=GRPC_INT_MAX, description="texts per request; more: RESOURCE_EXHAUSTED")
    max_text_chars: int = Field(4096, ge=1, description="longer texts are cut to this many characters")
    max_message_bytes: int = Field(
        1 << 20,
        ge=MIN_MESSAGE_BYTES,
        le=GRPC_INT_MAX,
        description="largest gRPC message a client may send (replies are not limited); a call still receiving its "
        "message holds up to about twice this much memory",
    )
    max_concurrent_rpcs: int = Field(
        256,
        ge=1,
        le=GRPC_INT_MAX,
        description="calls in progress at once, over all connections; more: RESOURCE_EXHAUSTED; with "
        "MAX_MESSAGE_BYTES it bounds the memory of messages being received",
    )
    max_concurrent_streams: int | None = Field(
        None,
        ge=1,
        le=GRPC_INT_MAX,
        description="calls in progress at once on one HTTP/2 connection; a client holds back calls past it, but the "
        "server frees a call's stream only once the client has seen the call end, so some calls on a connection kept "
        "near the limit, or past it, are refused (UNAVAILABLE, 'RST_STREAM with error code 7'); unset: twice "
        "MAX_CONCURRENT_RPCS, room enough for one connection to carry every call that limit allows",
    )
    stream_idle_s: float = Field(
        60.0,
        gt=0,
        description="a ClassifyStream or reflection stream that receives no request for this long, not counting the "
        "time its replies take to make (its client sends none, or reads no reply), is ended with DEADLINE_EXCEEDED",
    )
    connection_idle_s: float = Field(
        300.0, gt=0, description="a connection with no call for this long is closed (GOAWAY; clients reconnect)"
    )
    connection_age_s: float = Field(
        600.0,
        gt=0,
        description="a connection is closed after this long (GOAWAY; clients reconnect), its calls given "
        "CONNECTION_AGE_GRACE_S more: bounds how long a client can hold a call it never finishes sending",
    )
    connection_age_grace_s: float = Field(
        30.0, ge=0, description="how long calls may still finish on a connection closed for its age"
    )
    keepalive_s: float = Field(
        60.0,
        gt=0,
        description="a connection with calls but no traffic for this long is pinged, and closed when no answer "
        "comes within 20 s: a vanished client frees its calls",
    )
    handshake_timeout_s: float = Field(
        10.0, gt=0, description="a new connection must finish its TLS and HTTP/2 handshake within this long"
    )
    workers: int = Field(
        0,
        ge=0,
        description="server processes sharing the port, one model each, under a supervisor that sums their metrics; "
        "0: one per usable core, as many as memory holds; 1: one process, no supervisor; more than the usable cores "
        "is warned of at start (their threads take turns on the cores)",
    )
    threads: int = Field(
        0,
        ge=0,
        le=GRPC_INT_MAX,  # ONNX Runtime takes a C int
        description="intra-op threads of the runtime (0: the usable cores, within a cgroup CPU quota, shared among "
        "the WORKERS; one process without a quota leaves it to ONNX Runtime, a thread per core of its affinity); "
        "more in all than the usable cores is warned of at start; each member of a cascade has these threads (the "
        "warning counts one member's: the later ones run only on the texts escalated to them); refused where every "
        "model is a TensorRT engine, which runs without ONNX Runtime",
    )
    malloc_arenas: int | None = Field(
        None,
        ge=0,
        le=GRPC_INT_MAX,  # mallopt takes a C int
        description="most glibc malloc arenas (M_ARENA_MAX): more keep freed memory per thread, so floods of "
        "traffic raise the server's memory further; unset: 2 where the C library is glibc, unless glibc's own "
        "MALLOC_ARENA_MAX or GLIBC_TUNABLES glibc.malloc.arena_max sets the limit, which is left to them (a value of "
        "theirs not written as a positive decimal number, which glibc ignores or reads otherwise, is refused at start); 0: glibc's default (8 per core); "
        "other values need glibc",
    )
    spin: bool = Field(
        False,
        description="let ONNX Runtime's intra-op threads spin while they wait for work: slightly lower latency "
        "under constant load, but idle threads keep a core busy, taken from the gRPC event loop on a small machine; "
        "refused where every model is a TensorRT engine, which runs without ONNX Runtime",
    )
    providers: list[str] = Field(
        [],
        description="ONNX Runtime execution providers, comma-separated, in priority order (empty: the bundle's); a name "
        "ONNX Runtime has in no build is refused, naming the nearest, as are a provider named twice and one after the "
        "CPU's, which would run nothing; refused where every model is a TensorRT engine, which runs "
        "without ONNX Runtime",
    )
    allow_cpu_fallback: bool = Field(
        False,
        description="serve on the CPU when a requested GPU execution provider is not active (logged as a warning); "
        "off: such a bundle is refused, naming the requested and active providers; refused where every model is a "
        "TensorRT engine, which runs on its GPU or not at all",
    )
    start_timeout_s: float = Field(
        120.0,
        gt=0,
        description="under a supervisor (WORKERS above 1), a worker that has not loaded and warmed up its model within "
        "this many seconds of its start (a hung mount, a stuck GPU) is killed, and the supervisor stops as for a "
        "worker that exited before it served; the default is the startup probe's budget in deploy/k8s (60 x 2 s)",
    )
    shutdown_grace_s: float = Field(10.0, ge=0, description="how long in-flight calls may finish on SIGTERM")
    batch_timeout_s: float = Field(
        30.0,
        gt=0,
        description="longest one backend call may run; past it the backend counts as hung: the waiting calls fail "
        "with UNAVAILABLE, health turns NOT_SERVING and the process exits with status 3 for a restart (a call run "
        "inline on the event loop blocks it: the loop's watchdog then exits at once, and the calls end UNAVAILABLE)",
    )
    tls_cert: Path | None = Field(
        None,
        description="server certificate chain (PEM); enables TLS (unset: plaintext; an empty value is refused). The "
        "TLS files are read again at the first handshake after one changed: a rotated certificate serves new "
        "connections without a restart",
    )
    tls_key: Path | None = Field(None, description="server private key (PEM)")
    tls_ca: Path | None = Field(None, description="CA bundle (PEM) that client certificates must chain to: mutual TLS")
    token: SecretStr | None = Field(
        None,
        description="bearer token clients must send ('authorization: Bearer ...'); unset: none, and an empty value is "
        "refused; prefer the variable, flags show in ps",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="bearer token the Reload call must send instead of TOKEN; unset: Reload is refused "
        "(PERMISSION_DENIED), and only SIGHUP reloads",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description="the event loop: uvloop (libuv's, less work per call), asyncio's own, or auto: uvloop where it "
        "is installed (the `serve` extra installs it)",
    )
    reload_root: Path | None = Field(
        None,
        description="Reload calls may name bundles inside this folder, a relative bundle_path naming one of its "
        "folders; needs ADMIN_TOKEN, and one worker (WORKERS=1, or 0 on one core): a call reaches one worker; unset: "
        "Reload only reloads the bundle being served",
    )
    access_log: bool = Field(
        False,
        description="log every call at INFO, successful ones too, where a failed call other than a server error is "
        "otherwise logged at most once a second per method and status; successful health calls at DEBUG only (shown "
        "with LOG_LEVEL=DEBUG): probes every few seconds would drown the rest; needs LOG_LEVEL INFO or DEBUG; costs "
        "throughput",
    )
    cascade_overload: Literal["answer", "refuse"] = Field(
        "answer",
        description="a confidence cascade whose next member's queue cannot take a request's escalated texts: "
        "'answer' has the earlier member answer those it cannot take, flagged escalation_refused; 'refuse' fails "
        "the request with RESOURCE_EXHAUSTED; refused for a single bundle, at start as at a reload",
    )

    @field_validator("providers", mode="before")
    @classmethod
    def _split_providers(cls, value):
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("providers")
    @classmethod
    def _providers_exist(cls, providers: list[str]) -> list[str]:
        return known_providers(providers)

    @field_validator("metrics_port", "health_port", "bundle", "reload_root", mode="before")
    @classmethod
    def _blank_is_none(cls, value, info: ValidationInfo):
        """'off' or 'none' turns a port off or leaves a folder unset; an empty value (a compose file's `${VAR:-}`) is
        refused, as it would turn the port off (and the probes or the scrape aimed at it fail) or unset the folder,
        unnoticed."""
        if isinstance(value, str) and not value.strip():
            no_flag = " (and give no flag)" if _flags_taken(info) else ""
            raise ValueError(
                f"must not be empty: 'off' turns the port off, and unset the variable{no_flag} for the default"
                if info.field_name.endswith("_port")
                else f"must not be empty: name the folder, or unset the variable{no_flag}"
            )
        return None if blank(value) else value

    @field_validator("host", "metrics_host", mode="before")
    @classmethod
    def _host_given(cls, value, info: ValidationInfo):
        """An empty address (a compose file's `${VAR:-}`) is refused: it names no interface to bind."""
        if isinstance(value, str) and not value.strip():
            no_flag = " (and give no flag)" if _flags_taken(info) else ""
            default = cls.model_fields[info.field_name].default
            raise ValueError(
                f"must not be empty: name an address ('[::]' binds every interface), or unset the variable{no_flag} "
                f"for the default, {default}"
            )
        return value

    @field_validator("bundle", "tls_cert", "tls_key", "tls_ca", "reload_root", mode="before")
    @classmethod
    def _from_home(cls, value):
        """A path starting with `~/`, which a shell leaves as written when quoted, in a unit file or after `=`, made
        absolute from the home folder, as the pipeline's path settings are."""
        return under_home(value) if isinstance(value, str) else value

    @field_validator("tls_cert", "tls_key", "tls_ca", "token", "admin_token", mode="before")
    @classmethod
    def _unset_to_turn_off(cls, value, info: ValidationInfo):
        """Security settings turn off only unset: an empty value (a Secret with an empty key, a compose file's
        `${VAR:-}`) would otherwise serve without a token, or in plaintext, unnoticed."""
        if blank(value):
            off = {
                "token": "serve without a token",
                "admin_token": "refuse Reload calls",
                "tls_ca": "ask clients for no certificate",
            }.get(info.field_name)
            no_flag = " (and give no flag)" if _flags_taken(info) else ""
            raise ValueError(
                f"must not be empty, 'none' or 'off': unset the variable{no_flag} to {off or 'serve plaintext'}"
            )
        return value

    @field_validator("token", "admin_token")
    @classmethod
    def _sendable(cls, value: SecretStr | None):
        token = None if value is None else value.get_secret_value()
        if token is not None and not sendable(token):
            raise ValueError(
                "must be printable ASCII, as gRPC metadata is, else no client can send it and every call is "
                "UNAUTHENTICATED (a value read from a file often ends with a newline)"
            )
        return value

    @field_validator(
        "handshake_timeout_s",
        "connection_idle_s",
        "connection_age_s",
        "connection_age_grace_s",
        "keepalive_s",
        mode="before",
    )
    @classmethod
    def _never_is_finite(cls, value):
        """gRPC's times: `inf` refused with the finite value that gRPC takes as never."""
        try:
            infinite = float(value) == math.inf
        except (TypeError, ValueError):
            infinite = False
        if infinite:
            raise ValueError(f"must be finite; for never, set {NEVER_S} or more ({GRPC_INT_MAX} ms, gRPC's never)")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value):
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self):
        """Settings that must agree with each other, named by variable and flag."""
        cert, key, ca, root = named("tls_cert"), named("tls_key"), named("tls_ca"), named("reload_root")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(f"{cert} and {key} go together: set both (TLS) or neither")
        if self.tls_ca is not None and self.tls_cert is None:
            raise ValueError(f"{ca} (mutual TLS) needs {cert} and {key} too")
        if self.health_port and self.health_port in (self.port, self.metrics_port):
            raise ValueError(
                f"{named('health_port')} {self.health_port} must differ from {named('port')} and "
                f"{named('metrics_port')}"
            )
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"{named('metrics_port')} {self.metrics_port} must differ from {named('port')}")
        if self.token is not None and self.admin_token is not None and self.token == self.admin_token:
            raise ValueError(
                f"{named('admin_token')} must differ from {named('token')}, so a client allowed to classify cannot "
                "reload"
            )
        if self.reload_root is not None and self.reload_root.resolve().parent == self.reload_root.resolve():
            raise ValueError(f"{root} {self.reload_root} is a file system root: name the folder of the bundles")
        if self.reload_root is not None and self.admin_token is None:
            raise ValueError(
                f"{root} lets Reload calls name a bundle, and Reload is off without {named('admin_token')}: set it "
                f"too, or unset {root}"
            )
        if self.reload_root is not None and (problem := folder_problem(self.reload_root)):
            raise ValueError(f"{root} {self.reload_root} {problem}: name the folder of the bundles")
        if self.max_texts > self.max_queued:
            raise ValueError(
                f"{named('max_texts')} {self.max_texts} must not exceed {named('max_queued')} {self.max_queued}"
            )
        return self

    @property
    def largest_batch(self) -> int:
        """The most rows one backend call takes: MAX_BATCH_SIZE, at most MAX_QUEUED, as no batch outgrows the queue (a
        request holds MAX_TEXTS rows at most, which the queue holds too)."""
        return min(self.max_batch_size, self.max_queued)

    @property
    def max_queue_delay(self) -> float:
        return self.max_queue_delay_ms / 1000

    @property
    def inline_infer(self) -> float:
        return self.inline_infer_ms / 1000

    @property
    def streams_per_connection(self) -> int:
        """MAX_CONCURRENT_STREAMS, or where unset twice MAX_CONCURRENT_RPCS: room for the streams of calls that have
        ended for their client but not yet for the server (at most a C int, as gRPC takes it)."""
        if self.max_concurrent_streams is not None:
            return self.max_concurrent_streams
        return min(2 * self.max_concurrent_rpcs, GRPC_INT_MAX)


# Channel options for a server on this machine: straight to it, never through a proxy the environment names
# (`http_proxy`, which gRPC takes, and which Docker and podman copy into containers).
DIRECT = [("grpc.enable_http_proxy", 0)]


# the naming schemes of gRPC targets: `dns:///host:port`, `dns://resolver/host:port`, `ipv4:a:port,b:port`, `ipv6:...`,
# sockets (`unix:path`, `unix-abstract:name`, `vsock:cid:port`)
TARGET_SCHEMES = ("dns", "ipv4", "ipv6", "unix", "unix-abstract", "vsock")
_ADDRESS_SCHEME = re.compile(r"^(?:dns:(?://[^/]*/)?|ipv4:|ipv6:)")  # the schemes of host and port lists


def on_loopback(address: str) -> bool:
    """Whether `address` (`host:port`, `[v6]:port`, or a gRPC target: `dns:///host:port`, `ipv4:` and `ipv6:` lists,
    `unix:` sockets) names this machine's loopback alone, which no proxy can reach for it."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    return all(loopback_host(part.rsplit(":", 1)[0]) for part in _ADDRESS_SCHEME.sub("", address).split(","))


def loopback_host(host: str) -> bool:
    """Whether `host` (an address, in brackets or not, or `localhost`) reaches only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name
        return False


def host_port(host: str, port: int) -> str:
    """`host:port` as gRPC takes it: an IPv6 address in brackets (`[::1]:50051`), whether `host` has them or not."""
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{host}:{port}"


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def named(field: str) -> str:
    """A setting as errors name it: `EDGEDISTILL_MAX_TEXTS (--max-texts)`."""
    return f"{env_name(field)} ({flag_name(field)})"


def refuse_unused(settings: Settings, count: int) -> None:
    """`SettingsError` naming a setting given (flag or variable) that the server would not use: METRICS_HOST with the
    metrics port off, ACCESS_LOG at a LOG_LEVEL above INFO, START_TIMEOUT_S for one process (`count`, the server
    processes WORKERS resolved to). For the process a user starts, not a supervisor's workers: they run with the
    metrics port off and the deployment's variables, while the supervisor serves /metrics on METRICS_HOST."""
    if "metrics_host" in settings.model_fields_set and settings.metrics_port is None:
        raise SettingsError(
            f"{env_name('metrics_host')} ({flag_name('metrics_host')}) {settings.metrics_host} would do nothing: the "
            f"metrics port is off ({env_name('metrics_port')}=off); unset it, or set {env_name('metrics_port')} to "
            "serve /metrics on that address"
        )
    if settings.access_log and settings.log_level in ("WARNING", "ERROR"):
        raise SettingsError(
            f"{env_name('access_log')} ({flag_name('access_log')}) would do nothing but cost throughput: it logs at "
            f"INFO, and {env_name('log_level')} is {settings.log_level}; unset it, or set {env_name('log_level')}=INFO"
        )
    if "start_timeout_s" in settings.model_fields_set and count == 1:
        one = (
            f"{env_name('workers')}=1 serves in one process"
            if settings.workers == 1
            else f"{env_name('workers')}=0 resolved to one process on this machine ({one_process_why()})"
        )
        raise SettingsError(
            f"{env_name('start_timeout_s')} ({flag_name('start_timeout_s')}) {settings.start_timeout_s:g} would do "
            f"nothing: {one}, and the deadline is a supervisor's for its workers; unset it (an orchestrator's startup "
            f"probe bounds one process's start), or set {env_name('workers')} above 1"
        )


def one_process_why() -> str:
    """Why WORKERS=0 comes to one process here: one usable core, else memory for one worker alone."""
    if usable_cores() == 1:
        return "one usable core"
    return f"its usable memory, {usable_memory() >> 20} MiB, holds one worker"


def build_parser(prog: str = "python -m serve") -> argparse.ArgumentParser:
    """One flag per field; defaults are left out so the environment and field defaults apply."""
    parser = ArgumentParser(
        prog=prog,
        description="Serve an edgedistill bundle over gRPC (edgedistill.v1.Classifier and KServe v2).",
        epilog=f"Every flag can also be set as an environment variable: {ENV_PREFIX}<FLAG>, e.g. {env_name('port')}.",
    )
    for name, info in Settings.model_fields.items():
        default = info.default.get_secret_value() if isinstance(info.default, SecretStr) else info.default
        parser.add_argument(
            flag_name(name),
            dest=name,
            default=argparse.SUPPRESS,
            metavar=name.upper(),
            help=f"{info.description} [{env_name(name)}, default: {default}]",
        )
    return parser


def _flags_taken(info: ValidationInfo) -> bool:
    """Whether the settings validated came from a command that takes the server's flags (`python -m serve`), so that
    a message may name them; a measurement's servers take the variables alone (`load_settings(flags_taken=False)`)."""
    return (info.context or {}).get("flags_taken", True)


def load_settings(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    prog: str = "python -m serve",
    flags_taken: bool = True,
) -> Settings:
    """Settings from `environ` (default `os.environ`), overridden by the flags in `argv`; the pipeline's own
    `EDGEDISTILL_*` variables (`common.settings.PIPELINE`) are left to it, and Kubernetes' service links ignored. A
    service link that sets a setting's variable (the Service `edgedistill` sets `EDGEDISTILL_PORT=tcp://...`) is
    refused, naming the fix, where no flag overrides it. Without `flags_taken` (a measurement sets the flags of its
    servers itself), an error names the variable alone."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name not in Settings.model_fields and (key in PIPELINE or service_link(key, value)):
            continue
        if name not in Settings.model_fields:
            known = [env_name(n) for n in Settings.model_fields]
            nearest = did_you_mean(key, [*known, *sorted(PIPELINE)])  # the pipeline's, read from this environment too
            raise SettingsError(
                f"unknown environment variable {key}; {nearest}known to the server: {', '.join(known)} (and the "
                "pipeline's, which the server leaves alone)"
            )
        values[name] = value
    flags = vars(build_parser(prog).parse_args(argv))
    for name, value in values.items():
        if name not in flags and (service := service_link(env_name(name), value)):
            raise SettingsError(
                f"{env_name(name)}={value} looks like a Kubernetes service link, which the kubelet sets for the "
                f"Service {service} in the pod's namespace, not a value of {flag_name(name)}: set "
                "`enableServiceLinks: false` in the pod's spec (as deploy/k8s/deployment.yaml does), set "
                f"{env_name(name)} in the container's `env` (which wins over a service link), or rename the Service"
            )
    values.update(flags)
    try:
        return Settings.model_validate(values, context={"flags_taken": flags_taken})
    except ValidationError as err:
        problems = []
        for error in err.errors():
            name = str(error["loc"][0]) if error["loc"] else ""
            named = f"{flag_name(name)} / {env_name(name)}" if flags_taken else env_name(name)
            where = f"{named}: " if name else ""
            problems.append(f"{where}{error['msg'].removeprefix('Value error, ')}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from err
