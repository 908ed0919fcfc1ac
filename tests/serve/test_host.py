"""The served runtime: what of the model's outputs reaches a request, what a bundle that cannot be served is refused
with, and a device that fails its release."""

import asyncio
import json
import subprocess
import sys

import grpc
import pytest
from edgedistill.common.runtime import DeviceError
from edgedistill.serve.app import EXIT_FAULT
from edgedistill.serve.errors import BundleRejected, ReloadFailed
from edgedistill.serve.host import ModelHost, ModelRuntime
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc
from onnx import TensorProto, helper

from tests.common.test_bundle import another_stages_artifact
from tests.serve.conftest import ROOT, serve_command, settings_for, subprocess_env, tiny_model, write_bundle


def test_a_model_with_an_output_per_token_beside_its_logits_classifies_a_request_over_several_batches(
    start_server, tmp_path
):
    model = tiny_model()  # its attention mask as floats, [batch, sequence], an output the spec does not name
    model.graph.output.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "sequence"]))
    folder = write_bundle(tmp_path / "bundle-extra-output", model=model.SerializeToString())
    server = start_server(settings_for(folder, max_batch_size=1, inline_infer_ms=0))
    texts = ["a good film", "the plot was very boring and the acting was not good"]  # a batch each, padded apart
    with server.channel() as channel:
        reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=texts), timeout=10)
    assert [p.label for p in reply.predictions] == ["positive", "negative"]


def refusal_of(folder) -> str:
    """What loading `folder` as the server's bundle is refused with."""
    with pytest.raises(BundleRejected) as caught:
        ModelRuntime.load(folder, settings_for(folder))
    return str(caught.value)


def test_a_folder_of_another_stage_is_refused_saying_to_name_a_bundle_folder(tmp_path):
    assert "name a bundle folder" in refusal_of(another_stages_artifact(tmp_path / "teacher"))


def test_a_folder_of_another_stage_is_refused_without_advice_to_build_it_again(tmp_path):
    assert "build it again" not in refusal_of(another_stages_artifact(tmp_path / "teacher"))


def test_a_damaged_bundle_in_a_folder_of_any_name_names_the_command_that_builds_bundles(tmp_path):
    folder = write_bundle(tmp_path / "sentiment-v3")  # a bundle copied under a name of its own
    (folder / "tokenizer.json").write_text("{}")
    assert refusal_of(folder).endswith("; build it again: edgedistill bundles RECIPE")


class BrokenDevice:
    """`runner` on a device a CUDA error breaks (cudaErrorIllegalAddress) at the first call whose inputs `breaks`:
    from then on every call fails, and so does releasing it, as `EngineRunner.close`'s cudaFree does."""

    def __init__(self, runner, breaks=lambda inputs: True):
        self.runner, self.breaks, self.broken = runner, breaks, False

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def infer(self, inputs):
        self.broken = self.broken or bool(self.breaks(inputs))
        if self.broken:
            raise DeviceError("TensorRT execution failed: an illegal memory access was encountered")
        return self.runner.infer(inputs)

    def close(self):
        self.runner.close()
        if self.broken:
            raise DeviceError("cudaFree failed: cudaErrorIllegalAddress")


BREAKS_ON = "awful"  # a word of the tiny vocabulary that warm-up never sends
# `python -m serve` with backends that break on a call holding BREAKS_ON
BREAKING_SERVER = """
import runpy, sys
import edgedistill.serve.host as serve_host
from tests.serve.conftest import VOCAB
from tests.serve.test_host import BREAKS_ON, BrokenDevice

real = serve_host.load_backend
breaks = lambda inputs: (inputs["input_ids"] == VOCAB.index(BREAKS_ON)).any()
serve_host.load_backend = lambda *args, **kwargs: BrokenDevice(real(*args, **kwargs), breaks)
sys.argv = ["serve", *sys.argv[1:]]
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


def test_a_device_fault_whose_backend_fails_its_release_too_exits_for_a_restart(bundle):
    command = [sys.executable, "-c", BREAKING_SERVER, *serve_command(bundle)[3:], "--metrics-port", "off"]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        port = next(entry["port"] for entry in map(json.loads, proc.stdout) if entry.get("event") == "serving")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError):
            classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=[BREAKS_ON]), timeout=20)
        assert proc.wait(30) == EXIT_FAULT
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def load_on_a_broken_device(folder, settings, metrics=None, on_fault=None) -> ModelRuntime:
    """`ModelRuntime.load`, its backend on a device that breaks at its first call (the warm-up's)."""
    runtime = ModelRuntime.load(folder, settings, metrics, on_fault)
    runtime.backend = BrokenDevice(runtime.backend)
    return runtime


def test_a_warm_up_failing_on_its_device_refuses_the_bundle_though_its_release_fails_too(bundle):
    settings = settings_for(bundle)
    with pytest.raises(BundleRejected, match="illegal memory access"):
        asyncio.run(ModelHost(settings).activate(load_on_a_broken_device(bundle, settings)))


def test_a_reload_whose_warm_up_fails_on_its_device_fails_though_its_release_fails_too(bundle):
    settings = settings_for(bundle)

    async def reload():
        host = ModelHost(settings, load=load_on_a_broken_device)
        await host.activate(ModelRuntime.load(bundle, settings))
        try:
            await host.reload(bundle)
        finally:
            await host.close(1)

    with pytest.raises(ReloadFailed, match="illegal memory access"):
        asyncio.run(reload())
