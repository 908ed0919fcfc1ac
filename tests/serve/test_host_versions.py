"""The version a server reports names the bundle's content: a bundle built again with other weights is another one."""

import shutil

import grpc
import pytest
from edgedistill.serve.client import Client
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc

from tests.conftest import ROOT, run_here
from tests.serve.conftest import settings_for

pytestmark = pytest.mark.slow
SMOKE = ROOT / "recipes" / "smoke.yaml"
ADMIN_TOKEN = "admin-token"
BUNDLE = "cnn-int8"


def test_a_reload_onto_a_bundle_built_again_with_other_weights_serves_another_version_only(
    smoke_run, tmp_path, monkeypatch, start_server
):
    runs = tmp_path / "runs"
    shutil.copytree(smoke_run, runs / "smoke")  # built again in this copy only
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(runs))
    assert run_here("export", "bundles", SMOKE, f"--only={BUNDLE}").returncode == 0
    server = start_server(settings_for(runs / "smoke" / f"bundle-{BUNDLE}", admin_token=ADMIN_TOKEN))
    per_channel = f"--export.bundles.{BUNDLE}.per_channel=true"  # other INT8 weights, the same bundle name
    assert run_here("export", "bundles", SMOKE, f"--only={BUNDLE}", per_channel).returncode == 0
    with Client(server.address, token=ADMIN_TOKEN) as client:
        reply = client.reload()
    assert reply["model"]["version"] != reply["previous"]["version"]
    pinned = pb.ClassifyRequest(texts=["a fine film"], model_version=reply["previous"]["version"])
    with server.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        classifier_pb2_grpc.ClassifierStub(channel).Classify(pinned, timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
