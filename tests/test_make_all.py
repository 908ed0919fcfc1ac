"""`make all RECIPE=recipes/smoke.yaml`: the whole pipeline as one job, on the session's smoke run."""

import os
import subprocess

import pytest
from edgedistill.common import manifest as mf

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

# The stages `smoke_bundles` built before `make all`, and those `make all` builds.
PREBUILT = ("teacher", "transfer", "student-bilstm", "bundle-bilstm-int8")
MADE = ("bench", "serve-bench-bilstm-int8", "loadtest-smoke-bilstm-int8", "report")


def test_make_all_on_the_smoke_recipe(smoke_bundles):
    runs = smoke_bundles.parent
    env = {**os.environ, "EDGEDISTILL_RUNS_DIR": str(runs), "HF_HUB_OFFLINE": "1", "EDGEDISTILL_TORCH_THREADS": "1"}
    # the smoke load test's rate floor is a bound on time, which runs alone, marked `serial`, in tests/loadtests
    no_rate_floor = "LOADTEST_ARGS=--loadtest.smoke.slo.min_rate_share=null"
    command = ["make", "--no-print-directory", "all", "RECIPE=recipes/smoke.yaml", f"RUNS_DIR={runs}", no_rate_floor]
    result = subprocess.run(
        command,  # the smoke recipe's serving benchmark runs one second per phase
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for stage in MADE:
        assert mf.load(smoke_bundles / stage).stage == stage
    out = result.stdout
    for stage in PREBUILT:  # not built again
        assert f"[{stage}] up to date" in out, out[-2000:]
    for line in (
        "teacher: dev accuracy",
        "student bilstm:",
        "bench bilstm-int8:",
        "serving: p99",
        "of a bare one",
        "load test smoke:",
    ):
        assert line in out, out[-2000:]
    assert f"bundle: {smoke_bundles / 'bundle-bilstm-int8'}" in out

    manifests = {path: path.read_bytes() for path in smoke_bundles.glob("*/manifest.json")}
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    rebuilt = [p.parent.name for p, data in manifests.items() if p.read_bytes() != data]
    assert rebuilt == [], "a second `make all` rebuilt a stage"
    for stage in PREBUILT + MADE:
        assert f"[{stage}] up to date" in again.stdout
