"""deploy/classify_once.py, the container and wheel tests' call: one prediction from a model of either kind."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.serve.conftest import LABELS, RunningServer, pair_spec, settings_for, write_bundle
from tests.serve.test_client import unused_address

SCRIPT = ROOT / "deploy" / "classify_once.py"


def classify_once(address: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, address], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("spec", [{}, pair_spec()], ids=["single-text model", "pair model"])
def test_the_served_model_answers_with_one_of_its_labels(tmp_path, spec):
    server = RunningServer(settings_for(write_bundle(tmp_path / "bundle-tiny", **spec)))
    try:
        assert classify_once(server.address).stdout.strip() in LABELS
    finally:
        server.close()


def test_no_server_exits_1_saying_classify_failed():
    result = classify_once(unused_address())
    assert result.returncode == 1
    assert result.stderr.split(":")[0] == "Classify failed"
