"""Servers set up for h2load: started, probed against the bundle's logits, warmed, stopped with the measurement."""

import json
import os
from contextlib import ExitStack
from dataclasses import replace

import numpy as np
import pytest
from edgedistill.bench import BenchError, h2load, processes
from edgedistill.bench.calls import infer_request
from edgedistill.bench.peers import launch
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.bench.targets import PACED, PHASES, Example, phases, started
from edgedistill.common.config.measure import PeersBenchConfig
from edgedistill.serve import workers

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
    return started(stack, server, server.name, files, bundle_example, {}, warm, tmp_path)


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


@needs_h2load
def test_a_supervised_server_is_not_probed_before_every_worker_serves(bundle, tmp_path, plain_env, monkeypatch):
    monkeypatch.setattr(processes, "START_TIMEOUT_S", 3.0)
    echo = launch.echo()  # its model ready at once, under a log that says a supervisor runs and no more
    supervising = json.dumps({"event": workers.SUPERVISING})
    server = replace(echo, command=["sh", "-c", f"echo '{supervising}'; exec \"$@\"", "sh", *echo.command])
    with ExitStack() as stack, pytest.raises(BenchError, match="did not report SERVING"):
        start(stack, server, example(bundle), tmp_path)


def test_every_phase_has_a_load():
    assert list(phases(PeersBenchConfig(), h2load.Load(16, 2, 10))) == list(PHASES)


def test_the_paced_phase_sends_from_one_h2load_per_connection():
    cfg = PeersBenchConfig(paced_connections=4)
    assert phases(cfg, h2load.Load(16, 2, 10))[PACED].clients == 4
