"""Pipeline settings read from the environment, every name under `EDGEDISTILL_`; paths resolve from the working
directory, never from where the package is installed.

| variable                    | default                                                               |
| --------------------------- | --------------------------------------------------------------------- |
| `EDGEDISTILL_DATA_DIR`      | `../shared/data` from the working directory if it exists, else `data` |
| `EDGEDISTILL_TEACHER_INIT`  | `../shared/models/minilm-l6-h384-uncased` if it exists, else the Hub  |
|                             | name `sentence-transformers/all-MiniLM-L6-v2`                         |
| `EDGEDISTILL_RUNS_DIR`      | `runs`                                                                |
| `EDGEDISTILL_TORCH_THREADS` | `OMP_NUM_THREADS`, else every core                                    |
| `EDGEDISTILL_TRT_CACHE`     | `$XDG_CACHE_HOME/edgedistill/trt`, else `~/.cache/edgedistill/trt`    |

The unprefixed names of earlier releases (`RENAMED`) are still read while the new name is unset, with a
`FutureWarning` once per name. A recipe's load refuses an `EDGEDISTILL_*` name that neither the pipeline nor the
server reads (`refuse_unknown_variables`), but not the variables Kubernetes sets for each Service in a pod's namespace
(`service_link`); a path setting that starts with `~/` is under the home folder.
"""

import difflib
import functools
import importlib.resources
import ipaddress
import os
import re
import warnings
from pathlib import Path

from edgedistill.common import guide
from edgedistill.common.machine import usable_cores

HUB_TEACHER = "sentence-transformers/all-MiniLM-L6-v2"
RENAMED = {  # new name -> the name an earlier release read
    "EDGEDISTILL_DATA_DIR": "DATA_DIR",
    "EDGEDISTILL_TEACHER_INIT": "TEACHER_INIT",
    "EDGEDISTILL_RUNS_DIR": "RUNS_DIR",
    "EDGEDISTILL_TORCH_THREADS": "TORCH_THREADS",
    "EDGEDISTILL_LOADTEST_SCENARIOS": "LOADTEST_SCENARIOS",
    "EDGEDISTILL_LOADTEST_PLAN": "LOADTEST_PLAN",
}
# recipe keys set from the environment, before the command line's `--key=value`
ENV_OVERRIDES = {"EDGEDISTILL_DEVICE": "runtime.device", "EDGEDISTILL_PRECISION": "runtime.precision"}
PROGRESS_VAR = "EDGEDISTILL_PROGRESS"  # read by common.progress
PROGRESS_INTERVAL_VAR = "EDGEDISTILL_PROGRESS_INTERVAL"
TRT_CACHE_VAR = "EDGEDISTILL_TRT_CACHE"  # read by trt_cache()
ENV_PREFIX = "EDGEDISTILL_"  # every setting's name; the server and the pipeline refuse a name under it they do not know
# the `EDGEDISTILL_*` names the pipeline reads
PIPELINE = frozenset(RENAMED) | frozenset(ENV_OVERRIDES) | {PROGRESS_VAR, PROGRESS_INTERVAL_VAR, TRT_CACHE_VAR}
# the server's settings (`serve.settings.Settings`, `EDGEDISTILL_<FIELD>` each), which the pipeline leaves to it, as
# the server leaves the pipeline's: named here so that common imports nothing of serve (a test keeps the two equal)
SERVER = frozenset(
    ENV_PREFIX + field
    for field in (
        "ACCESS_LOG", "ADMIN_TOKEN", "ALLOW_CPU_FALLBACK", "BATCH_TIMEOUT_S", "BUNDLE", "CASCADE_OVERLOAD",
        "CONNECTION_AGE_GRACE_S", "CONNECTION_AGE_S", "CONNECTION_IDLE_S", "EVENT_LOOP", "HANDSHAKE_TIMEOUT_S",
        "HEALTH_PORT", "HOST", "INLINE_INFER_MS", "KEEPALIVE_S", "LOG_LEVEL", "MALLOC_ARENAS", "MAX_BATCH_SIZE",
        "MAX_CONCURRENT_RPCS", "MAX_CONCURRENT_STREAMS", "MAX_MESSAGE_BYTES", "MAX_QUEUED", "MAX_QUEUE_DELAY_MS",
        "MAX_TEXTS", "MAX_TEXT_CHARS", "METRICS_HOST", "METRICS_PORT", "PORT", "PROVIDERS", "RELOAD_ROOT",
        "SHUTDOWN_GRACE_S", "SPIN", "START_TIMEOUT_S", "STREAM_IDLE_S", "THREADS", "TLS_CA", "TLS_CERT", "TLS_KEY",
        "TOKEN", "WORKERS",
    )
)  # fmt: skip


# The server settings a measurement sets by its servers' flags (bench/environ.py), which win over their variables
MEASURED_SETTINGS = ("bundle", "host", "port", "threads", "workers")
# server settings a measurement refuses too: it calls its servers over plaintext loopback
MEASURED_PLAINTEXT = ("TLS_CERT", "TLS_KEY")


