"""The wheel: only the `edgedistill` package at the top, its package data inside, and a server that runs
from an install of it outside the checkout. `make wheel-test` also installs the `serve` extra from the
package index into a clean environment; here the third-party packages come from this environment.
"""

import json
import os
import signal
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from edgedistill.serve.client import wait_ready

from tests.conftest import free_port
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
# Every package folder (one with __init__.py) under the folders package-dir installs as packages, by its installed
# name: what the wheel must hold, whether pyproject's `packages` lists it or not (the editable install finds it anyway).
PACKAGES = sorted(
    ".".join([package, *init.parent.relative_to(ROOT / folder).parts])
    for package, folder in SETUPTOOLS["package-dir"].items()
    if "/" not in folder
    for init in (ROOT / folder).rglob("__init__.py")
)
READY_TIMEOUT_S = 60


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


def outside_env() -> dict[str, str]:
    """This environment without PYTHONPATH and EDGEDISTILL_* settings; one worker, one thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEDISTILL_") and k != "PYTHONPATH"}
    return env | {"EDGEDISTILL_WORKERS": "1", "EDGEDISTILL_THREADS": "1", "OMP_NUM_THREADS": "1"}


def test_installed_package_comes_from_the_wheel(installed, tmp_path):
    code = "import edgedistill.serve.app as app; print(app.__file__)"
    result = subprocess.run([installed, "-c", code], cwd=tmp_path, env=outside_env(), capture_output=True, text=True)
    assert Path(result.stdout.strip()).is_relative_to(installed.parents[1]), result.stderr


def test_installed_wheel_reads_a_recipe_and_its_base_by_name_outside_the_checkout(installed, tmp_path):
    code = "from edgedistill.common.recipe import load_recipe; print(load_recipe('rte').data.text_pair_column)"
    result = subprocess.run([installed, "-c", code], cwd=tmp_path, env=outside_env(), capture_output=True, text=True)
    assert result.stdout.strip() == "sentence2", result.stderr


def test_installed_wheel_serves_a_bundle(installed, tmp_path):
    bundle = write_bundle(tmp_path / "bundle-tiny")
    port = free_port()
    serve = [installed, "-m", "edgedistill.serve", "--bundle", bundle, "--host", "127.0.0.1", "--port", str(port)]
    serve += ["--metrics-port", "0"]  # any free port: another server on the machine may hold the default
    client = [installed, "-m", "edgedistill.serve.client", "--address", f"127.0.0.1:{port}", "a gripping film"]
    with (
        (tmp_path / "server.log").open("w") as log,
        subprocess.Popen(serve, cwd=tmp_path, env=outside_env(), stderr=log) as proc,
    ):
        try:
            served = wait_ready(f"127.0.0.1:{port}", READY_TIMEOUT_S, running=lambda: proc.poll() is None)
            assert served, f"not SERVING within {READY_TIMEOUT_S} s (server exit status {proc.poll()})"
            reply = subprocess.run(client, cwd=tmp_path, env=outside_env(), capture_output=True, text=True, timeout=60)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert json.loads(reply.stdout)["predictions"][0]["label"] in LABELS, reply.stderr
