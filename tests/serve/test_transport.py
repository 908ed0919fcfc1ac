import gc
import threading
from types import SimpleNamespace

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
