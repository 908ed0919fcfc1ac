"""Fixtures for the measurement tests: the servers' tiny torch-free bundles, single-text and pair."""

from pathlib import Path

import pytest

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
