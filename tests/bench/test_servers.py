"""The echo and bare servers that the serving benchmark measures the server against."""

import asyncio

import grpc
import pytest
from edgedistill.bench import servers
from edgedistill.bench.servers import create_baseline_server
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serve.conftest import RunningServer, settings_for, write_engine


def classify_baseline(texts: list[str], bundle=None):
    """Start a baseline server of `bench.servers` (the bare one with `bundle`), classify `texts`, check health, stop."""

    async def exercise():
        server, port = await create_baseline_server("127.0.0.1", 0, bundle)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await classifier_pb2_grpc.ClassifierStub(channel).Classify(
                    pb.ClassifyRequest(texts=texts), timeout=10
                )
                status = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        finally:
            await server.stop(None)
        return reply, status

    return asyncio.run(exercise())


def test_echo_server_answers_classify_and_health():
    reply, status = classify_baseline(["one", "two", "three"])
    assert [p.label for p in reply.predictions] == ["positive"] * 3
    assert list(reply.predictions[0].probabilities) == pytest.approx([0.25, 0.75])
    assert status.status == health_pb2.HealthCheckResponse.SERVING


def echo_classify(request: pb.ClassifyRequest) -> pb.ClassifyResponse:
    """`Classify` of `request` on an echo server started here, in this environment."""

    async def exercise():
        server, port = await create_baseline_server("127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                return await classifier_pb2_grpc.ClassifierStub(channel).Classify(request, timeout=10)
        finally:
            await server.stop(None)

    return asyncio.run(exercise())


def test_the_echo_server_refuses_a_message_over_the_environments_max_message_bytes(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_MAX_MESSAGE_BYTES", "4096")
    with pytest.raises(grpc.RpcError) as refused:
        echo_classify(pb.ClassifyRequest(texts=["a fine film"] * 500))  # 6.5 KB
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_echo_server_sends_a_reply_over_any_message_limit(monkeypatch):
    monkeypatch.delenv("EDGEDISTILL_MAX_MESSAGE_BYTES", raising=False)
    reply = echo_classify(pb.ClassifyRequest(texts=["a"] * 40_000))  # 120 KB, answered with 1.6 MB: over the 1 MiB
    assert len(reply.predictions) == 40_000


def test_bare_server_answers_as_the_server_does(bundle):
    texts = ["a great movie", "the plot was dull and boring", "fun"]
    server = RunningServer(settings_for(bundle))
    try:
        with server.channel() as channel:
            expected = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=texts), timeout=10)
    finally:
        server.close()
    reply, status = classify_baseline(texts, bundle)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    assert reply.model_name == expected.model_name
    assert reply.model_version == expected.model_version
    assert [p.label for p in reply.predictions] == [p.label for p in expected.predictions]
    assert len({p.label for p in reply.predictions}) == 2  # the texts do not all get one label
    for got, want in zip(reply.predictions, expected.predictions, strict=True):
        assert list(got.logits) == pytest.approx(list(want.logits), abs=1e-5)
        assert list(got.probabilities) == pytest.approx(list(want.probabilities), abs=1e-6)


def test_the_echo_servers_command_serves_no_bundle():
    assert "--bundle" not in servers.command(50052)


def test_the_bare_servers_command_names_its_bundle_and_threads(tmp_path):
    assert servers.command(50052, tmp_path, threads=2)[-4:] == ["--bundle", str(tmp_path), "--threads", "2"]


def test_the_bare_servers_command_gives_a_tensorrt_engine_no_threads(tmp_path):
    engine = write_engine(tmp_path / "engine")
    assert servers.command(50052, engine, threads=2)[-2:] == ["--bundle", str(engine)]


@pytest.fixture
def served_with(monkeypatch):
    """The arguments `servers.main` would start a server with, recorded instead of serving."""
    calls = []

    async def record(*args):
        calls.append(args)

    monkeypatch.setattr(servers, "serve", record)
    return calls


def test_threads_without_a_bundle_are_refused_by_the_parser(served_with):
    with pytest.raises(SystemExit) as exited:
        servers.main(["--port", "0", "--threads", "2"])
    assert exited.value.code == 2


def test_threads_without_a_bundle_are_refused_naming_both(served_with, capsys):
    with pytest.raises(SystemExit):
        servers.main(["--port", "0", "--threads", "2"])
    assert "--threads sets the bare server's threads: give --bundle" in capsys.readouterr().err


def test_threads_on_a_tensorrt_engine_are_refused_by_the_parser(served_with, tmp_path):
    engine = write_engine(tmp_path / "engine")
    with pytest.raises(SystemExit) as exited:
        servers.main(["--port", "0", "--bundle", str(engine), "--threads", "2"])
    assert exited.value.code == 2


def test_threads_on_a_tensorrt_engine_are_refused_saying_why(served_with, tmp_path, capsys):
    engine = write_engine(tmp_path / "engine")
    with pytest.raises(SystemExit):
        servers.main(["--port", "0", "--bundle", str(engine), "--threads", "2"])
    assert "is a TensorRT engine (runtime 'tensorrt'), which runs on its GPU without ONNX Runtime" in (
        capsys.readouterr().err
    )


def test_the_bare_server_takes_one_thread_unless_told(served_with, tmp_path):
    servers.main(["--port", "0", "--bundle", str(tmp_path)])
    assert served_with == [("127.0.0.1", 0, tmp_path, 1)]


def test_a_bundle_that_does_not_exist_is_refused_by_the_parser(tmp_path):
    with pytest.raises(SystemExit) as exited:
        servers.main(["--port", "0", "--bundle", str(tmp_path / "none")])
    assert exited.value.code == 2


def test_a_file_given_as_the_bundle_is_refused_naming_its_folder(tmp_path, capsys):
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(SystemExit):
        servers.main(["--port", "0", "--bundle", str(tmp_path / "model.onnx")])
    assert f"is a file, not an artifact folder: give its folder, {tmp_path}" in capsys.readouterr().err


def test_negative_threads_are_refused_by_the_parser(served_with, bundle):
    with pytest.raises(SystemExit) as exited:
        servers.main(["--port", "0", "--bundle", str(bundle), "--threads", "-3"])
    assert exited.value.code == 2


def test_a_setting_the_bare_server_cannot_use_is_refused_by_the_parser(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_SPIN", "sometimes")
    with pytest.raises(SystemExit) as exited:
        servers.main(["--port", "0", "--bundle", str(bundle)])
    assert exited.value.code == 2
