"""Shared fixtures: every test writes its runs into a temporary EDGEDISTILL_RUNS_DIR, never the network."""

import contextlib
import importlib
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from edgedistill.common import locks
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# Every property test as tests/serve/test_fuzz.py's FUZZ: the same examples in every run, none kept in the checkout,
# and no deadline or too-slow check, which a loaded machine misses.
settings.register_profile(
    "edgedistill", database=None, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("edgedistill")


def wait_until(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
    """Polls `condition` until it holds; fails the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process `pid` has ended (or is a zombie) within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def save_initialised(model_class, config, folder: Path) -> None:
    """A `model_class(config)` checkpoint in `folder` whose weights are drawn alike in every run (seed 0), so that a
    test training from it has one outcome; the process's random state is left as it was."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model_class(config).save_pretrained(folder)


def pytest_collection_modifyitems(items):
    """The modules with end-to-end runs (marked `slow`) first, so that `make test`'s pytest-xdist workers, given one
    module at a time in this order, start the longest ones first instead of ending on one."""
    slow = {item.module for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: getattr(item, "module", None) not in slow)


def run_module(module: str, runs: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m module *args` with EDGEDISTILL_RUNS_DIR=`runs`, run in this process (`run_here`)."""
    return run_here(module, *args, env={"EDGEDISTILL_RUNS_DIR": str(runs), "EDGEDISTILL_TORCH_THREADS": "1"})


@contextlib.contextmanager
def environ(variables: dict[str, str]):
    """`os.environ` with `variables` set, as it was again after the block."""
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_here(module: str, *args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m module *args` run in this process (the module's `main`) in the checkout, with the variables `env`:
    its exit status and what it printed. For a command whose process the test does not check (a refusal, a build it
    needs, a stage resumed after a kill), as a new process would import torch again for seconds."""
    main = importlib.import_module(f"edgedistill.{module}.__main__").main
    out, err = io.StringIO(), io.StringIO()
    with environ(env or {}), contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(map(str, args)))
    return subprocess.CompletedProcess([module, *args], status, out.getvalue(), err.getvalue())


LOADING = ("torch", "transformers", "onnx")  # what building imports, for seconds


def loaded_by(
    module: str, runs: Path, *args: str, watched: tuple[str, ...] = LOADING
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`python -m module *args` in a process of its own with EDGEDISTILL_RUNS_DIR=`runs`: what it did, and which of
    the modules `watched` it imported."""
    code = (
        "import importlib, sys; status = importlib.import_module(sys.argv[1]).main(sys.argv[2:]); "
        f"print('loaded:', *[name for name in {watched!r} if name in sys.modules]); sys.exit(status)"
    )
    env = {**os.environ, "EDGEDISTILL_RUNS_DIR": str(runs), "HF_HUB_OFFLINE": "1"}
    command = [PYTHON, "-c", code, f"edgedistill.{module}.__main__", *map(str, args)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    said, _, loaded = result.stdout.rpartition("loaded:")
    return subprocess.CompletedProcess(command, result.returncode, said, result.stderr), loaded.split()


def run_export(runs: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m export *args` with EDGEDISTILL_RUNS_DIR=`runs`, its output captured."""
    return run_module("export", runs, *args)


def step(rps, p99, errors=0.0, offered=None) -> dict:
    """The figures of one load step (or run), as `loadtests.analysis` computes them, for SLO tests."""
    return {
        "requests": 100,
        "requests_per_s": rps,
        "offered_rate": offered or rps,
        "rate_share": rps / (offered or rps),
        "error_rate": errors,
        "p50_ms": p99 / 2,
        "p95_ms": p99,
        "p99_ms": p99,
    }


@pytest.fixture(autouse=True)
def hermetic(tmp_path, monkeypatch):
    """Offline, a runs folder of the test's own, one torch thread; and the process-wide state a command run in the
    test's process (`run_here`) sets left as the test found it: the signal handlers (the server's `main` installs
    its own, which the processes that later tests start would otherwise inherit), the root logger's handlers and
    level (the server's write to the stderr `run_here` captured) and GRPC_VERBOSITY (`common.grpc_core`,
    which the servers later tests start would otherwise inherit). Torch's intra-op threads stay as such a command
    sets them: one, as asked here, which suits the suite's workers sharing the cores."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("EDGEDISTILL_TORCH_THREADS", os.environ.get("EDGEDISTILL_TORCH_THREADS", "1"))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    root = logging.getLogger()
    logged = root.level, list(root.handlers)
    verbosity = os.environ.get("GRPC_VERBOSITY")
    yield
    for sig, handler in handlers.items():
        if handler is not None and signal.getsignal(sig) is not handler:  # None: a handler not set from Python
            signal.signal(sig, handler)
    root.setLevel(logged[0])
    root.handlers[:] = logged[1]
    if verbosity is None:
        os.environ.pop("GRPC_VERBOSITY", None)
    else:
        os.environ["GRPC_VERBOSITY"] = verbosity


@pytest.fixture
def data_dir() -> Path:
    """The shared data folder (SST-2, movie reviews, WikiText), as the recipes find it."""
    from edgedistill.common import settings

    path = Path(settings.defaults()["EDGEDISTILL_DATA_DIR"])
    assert (path / "sst2" / "train.tsv").is_file(), f"shared data not found at {path}: set EDGEDISTILL_DATA_DIR"
    return path


def build_stages(runs: Path, recipe: Path, *commands: list[str]) -> list[str]:
    """Each of `commands` (`[module, command, *flags]`) on `recipe` into the runs folder `runs`, run in this process
    (`run_here`), offline on one thread; what each printed. Fails the caller at the first that fails."""
    env = {"EDGEDISTILL_RUNS_DIR": str(runs), "HF_HUB_OFFLINE": "1", "EDGEDISTILL_TORCH_THREADS": "1"}
    printed = []
    for module, *command in commands:
        result = run_here(module, *command, recipe, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        printed.append(result.stdout)
    return printed


def run_smoke(runs: Path, module: str, stage: str) -> str:
    """`python -m module stage recipes/smoke.yaml` into the runs folder `runs`; what it printed. Fails the caller if
    it fails."""
    return build_stages(runs, ROOT / "recipes" / "smoke.yaml", [module, stage])[0]


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `build(folder)` fills, built once for the whole test run: pytest-xdist's workers share it (the
    first to ask builds it under a lock while the others wait) instead of each training it again. Callers copy it
    and write only in their copy."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the run's base folder, above each worker's own
    shared = root / f"built-{name}"
    with locks.exclusive(root / f"built-{name}.lock", f"tests' {name}"):
        if not (shared / ".built").is_file():
            shutil.rmtree(shared, ignore_errors=True)
            build(shared)
            (shared / ".built").touch()
    return shared


def build_smoke_run(runs: Path) -> None:
    for stage in ("teacher", "distill"):
        (runs / f"{stage}.out").write_text(run_smoke(runs, "distill", stage))


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """`runs/smoke/` after the teacher and distill stages of recipes/smoke.yaml, built once per test run; this
    process's own copy."""
    runs = tmp_path_factory.mktemp("smoke-runs")
    shutil.copytree(built_once(tmp_path_factory, "smoke-run", build_smoke_run) / "smoke", runs / "smoke")
    return runs / "smoke"


@pytest.fixture(scope="session")
def smoke_teacher_said(tmp_path_factory) -> str:
    """What `python -m distill teacher recipes/smoke.yaml` printed when it built `smoke_run`'s teacher."""
    return (built_once(tmp_path_factory, "smoke-run", build_smoke_run) / "teacher.out").read_text()


@pytest.fixture(scope="session")
def smoke_bundles(smoke_run, tmp_path_factory) -> Path:
    """`smoke_run` plus every bundle of recipes/smoke.yaml."""

    def build(runs: Path) -> None:
        shutil.copytree(smoke_run, runs / "smoke")
        run_smoke(runs, "export", "bundles")

    shutil.copytree(built_once(tmp_path_factory, "smoke-bundles", build) / "smoke", smoke_run, dirs_exist_ok=True)
    return smoke_run


@pytest.fixture
def smoke_bundles_copy(smoke_bundles, tmp_path) -> Path:
    """A copy of `smoke_bundles` for a test that writes in it (a manifest rewritten makes the stages after it
    stale): the process's copy stays as built for the tests after."""
    return Path(shutil.copytree(smoke_bundles, tmp_path / "smoke"))


@pytest.fixture
def swapped_after_check(smoke_bundles, tmp_path, monkeypatch):
    """`swap(module)`: a copy of the smoke teacher's fused bundle, whose model file `module.open_bundle` overwrites
    between the bundle's check and its opening, as a folder changed meanwhile would."""

    def swap(module) -> Path:
        folder = tmp_path / "bundle-teacher-fused"
        shutil.copytree(smoke_bundles / "bundle-teacher-fused", folder)
        open_bundle = module.open_bundle

        def swap_then_open(bundle, *args, **kwargs):
            (bundle.folder / bundle.spec.model_file).write_bytes(b"not a model")
            return open_bundle(bundle, *args, **kwargs)

        monkeypatch.setattr(module, "open_bundle", swap_then_open)
        return folder

    return swap


@pytest.fixture
def no_tensorrt(monkeypatch):
    """This machine as if the tensorrt package were not installed."""
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError


@pytest.fixture
def tf32_override(monkeypatch):
    """NVIDIA_TF32_OVERRIDE=0, under which ONNX Runtime's TensorRT provider may run a model that is not fp16."""
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")


@pytest.fixture
def no_tf32_override(monkeypatch):
    """NVIDIA_TF32_OVERRIDE unset, as on most machines."""
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)


@pytest.fixture
def no_cuda_python(monkeypatch):
    """This machine as if cuda-python were not installed."""
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)


@contextlib.contextmanager
def small_tmpfs(folder: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs mounted on the new `folder`, unmounted afterwards; the test skipped where this process may not
    mount one (it takes root)."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        said = mounted.stderr.decode().partition("\n")[0]  # its second line only points to dmesg
        pytest.skip(
            "needs a 3 MiB tmpfs to fill, and mounting one takes root: run it as root, or under `unshare -rm` where "
            f"user namespaces are allowed (mount says: {said})"
        )
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Path]:
    """A 3 MiB tmpfs (`small_tmpfs`)."""
    with small_tmpfs(tmp_path / "small") as folder:
        yield folder
