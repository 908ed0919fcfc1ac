"""gRPC's C core kept to its errors in every command, `python -m` of a checkout's package included."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# What `python -m <package>.<module>` does first: import the package, with argv[0] "-m".
PROBE = """
import importlib, os, sys
sys.argv[0] = "-m"
importlib.import_module(sys.argv[1])
print(os.environ.get("GRPC_VERBOSITY"))
"""


def verbosity_as_python_m_imports(package: str, **environ: str) -> str:
    env = {name: value for name, value in os.environ.items() if name != "GRPC_VERBOSITY"} | environ
    command = [sys.executable, "-c", PROBE, package]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return result.stdout.strip() or result.stderr


@pytest.mark.parametrize("package", ["serve", "bench", "loadtests", "edgedistill"])
def test_a_package_that_speaks_grpc_keeps_its_core_to_errors_as_python_m_imports_it(package):
    assert verbosity_as_python_m_imports(package) == "ERROR"


def test_grpc_verbosity_in_the_environment_wins():
    assert verbosity_as_python_m_imports("serve", GRPC_VERBOSITY="DEBUG") == "DEBUG"
