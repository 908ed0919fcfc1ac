"""The model benchmark: which bundles it can time here, and its table on the smoke run."""

import pytest
from edgedistill.bench import models
from edgedistill.bench.stats import ModelTable
from edgedistill.common import manifest as mf
from edgedistill.common import runtime
from edgedistill.common.recipe import BundleRecipe, load_recipe
from edgedistill.common.runtime import missing_here

from tests.conftest import ROOT, run_module

SMOKE = ROOT / "recipes" / "smoke.yaml"


def test_bench_times_a_gpu_bundle_only_where_its_provider_is_offered(monkeypatch):
    cuda = BundleRecipe(source="teacher", providers=["CUDAExecutionProvider"])
    monkeypatch.setattr(runtime, "available_providers", lambda: ["CPUExecutionProvider"])
    assert models._left_out(cuda) == "CUDAExecutionProvider not offered by this onnxruntime build"
    assert models._left_out(BundleRecipe(source="teacher")) is None
    assert "runtime tensorrt" in models._left_out(BundleRecipe(source="teacher", runtime="tensorrt"))
    monkeypatch.setattr(runtime, "available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert models._left_out(cuda) is None


@pytest.mark.slow
def test_bench_writes_its_tables(smoke_bundles):
    result = run_module("bench", smoke_bundles.parent, "models", str(SMOKE))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = ModelTable.load(smoke_bundles / "bench").rows
    assert rows[0].model == "teacher-pytorch-eager"
    assert rows[0].cell(1, 16).speedup == 1.0
    bundles = load_recipe(SMOKE).export.bundles
    here = {
        b
        for b, spec in bundles.items()
        if spec.runtime == "onnxruntime" and not missing_here("onnxruntime", spec.providers)
    }
    assert {"teacher-cuda-fp16", "bilstm-engine"} - here  # the smoke recipe has bundles some machines cannot time
    assert {r.model for r in rows if not r.model.startswith("teacher-pytorch-eager")} == here
    for bundle_id in set(bundles) - here:
        assert f"[bench] {bundle_id} not timed here: " in result.stdout
    assert set(mf.load(smoke_bundles / "bench").info["left_out"]) == set(bundles) - here
    for row in rows:
        for cell in row.cells:
            assert cell.min_ms <= cell.median_ms <= cell.max_ms
            assert cell.calls >= 5
    assert "teacher-int8" in (smoke_bundles / "bench" / "bench.md").read_text()
    manifest = mf.load(smoke_bundles / "bench")
    again = run_module("bench", smoke_bundles.parent, "models", str(SMOKE))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "[bench] up to date" in again.stdout, again.stderr[-2000:]
    assert mf.load(smoke_bundles / "bench").created == manifest.created  # not measured again
