"""Fixtures for the measurement tests: the servers' tiny torch-free bundles, single-text and pair."""

from pathlib import Path

import pytest
from edgedistill.bench.peers import launch
from edgedistill.common.cascade import ServedModels
from edgedistill.serve import workers
from edgedistill.serve.settings import Settings

from tests.serve.conftest import RunningServer, pair_spec, settings_for, write_bundle


@pytest.fixture(scope="session")
def bundle(tmp_path_factory) -> Path:
    return write_bundle(tmp_path_factory.mktemp("bundles") / "bundle-tiny")


@pytest.fixture(scope="session")
def pair_bundle(tmp_path_factory) -> Path:
    """The tiny pair model's bundle (its second text decides the label)."""
    return write_bundle(tmp_path_factory.mktemp("bundles") / "bundle-pairs", **pair_spec())


@pytest.fixture(scope="module")
def served(bundle):
    """A warm server on the tiny bundle, shared by a test module."""
    server = RunningServer(settings_for(bundle))
    yield server
    server.close()


def hold_workers(monkeypatch, bundle: Path, count: int, settings: Settings | None = None) -> None:
    """Make the usable memory, as the server's workers and the peer launcher read it, hold `count` of the server's
    workers on `bundle`, each counted with `settings` (None: the defaults)."""
    held = count * workers.worker_bytes(ServedModels.read(bundle).model_bytes, settings)
    for module in (workers, launch):
        monkeypatch.setattr(module, "usable_memory", lambda: held)