class SettingError(ValueError):
    """An environment setting with a value it cannot take; the message names the variable and what it takes."""


# The variables the kubelet sets in a pod for each Service of its namespace (unless the pod sets `enableServiceLinks:
# false`), the Service's name upper-cased with `_` for `-`: `<SERVICE>_SERVICE_HOST`, `<SERVICE>_SERVICE_PORT` (and
# `_<PORT NAME>` for each named port), and Docker's links: `<SERVICE>_PORT` and `<SERVICE>_PORT_<N>_<PROTOCOL>`, with
# its `_PROTO`, `_PORT` and `_ADDR`
SERVICE_LINK_NAME = re.compile(
    r"(?P<service>[A-Z][A-Z0-9_]*?)_(?:(?P<host>SERVICE_HOST)|(?P<ports>SERVICE_PORT(?:_[A-Z0-9_]+)?)|PORT"
    r"|PORT_(?P<number>[0-9]+)_(?P<protocol>TCP|UDP|SCTP)(?:_(?P<part>PROTO|PORT|ADDR))?)"
)
# `<protocol>://<cluster IP>:<port>`, an IPv6 address with or without brackets
SERVICE_LINK_URL = re.compile(r"(?P<protocol>tcp|udp|sctp)://\[?(?P<address>[0-9A-Fa-f:.]+)\]?:(?P<number>[0-9]+)")


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def service_link(name: str, value: str) -> str | None:
    """The Kubernetes Service whose service link `name=value` is, judged by the name and the value together (a cluster
    IP, a port number, `tcp://<IP>:<port>`): a variable the kubelet sets, not a setting; else None."""
    link = SERVICE_LINK_NAME.fullmatch(name)
    if link is None:
        return None
    protocol, number = (link["protocol"] or "").lower(), link["number"]
    if link["host"] or link["part"] == "ADDR":
        fits = _is_address(value)
    elif link["ports"]:
        fits = re.fullmatch("[0-9]+", value) is not None
    elif link["part"] == "PROTO":
        fits = value == protocol
    elif link["part"] == "PORT":
        fits = value == number
    else:  # `<SERVICE>_PORT`: the first port, any protocol; `<SERVICE>_PORT_<N>_<PROTOCOL>`: that port and protocol
        url = SERVICE_LINK_URL.fullmatch(value)
        fits = (
            url is not None
            and _is_address(url["address"])
            and (number is None or (url["protocol"], url["number"]) == (protocol, number))
        )
    return link["service"].lower().replace("_", "-") if fits else None


def refuse_measured_variables() -> None:
    """`SettingError` where the environment sets the variable of one of `MEASURED_SETTINGS`, which a measured
    server's flag would override without a word, or gives the server TLS, which a measurement's plaintext calls cannot
    use: the benchmarks refuse it, and `edgedistill all` before it trains. A Kubernetes service link
    (`EDGEDISTILL_PORT=tcp://...`) is no setting a user meant, and the flag rightly wins."""
    variables = [ENV_PREFIX + name.upper() for name in MEASURED_SETTINGS]
    if given := [name for name in variables if name in os.environ and service_link(name, os.environ[name]) is None]:
        raise SettingError(
            f"{', '.join(given)} would do nothing: a measurement sets the server's bundle (--bundle), address, "
            "threads (the recipe's `threads` of the measurement: --bench.serving.threads=N, --bench.peers.threads=N, "
            "--bench.scaling.threads=N or --loadtest.threads=N) and workers itself; unset them"
        )
    if any(os.environ.get(ENV_PREFIX + name) for name in MEASURED_PLAINTEXT):  # empty: unset
        raise SettingError("measurements call the server over plaintext loopback: unset EDGEDISTILL_TLS_CERT and _KEY")


def refuse_unknown_variables() -> None:
    """`SettingError` where the environment sets an `EDGEDISTILL_*` variable that neither the pipeline nor the server
    reads: a misspelt setting (`EDGEDISTILL_RUN_DIR`) would otherwise do nothing, without a word. A Kubernetes service
    link (`service_link`) is no setting, and is left alone."""
    known = sorted(PIPELINE | SERVER)
    if unknown := sorted(
        name
        for name, value in os.environ.items()
        if name.startswith(ENV_PREFIX) and name not in known and service_link(name, value) is None
    ):
        named = [
            name + "".join(f" (did you mean {near}?)" for near in difflib.get_close_matches(name, known, n=1))
            for name in unknown
        ]
        raise SettingError(
            f"{', '.join(named)}: no edgedistill setting has that name, so it would do nothing: rename or unset it "
            f"({guide.page('settings.md')} lists the settings)"
        )


@functools.cache
def warn_renamed(old: str, new: str) -> None:
    """Warn, once per process, that `old` is read in place of `new`."""
    message = f"{old} is deprecated and will be ignored in a later release: set {new} instead"
    warnings.warn(message, FutureWarning, stacklevel=3)  # the line that called `env`


