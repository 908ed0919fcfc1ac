"""Each call's log line: what an on-call reader needs, and nothing of the request's text."""

import asyncio
import functools
import io
import json
import logging
import re
import time

import grpc
import pytest
from edgedistill.serve import observe
from edgedistill.serve.logs import MODEL, JsonFormatter
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc

from tests.serve.conftest import GATED, RunningServer, settings_for

CLASSIFY = "/edgedistill.v1.Classifier/Classify"
KSERVE_INFER = "/inference.GRPCInferenceService/ModelInfer"
NEW_ID = re.compile(r"[0-9a-f]{32}")  # a request id the server made
OVER_LONG_ID = "r" * (observe.MAX_REQUEST_ID + 1)


@pytest.fixture
def access_lines():
    """`read() -> list[dict]`: the `serve.access` lines logged so far, as the server writes them (JSON)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("serve.access")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    logger.removeHandler(handler)
    logger.setLevel(level)


def logged(access_lines, count: int = 1, **fields) -> list[dict]:
    """The access lines with `fields` (default: the `rpc` lines), once `count` are there or 5 s have passed."""
    fields = fields or {"event": "rpc"}
    deadline = time.monotonic() + 5
    while (
        len(lines := [e for e in access_lines() if fields.items() <= e.items()]) < count and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    return lines


def test_a_call_no_model_took_names_no_model_whatever_context_the_server_started_in(bundle, access_lines):
    token = MODEL.set(("stale", "9"))  # as a model looked up before the server started leaves it
    server = RunningServer(settings_for(bundle))
    MODEL.reset(token)
    try:
        with server.channel() as channel, pytest.raises(grpc.RpcError):
            request = pb.ClassifyRequest(texts=["words"], model_name="nope")
            classifier_pb2_grpc.ClassifierStub(channel).Classify(request, timeout=10)
        lines = logged(access_lines)
    finally:
        server.close()
    assert "model" not in lines[0]


def test_a_failed_call_logs_its_reason_and_model_but_not_its_text(served, access_lines):
    with served.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        for request, request_id in (
            (pb.ClassifyRequest(texts=["secret words"], text_pairs=["secret pair"]), "pairs"),
            (pb.ClassifyRequest(texts=["secret words"], model_name="nope"), "unknown"),
        ):
            with pytest.raises(grpc.RpcError):
                stub.Classify(request, timeout=10, metadata=[("x-request-id", request_id)])
    lines = logged(access_lines, 2)
    pairs, unknown = (next(e for e in lines if e["request_id"] == request_id) for request_id in ("pairs", "unknown"))
    assert pairs["method"] == CLASSIFY
    assert pairs["code"] == "INVALID_ARGUMENT"
    assert "takes single texts, not text pairs" in pairs["details"]
    assert pairs["model"] == "tiny-sentiment"
    assert pairs["model_version"] == "1"
    assert unknown["code"] == "NOT_FOUND"
    assert "unknown model 'nope'" in unknown["details"]
    assert "model" not in unknown  # no model answered it
    assert all("secret" not in json.dumps(e) for e in lines)


def test_a_failed_stream_logs_the_model_that_answered_it(served, access_lines):
    with served.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        requests = [pb.ClassifyRequest(texts=["secret words"]), pb.ClassifyRequest()]  # the second is empty
        replies = stub.ClassifyStream(iter(requests), timeout=10, metadata=[("x-request-id", "stream")])
        with pytest.raises(grpc.RpcError):
            list(replies)
    lines = logged(access_lines, request_id="stream")
    (line,) = lines
    assert line["code"] == "INVALID_ARGUMENT"
    assert line["details"] == "stream request 1: empty request: send at least one text"
    assert line["model"] == "tiny-sentiment"
    assert line["model_version"] == "1"


def refused_kserve_call(served, request_id: str) -> grpc.RpcError:
    """The error of a ModelInfer with `request_id` as its KServe `id`, refused for an output the model lacks."""
    request = kserve_pb2.ModelInferRequest(
        id=request_id,
        inputs=[{"name": "text", "datatype": "BYTES", "shape": [1], "contents": {"bytes_contents": [b"good"]}}],
        outputs=[{"name": "nope"}],
    )
    with served.channel() as channel, pytest.raises(grpc.RpcError) as refused:
        kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    return refused.value


def test_a_kserve_request_id_names_the_call_without_an_x_request_id(served, access_lines):
    refused = refused_kserve_call(served, "triton-7")
    assert dict(refused.trailing_metadata())["x-request-id"] == "triton-7"
    lines = logged(access_lines)
    (line,) = lines
    assert line["request_id"] == "triton-7"
    assert line["code"] == "INVALID_ARGUMENT"


def test_a_kserve_request_id_names_the_call_on_a_server_with_a_token(start_server, bundle):
    # with a token the request is read after the metadata: its id still names the call
    server = start_server(settings_for(bundle, token="s3cret"))
    request = kserve_pb2.ModelInferRequest(
        id="triton-8",
        inputs=[{"name": "text", "datatype": "BYTES", "shape": [1], "contents": {"bytes_contents": [b"good"]}}],
    )
    with server.channel() as channel:
        stub = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ModelInfer.with_call(request, metadata=(("authorization", "Bearer s3cret"),), timeout=10)
    assert dict(call.trailing_metadata())["x-request-id"] == "triton-8"


def test_a_kserve_request_id_does_not_name_a_call_refused_for_its_token(start_server, bundle):
    # the token is checked before the request is read: a new id names the refused call
    server = start_server(settings_for(bundle, token="s3cret"))
    request = kserve_pb2.ModelInferRequest(
        id="triton-9",
        inputs=[{"name": "text", "datatype": "BYTES", "shape": [1], "contents": {"bytes_contents": [b"good"]}}],
    )
    with server.channel() as channel, pytest.raises(grpc.RpcError) as refused:
        kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert dict(refused.value.trailing_metadata())["x-request-id"] != "triton-9"


def test_overload_refusals_are_logged_once_per_interval_with_the_count_left_out(
    start_server, bundle, slow_tokenizer, access_lines, monkeypatch
):
    now = [1000.0]  # the throttle's clock, which moves only when the test moves it
    monkeypatch.setattr(observe, "_Throttle", functools.partial(observe._Throttle, clock=lambda: now[0]))
    server = start_server(settings_for(bundle, max_queued=2, max_texts=2))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        admitted = stub.Classify.future(pb.ClassifyRequest(texts=[GATED, GATED]), timeout=30)
        slow_tokenizer.wait_held(1)  # the queue's two rows taken
        for burst in (10, 1):
            for _ in range(burst):  # a refused call is logged or left out before its client gets the status
                with pytest.raises(grpc.RpcError):
                    stub.Classify(pb.ClassifyRequest(texts=["good"]), timeout=5)
            now[0] += observe.THROTTLE_S
        slow_tokenizer.open.set()
        admitted.result()
    lines = [e for e in access_lines() if e.get("code") == "RESOURCE_EXHAUSTED"]
    assert [line.get("left_out", 0) for line in lines] == [0, 9]


def test_calls_without_the_token_are_logged_once_per_interval(start_server, bundle, access_lines, monkeypatch):
    monkeypatch.setattr(observe, "THROTTLE_S", 60.0)
    server = start_server(settings_for(bundle, token="s3cret"))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        for _ in range(10):
            with pytest.raises(grpc.RpcError):
                stub.Classify(pb.ClassifyRequest(texts=["good"]), timeout=5)
    assert len([e for e in access_lines() if e.get("code") == "UNAUTHENTICATED"]) == 1


@pytest.mark.parametrize(
    ("text", "timeout", "code"),
    [(" ", 5.0, "INVALID_ARGUMENT"), (GATED, 0.2, "DEADLINE_EXCEEDED")],
    ids=["invalid", "expired while tokenized"],
)
def test_a_clients_refused_calls_are_logged_once_per_interval(
    start_server, bundle, slow_tokenizer, access_lines, monkeypatch, text, timeout, code
):
    monkeypatch.setattr(observe, "THROTTLE_S", 60.0)
    server = start_server(settings_for(bundle))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        for _ in range(10):
            with pytest.raises(grpc.RpcError):
                stub.Classify(pb.ClassifyRequest(texts=[text]), timeout=timeout)
    assert len(logged(access_lines, code=code)) == 1


def test_a_request_id_over_the_limit_is_replaced_by_a_new_one_not_cut(served):
    with served.channel() as channel:
        _, call = classifier_pb2_grpc.ClassifierStub(channel).Classify.with_call(
            pb.ClassifyRequest(texts=["good"]), metadata=[("x-request-id", OVER_LONG_ID)], timeout=10
        )
    assert NEW_ID.fullmatch(dict(call.trailing_metadata())["x-request-id"])


def test_a_kserve_request_id_over_the_limit_is_replaced_by_a_new_one_not_cut(served):
    refused = refused_kserve_call(served, OVER_LONG_ID)
    assert NEW_ID.fullmatch(dict(refused.trailing_metadata())["x-request-id"])


def test_a_kserve_request_id_over_the_limit_is_replaced_in_the_log_as_in_the_trailer(
    start_server, bundle, access_lines
):
    server = start_server(settings_for(bundle, access_log=True))  # every call logged, none left out
    request_id = dict(refused_kserve_call(server, OVER_LONG_ID).trailing_metadata())["x-request-id"]
    assert [line["request_id"] for line in logged(access_lines, method=KSERVE_INFER)] == [request_id]


def test_a_kserve_reply_echoes_its_requests_id_whole_past_the_request_id_limit(served):
    request = kserve_pb2.ModelInferRequest(
        id=OVER_LONG_ID,
        inputs=[{"name": "text", "datatype": "BYTES", "shape": [1], "contents": {"bytes_contents": [b"good"]}}],
    )
    with served.channel() as channel:
        reply = kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert reply.id == OVER_LONG_ID  # KServe v2: the response's id is its request's


@pytest.mark.parametrize("character", ["x", "é", "€"], ids=["1 byte", "2 bytes", "3 bytes"])
def test_bounded_details_fit_the_limit_with_the_cut_mark(character):
    assert len(observe.bounded(character * 3000).encode()) <= observe.MAX_DETAILS_BYTES


def test_bounded_details_keep_whole_characters_at_the_cut():
    assert set(observe.bounded("€" * 3000).replace(observe.CUT_MARK, "")) == {"€"}


class Remaining:
    """A call's context whose deadline is `seconds` away (None: no deadline)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds

    def time_remaining(self) -> float | None:
        return self.seconds


def test_a_call_cancelled_just_before_its_deadline_is_counted_as_expired():
    # the client's own deadline timer ends the call a moment before the server's
    assert (
        observe._status_code(Remaining(0.01), asyncio.CancelledError(), cut=False) == grpc.StatusCode.DEADLINE_EXCEEDED
    )


def test_a_call_cancelled_well_before_its_deadline_is_counted_as_cancelled():
    assert observe._status_code(Remaining(5.0), asyncio.CancelledError(), cut=False) == grpc.StatusCode.CANCELLED


def test_a_call_cancelled_without_a_deadline_is_counted_as_cancelled():
    assert observe._status_code(Remaining(None), asyncio.CancelledError(), cut=False) == grpc.StatusCode.CANCELLED
