"""Servers set up for h2load: started, probed against the bundle's logits, warmed, stopped with the measurement."""

import os
from contextlib import ExitStack

import numpy as np
import pytest
from edgedistill.bench import BenchError, h2load
from edgedistill.bench.calls import infer_request
from edgedistill.bench.peers import launch
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.bench.targets import Example, started

from tests.bench.test_h2load import needs_h2load

TEXT = "a gripping, funny film"


@pytest.fixture
def plain_env(monkeypatch):
    for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
        monkeypatch.delenv(name)


def example(bundle, logits=None) -> Example:
    model = BundleClassifier(bundle)
    return Example(TEXT, None, model.logits([TEXT]) if logits is None else logits, model.spec)


def start(stack, server, bundle_example, tmp_path, warm_s=0.0) -> h2load.Target:
    files = (tmp_path / f"{server.name}.log", tmp_path / f"{server.name}.request")
    warm = h2load.Load(1, 1, warm_s)
    return started(
        stack, server, server.name, files, launch.model_ready(server.model), bundle_example, {}, warm, tmp_path
    )


@needs_h2load
def test_the_request_file_holds_the_framed_call_of_the_example(bundle, tmp_path, plain_env):
    server = launch.echo()
    with ExitStack() as stack:
        target = start(stack, server, example(bundle), tmp_path)
    assert target.request.read_bytes() == h2load.frame(infer_request(server.model, TEXT, None))


@needs_h2load
def test_a_reply_is_sized_longer_than_a_failure(bundle, tmp_path, plain_env):
    with ExitStack() as stack:
        target = start(stack, launch.echo(), example(bundle), tmp_path)
    assert target.replies.ok > target.replies.failed


@needs_h2load
def test_the_server_answering_other_logits_than_the_bundles_is_refused(bundle, tmp_path, plain_env):
    spec = example(bundle).spec
    server = launch.edgedistill(bundle, spec.name, threads=1, workers=1)
    wrong = example(bundle, logits=np.full((1, len(spec.labels)), 9.0, np.float32))
    with ExitStack() as stack, pytest.raises(BenchError, match="not the bundle's"):
        start(stack, server, wrong, tmp_path)


@needs_h2load
def test_the_server_is_stopped_when_the_measurement_ends(bundle, tmp_path, plain_env):
    spec = example(bundle).spec
    server = launch.edgedistill(bundle, spec.name, threads=1, workers=1)
    with ExitStack() as stack:
        target = start(stack, server, example(bundle), tmp_path, warm_s=0.2)
    assert not target.process.is_running()
