import asyncio
import gc
import threading
import time
from types import SimpleNamespace

import grpc
import pytest
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.transport import CLASSIFIER, platform_of

from tests.serve.conftest import GATED, settings_for

MARK = "first-message-mark"


def test_a_runtime_triton_has_no_platform_for_reports_none_and_names_its_backend():
    runtime = SimpleNamespace(spec=SimpleNamespace(runtime="openvino"))
    assert platform_of(runtime) == ("", "openvino")


def test_a_triton_runtime_reports_its_platform():
    assert platform_of(SimpleNamespace(spec=SimpleNamespace(runtime="onnxruntime"))) == (
        "onnxruntime_onnx",
        "onnxruntime",
    )


async def messages_marked() -> int:
    """How many ClassifyRequest messages holding MARK are alive in this process."""
    gc.collect()
    return sum(isinstance(o, pb.ClassifyRequest) and any(MARK in t for t in o.texts) for o in gc.get_objects())


def test_a_stream_request_waiting_for_the_model_holds_no_message(start_server, bundle, slow_tokenizer):
    server = start_server(settings_for(bundle))
    # sent as bytes, so that this side holds no message; gRPC keeps the last one a stream received, hence a second
    messages = [pb.ClassifyRequest(texts=[GATED + text]).SerializeToString() for text in (MARK, "second")]
    end = threading.Event()

    def requests():
        yield from messages
        end.wait(30)

    with server.channel() as channel:
        stream = channel.stream_stream(f"/{CLASSIFIER}/ClassifyStream")(requests(), timeout=30)
        try:
            slow_tokenizer.wait_held(2)  # both requests admitted, waiting for the model's tokenizer
            assert server.call(messages_marked()) == 0
        finally:
            end.set()
            slow_tokenizer.open.set()
            stream.cancel()


def marked(o: object) -> bool:
    return isinstance(o, pb.ClassifyRequest) and any(MARK in t for t in o.texts)


def a_call(o: object) -> bool:
    return type(o).__name__ == "_ServicerContext"  # gRPC's context of a call on the server


async def alive(which, seconds: float) -> int:
    """How many objects `which` picks are alive, without a pass of the collector: the count once it reaches 0, else
    after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        count = sum(map(which, gc.get_objects()))
        if count == 0 or time.monotonic() > deadline:
            return count
        await asyncio.sleep(0.05)


@pytest.fixture
def refused_once(start_server, bundle):
    """`refused_once(which) -> int`: how many objects `which` picks stay alive, the collector off, after a refused
    Classify of three texts, MARK among them, to a server that takes two."""
    server = start_server(settings_for(bundle, max_texts=2))
    request = pb.ClassifyRequest(texts=[MARK, "two", "three"]).SerializeToString()  # held as bytes here

    def refused_once(which) -> int:
        gc.collect()
        gc.disable()  # what a reference cycle holds would stay until the collector's next pass
        try:
            with server.channel() as channel, pytest.raises(grpc.RpcError):
                channel.unary_unary(f"/{CLASSIFIER}/Classify")(request, timeout=10)
            return server.call(alive(which, 2.0))
        finally:
            gc.enable()

    return refused_once


def test_a_refused_request_is_freed_without_the_collector(refused_once):
    assert refused_once(marked) == 0


def test_a_refused_call_is_freed_without_the_collector(refused_once):
    assert refused_once(a_call) == 0
