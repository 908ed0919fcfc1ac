"""Fixtures for the measurement tests: the servers' tiny torch-free bundle."""

from pathlib import Path

import pytest

from tests.serve.conftest import write_bundle


@pytest.fixture(scope="session")
def bundle(tmp_path_factory) -> Path:
    return write_bundle(tmp_path_factory.mktemp("bundles") / "bundle-tiny")
