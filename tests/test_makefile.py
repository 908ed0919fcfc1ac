"""The Makefile's targets find the run folder of a recipe by its `name`, as the stages do, not by its file name."""

import os
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.fixture
def renamed(tmp_path) -> str:
    """A recipe file `variant.yaml` whose runs go to `runs/renamed/`."""
    recipe = tmp_path / "variant.yaml"
    recipe.write_text("extends: smoke\nname: renamed\n")
    return str(recipe)


def make_n(*args: str) -> str:
    """What `make -n *args` would run."""
    result = subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_clean_removes_the_run_folder_the_recipe_names(renamed):
    runs = os.environ["EDGEDISTILL_RUNS_DIR"]
    assert f'rm -rf -- "{runs}/renamed"' in make_n("clean", "CONFIRM=1", f"RECIPE={renamed}")


def test_serve_serves_the_deployed_bundle_of_the_run_the_recipe_names(renamed):
    runs = os.environ["EDGEDISTILL_RUNS_DIR"]
    assert f"--bundle {runs}/renamed/bundle-bilstm-int8 " in make_n("serve", f"RECIPE={renamed}")
