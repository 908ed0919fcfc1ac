"""The wheel: only the `edgedistill` package at the top, its package data inside, and a server that runs
from an install of it outside the checkout, and in it (with workers, under a load test). `make wheel-test` also
installs the `serve` extra from the package index into a clean environment; here the third-party packages come from
this environment.
"""

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from edgedistill.bench.ports import free_port
from edgedistill.common import settings
from edgedistill.serve.client import wait_ready

from tests.conftest import wait_until
from tests.serve.conftest import LABELS, write_bundle

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PROJECT["tool"]["setuptools"]
DIST_INFO = f"edgedistill-{PROJECT['project']['version']}.dist-info"
PACKAGE_DATA = [
    "edgedistill/py.typed",
    "edgedistill/serve/proto/classifier.proto",
    "edgedistill/serve/proto/kserve.proto",
    "edgedistill/loadtests/locustfile.py",
]
RECIPES = sorted(path.name for path in (ROOT / "recipes").glob("*.yaml"))
PAGES = sorted(path.name for path in (ROOT / "docs").glob("*.md"))
# Every package folder (one with __init__.py) under the folders package-dir installs as packages, by its installed
# name: what the wheel must hold, whether pyproject's `packages` lists it or not (the editable install finds it anyway).
PACKAGES = sorted(
    ".".join([package, *init.parent.relative_to(ROOT / folder).parts])
    for package, folder in SETUPTOOLS["package-dir"].items()
    if "/" not in folder
    for init in (ROOT / folder).rglob("__init__.py")
)
READY_TIMEOUT_S = 60
DATA_DIR = settings.defaults()["EDGEDISTILL_DATA_DIR"]  # the shared data, found from the checkout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built without build isolation from a copy of the sources pyproject.toml names (LICENSE among them,
    as setuptools' license-files default)."""
    src = tmp_path_factory.mktemp("src")
    for folder in {path.split("/")[0] for path in SETUPTOOLS["package-dir"].values()}:
        subprocess.run(["cp", "-r", ROOT / folder, src / folder], check=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (src / name).write_bytes((ROOT / name).read_bytes())
    out = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)]
    result = subprocess.run(build, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (built,) = out.glob("edgedistill-*.whl")
    return built


@pytest.fixture(scope="module")
def files(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_wheel_holds_only_the_edgedistill_package(files):
    assert {name.split("/")[0] for name in files} == {"edgedistill", DIST_INFO}


def test_pyproject_lists_every_package_folder():
    assert sorted(SETUPTOOLS["packages"]) == PACKAGES


@pytest.mark.parametrize("package", PACKAGES)
def test_wheel_holds_every_package(files, package):
    assert f"{package.replace('.', '/')}/__init__.py" in files


def test_wheel_holds_the_licence(files):
    assert f"{DIST_INFO}/licenses/LICENSE" in files


@pytest.mark.parametrize("path", PACKAGE_DATA)
def test_wheel_holds_package_data(files, path):
    assert path in files


@pytest.mark.parametrize("name", RECIPES)
def test_wheel_holds_every_recipe(files, name):
    assert f"edgedistill/recipes/{name}" in files


@pytest.mark.parametrize("name", PAGES)
def test_wheel_holds_every_docs_page(files, name):
    assert f"edgedistill/docs/{name}" in files


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The Python of a fresh environment with the wheel installed (no dependencies). Third-party packages
    come from this environment's site-packages, added as a plain path, so that its editable install of
    the checkout stays out."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", venv], check=True)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel]
    subprocess.run(install, check=True, capture_output=True)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def bare_env() -> dict[str, str]:
    """This environment without PYTHONPATH and EDGEDISTILL_* settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("EDGEDISTILL_") and k != "PYTHONPATH"}


def outside_env() -> dict[str, str]:
    """`bare_env` with one worker, one thread."""
    return bare_env() | {"EDGEDISTILL_WORKERS": "1", "EDGEDISTILL_THREADS": "1", "OMP_NUM_THREADS": "1"}


def test_installed_package_comes_from_the_wheel(installed, tmp_path):
    code = "import edgedistill.serve.app as app; print(app.__file__)"
    result = subprocess.run([installed, "-c", code], cwd=tmp_path, env=outside_env(), capture_output=True, text=True)
    assert Path(result.stdout.strip()).is_relative_to(installed.parents[1]), result.stderr


def test_installed_wheel_help_names_a_settings_page_that_is_installed(installed, tmp_path):
    done = subprocess.run(
        [installed.with_name("edgedistill"), "--help"], cwd=tmp_path, env=outside_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    page = Path(re.search(r"Settings: (\S+)\.\s", " ".join(done.stdout.split()))[1])
    assert page.is_relative_to(installed.parents[1]) and page.is_file(), done.stdout


def test_installed_wheel_reads_a_recipe_and_its_base_by_name_outside_the_checkout(installed, tmp_path):
    code = "from edgedistill.common.recipe import load_recipe; print(load_recipe('rte').data.text_pair_column)"
    result = subprocess.run([installed, "-c", code], cwd=tmp_path, env=outside_env(), capture_output=True, text=True)
    assert result.stdout.strip() == "sentence2", result.stderr


@contextmanager
def serving(command: list, port: int, cwd: Path, log: Path) -> Iterator[None]:
    """`command` (a server on loopback `port`) run in `cwd`, its stderr in `log`, SERVING within the block; stopped
    with SIGTERM after it."""
    with log.open("w") as sink, subprocess.Popen(command, cwd=cwd, env=outside_env(), stderr=sink) as proc:
        try:
            served = wait_ready(f"127.0.0.1:{port}", READY_TIMEOUT_S, running=lambda: proc.poll() is None)
            assert served, f"not SERVING within {READY_TIMEOUT_S} s (server exit status {proc.poll()})"
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def server_flags(bundle: Path, port: int) -> list:
    # any free metrics port: another server on the machine may hold the default
    return ["--bundle", bundle, "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0"]


def test_installed_wheel_serves_a_bundle(installed, tmp_path):
    port = free_port()
    serve = [installed, "-m", "edgedistill.serve", *server_flags(write_bundle(tmp_path / "bundle-tiny"), port)]
    client = [installed, "-m", "edgedistill.serve.call", "--address", f"127.0.0.1:{port}", "a gripping film"]
    with serving(serve, port, tmp_path, tmp_path / "server.log"):
        reply = subprocess.run(client, cwd=tmp_path, env=outside_env(), capture_output=True, text=True, timeout=60)
    assert json.loads(reply.stdout)["predictions"][0]["label"] in LABELS, reply.stderr


# From the checkout, whose top folder `edgedistill/` holds the CLI alone and would hide the installed stages from a
# child Python that put its working directory first on sys.path.


def test_installed_wheel_serves_with_two_workers_from_the_checkout(installed, tmp_path):
    port, log = free_port(), tmp_path / "server.log"
    serve = [installed.with_name("edgedistill"), "serve", *server_flags(write_bundle(tmp_path / "bundle-tiny"), port)]
    client = [installed, "-m", "edgedistill.serve.call", "--address", f"127.0.0.1:{port}", "a gripping film"]
    with serving([*serve, "--workers", "2"], port, ROOT, log):
        reply = subprocess.run(client, cwd=tmp_path, env=outside_env(), capture_output=True, text=True, timeout=60)
        wait_until(lambda: log.read_text().count("listening on port") == 2, "both workers listening", READY_TIMEOUT_S)
    assert json.loads(reply.stdout)["predictions"][0]["label"] in LABELS, reply.stderr


def test_installed_wheel_runs_a_load_test_from_the_checkout(installed, tmp_path):
    bundle = write_bundle(tmp_path / "bundle-tiny")
    command = [installed.with_name("edgedistill"), "loadtest", "recipes/smoke.yaml", "--profile", "smoke"]
    command += ["--bundle", bundle, "--loadtest.smoke.slo.min_rate_share=null"]  # no bound on time in a parallel run
    env = bare_env() | {"EDGEDISTILL_RUNS_DIR": str(tmp_path / "runs"), "EDGEDISTILL_DATA_DIR": DATA_DIR}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
