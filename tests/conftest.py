"""Shared fixtures: every test writes its runs into a temporary RUNS_DIR, never the network."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@pytest.fixture(autouse=True)
def hermetic(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("TORCH_THREADS", os.environ.get("TORCH_THREADS", "1"))


@pytest.fixture
def data_dir() -> Path:
    """The shared data folder (SST-2, movie reviews, WikiText), as the recipes find it."""
    from common import settings

    path = Path(settings.defaults()["DATA_DIR"])
    assert (path / "sst2" / "train.tsv").is_file(), f"shared data not found at {path}: set DATA_DIR"
    return path
