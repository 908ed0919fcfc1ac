"""The model every peer serves: the bundle's tokenizer and backend, giving the server's logits."""

import subprocess
import sys

import grpc
import numpy as np
import pytest
from edgedistill.bench.environ import measured_settings, serve_flags
from edgedistill.bench.peers.model import BundleClassifier, session_of
from edgedistill.serve.errors import InvalidInput
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc

from tests.serve.conftest import RunningServer, settings_for

TEXTS = ["a great movie", "the plot was dull and boring", "fun"]


def test_logits_equal_the_servers(bundle):
    server = RunningServer(settings_for(bundle))
    try:
        with grpc.insecure_channel(server.address) as channel:
            reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10)
    finally:
        server.close()
    served = np.array([list(p.logits) for p in reply.predictions], np.float32)
    np.testing.assert_allclose(BundleClassifier(bundle).logits(TEXTS), served, atol=1e-5)


@pytest.mark.parametrize(
    ("variable", "value"), [("SPIN", "true"), ("PROVIDERS", "CPUExecutionProvider"), ("ALLOW_CPU_FALLBACK", "true")]
)
def test_a_session_setting_in_the_environment_reaches_the_model_as_it_reaches_the_measured_server(
    bundle, monkeypatch, variable, value
):
    monkeypatch.setenv(f"EDGEDISTILL_{variable}", value)
    server = measured_settings(serve_flags(bundle, 0, 2))
    assert session_of(BundleClassifier(bundle, 2).settings) == session_of(server)


def test_spin_set_in_the_environment_spins_the_models_threads(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_SPIN", "true")
    assert BundleClassifier(bundle).settings.spin is True


def test_labels_are_the_bundles(bundle):
    assert BundleClassifier(bundle).labels == ["negative", "positive"]


class Capped:
    """The real runner `runner`, refusing calls of more than `cap` rows as a TensorRT profile or engine does."""

    def __init__(self, runner, cap: int):
        self.runner, self.max_batch_size, self.calls = runner, cap, []

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(next(iter(inputs.values())))
        if rows > self.max_batch_size:
            raise RuntimeError(f"{rows} rows, over the profile's {self.max_batch_size}")
        self.calls.append(rows)
        return self.runner.infer(inputs)


def capped(bundle, cap: int) -> tuple[BundleClassifier, Capped]:
    classifier = BundleClassifier(bundle)
    classifier.backend = Capped(classifier.backend, cap)
    return classifier, classifier.backend


def test_more_texts_than_the_backend_takes_are_run_in_calls_of_its_largest_batch(bundle):
    classifier, runner = capped(bundle, 2)
    classifier.logits(TEXTS * 2)
    assert runner.calls == [2, 2, 2]


def test_logits_run_in_calls_of_the_backends_largest_batch_equal_one_calls(bundle):
    classifier, _ = capped(bundle, 2)
    np.testing.assert_allclose(classifier.logits(TEXTS), BundleClassifier(bundle).logits(TEXTS), atol=1e-5)


def test_pairs_for_a_single_text_model_are_invalid(bundle):
    with pytest.raises(InvalidInput, match="single texts"):
        BundleClassifier(bundle).logits(TEXTS, TEXTS)


def test_single_texts_for_a_pair_model_are_invalid(pair_bundle):
    with pytest.raises(InvalidInput, match="pairs"):
        BundleClassifier(pair_bundle).logits(TEXTS)


def test_a_pair_model_reads_both_texts(pair_bundle):
    logits = BundleClassifier(pair_bundle).logits(["x", "x"], ["a great movie", "dull and boring"])
    assert not np.allclose(logits[0], logits[1])


# The project's dependencies that `make peers-setup`'s environments lack: KServe's and MLServer's own packages bring
# grpcio, protobuf, prometheus-client, numpy, pydantic, PyYAML, tokenizers, huggingface_hub and tqdm, the Makefile
# ONNX Runtime, and the project itself is installed there without its dependencies.
PEERS_LACK = ("grpc_health", "grpc_reflection", "psutil", "torch", "transformers", "datasets", "onnx", "rich")
BLOCKING = """
import importlib.abc, sys
class Lacking(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {lacking}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Lacking())
import edgedistill.bench.peers.model
"""


def test_the_peers_model_imports_in_a_peer_environment():
    blocking = BLOCKING.format(lacking=set(PEERS_LACK))
    imported = subprocess.run([sys.executable, "-c", blocking], capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr[-2000:]
