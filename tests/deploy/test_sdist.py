"""The source distribution: what MANIFEST.in says it holds, the files its tests and Makefile read among them."""

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What .gitignore leaves out of the checkout.
LOCAL = [".git", ".venv*", "runs", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", ".hypothesis"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> set[str]:
    """The sdist's paths, relative to its top folder, built without build isolation from a copy of the checkout."""
    src = tmp_path_factory.mktemp("sdist") / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*LOCAL))
    out = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(src)]
    result = subprocess.run(build, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (built,) = out.glob("edgedistill-*.tar.gz")
    with tarfile.open(built) as archive:
        return {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}


@pytest.mark.parametrize("name", [".dockerignore", ".ci/run", "Makefile", "Dockerfile"])
def test_sdist_holds_the_file_its_tests_read(files, name):
    assert name in files