def env_name(name: str) -> str:
    """The variable that `env(name)` reads: `name`, else its old name where only that is set (to a non-empty value),
    which an error about the value must name: the user never set `name`."""
    old = RENAMED.get(name)
    return old if old and not os.environ.get(name) and os.environ.get(old) else name


def env(name: str) -> str | None:
    """The variable `name`, else its old name (with a warning); None when neither is set to a non-empty value."""
    read = env_name(name)
    if read != name:
        warn_renamed(read, name)
    return os.environ.get(read) or None


def _first_existing(local: Path, fallback: str) -> str:
    return str(local) if local.exists() else fallback


def defaults() -> dict[str, str]:
    """The path settings above, environment first; defaults from the working directory."""
    cwd = Path.cwd()
    shared = cwd.parent / "shared"
    fallback = {
        "EDGEDISTILL_DATA_DIR": _first_existing(shared / "data", str(cwd / "data")),
        "EDGEDISTILL_TEACHER_INIT": _first_existing(shared / "models" / "minilm-l6-h384-uncased", HUB_TEACHER),
        "EDGEDISTILL_RUNS_DIR": str(cwd / "runs"),
    }
    return {name: under_home(env(name) or value) for name, value in fallback.items()}


def env_source(key: str, value: object = None) -> str:
    """` (from VAR=value)` where an `ENV_OVERRIDES` variable sets recipe key `key` (to `value`, where given), else ''
    : for errors about a value the recipe file does not hold."""
    for variable, overridden in ENV_OVERRIDES.items():
        setting = os.environ.get(variable)
        if overridden == key and setting and (value is None or setting == str(value)):
            return f" (from {variable}={setting})"
    return ""


def variables() -> dict[str, str]:
    """What a recipe's `${NAME}` may name: any environment variable, and the path settings under both names. A path
    setting given as `./x` or `../x` is made absolute from the working directory, as the stages read it: left
    relative, the recipe would take it for a path relative to its own folder."""
    values = {name: _from_cwd(value) for name, value in defaults().items()}
    return dict(os.environ) | values | {RENAMED[name]: value for name, value in values.items()}


RELATIVE = ("./", "../")  # a path written relative: to the working directory here, to its recipe's folder in a recipe
HOME = "~/"  # a path under the user's home folder


def under_home(value: str) -> str:
    """`value` made absolute from the home folder where it starts with `~/`, which a shell leaves as written when
    quoted, in a file or after `=`."""
    return str(Path(value).expanduser()) if value.startswith(HOME) else value


def _from_cwd(value: str) -> str:
    return str((Path.cwd() / value).resolve()) if value.startswith(RELATIVE) else value


def recipe_folders() -> list[Path]:
    """Where a recipe named without a folder (`sst2`, `extends: sst2`) is looked for, in order: `recipes/` in the
    working directory, then the recipes installed with the package (`edgedistill.recipes`)."""
    installed = Path(str(importlib.resources.files("edgedistill.recipes")))
    return list(dict.fromkeys([Path.cwd() / "recipes", installed]))


def find_recipe(name: str, extending: Path | None = None) -> Path | None:
    """The file of the recipe called `name` (`sst2` or `sst2.yaml`) in the first of `recipe_folders` that has it, other
    than the recipe `extending` it: a `recipes/trec.yaml` of one's own may extend `trec`, the installed one."""
    file = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    found = (folder / file for folder in recipe_folders() if (folder / file).is_file())
    itself = extending.resolve() if extending is not None else None
    return next((path for path in found if path.resolve() != itself), None)


def recipe_names() -> list[str]:
    """The recipes `find_recipe` can find by name."""
    return sorted({path.stem for folder in recipe_folders() for path in folder.glob("*.yaml")})


def trt_cache() -> Path:
    """Where ONNX Runtime's TensorRT provider keeps its timing cache, and its engines in a folder per model content
    and precision (`common.runtime.provider_options`): `EDGEDISTILL_TRT_CACHE`, else the user's cache folder. Never
    the bundle's own folder, which may be mounted read-only and is verified file by file."""
    if value := os.environ.get(TRT_CACHE_VAR):
        return Path(under_home(value))
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgedistill" / "trt"


def threads() -> int:
    """Intra-op threads of PyTorch in a pipeline stage, and of ONNX Runtime where the labeller bundle labels the
    transfer set: `EDGEDISTILL_TORCH_THREADS`, else the first entry of `OMP_NUM_THREADS`, else every usable core (the
    affinity within a cgroup's CPU quota, `common.machine.usable_cores`). The model benchmark takes its recipe's
    `bench.models.threads` instead, and the export checks a fixed two."""
    name = env_name("EDGEDISTILL_TORCH_THREADS")
    value = env("EDGEDISTILL_TORCH_THREADS")
    if value is None and os.environ.get("OMP_NUM_THREADS"):
        name, value = "OMP_NUM_THREADS", os.environ["OMP_NUM_THREADS"].split(",")[0]
    if value is None:
        return usable_cores()
    if not value.strip().isdigit() or int(value) < 1:
        raise SettingError(f"{name}={value!r}: give a whole number of threads, at least 1")
    return int(value)
