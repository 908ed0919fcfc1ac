"""Operating the server: health, reflection, metrics, auth, TLS, reload, overload, deadlines."""

import asyncio
import contextlib
import functools
import gc
import hashlib
import io
import json
import logging
import queue
import re
import shutil
import threading
import time
import urllib.request

import edgedistill.common.bundle as common_bundle
import edgedistill.serve.host as serve_host
import grpc
import pytest
from edgedistill.serve import tensors
from edgedistill.serve.app import create_server
from edgedistill.serve.client import Client
from edgedistill.serve.encoding import TextEncoder
from edgedistill.serve.errors import BundleRejected
from edgedistill.serve.host import TOKENIZE_THREADS
from edgedistill.serve.logs import JsonFormatter
from edgedistill.serve.observe import CUT_DETAILS, UNSENT_DETAILS, CallObserver
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import generate_latest

from tests.conftest import wait_until
from tests.serve.conftest import GATED, settings_for
from tests.serve.rawh2 import END_HEADERS, END_STREAM, Kind, RawClient, frame, header_block, message_prefix

SERVICES = ("", "edgedistill.v1.Classifier", "inference.GRPCInferenceService")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
ADMIN_TOKEN = "admin-token"
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)


def health_of(channel, service: str = "") -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def metric(scrape: str, sample_name: str, **labels) -> float:
    """The value of one sample in a Prometheus text scrape (0 when absent)."""
    for line in scrape.splitlines():
        if not line.startswith(sample_name):
            continue
        sample, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', sample))
        if sample.split("{")[0] == sample_name and all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return 0.0


def scrape(server) -> str:
    return urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()


def corrupt(folder):
    """Change the model's bytes behind the manifest's back."""
    model = folder / "model.onnx"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    return folder


def test_health_is_not_serving_until_warm_then_serving_then_not_serving_while_draining(start_server, bundle):
    server = start_server(settings_for(bundle), warm=False)
    channel = server.channel()
    assert [health_of(channel, s) for s in SERVICES] == [NOT_SERVING] * 3
    assert not kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ServerReady(kserve_pb2.ServerReadyRequest()).ready
    with pytest.raises(grpc.RpcError) as caught:
        classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=["good"]), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "warming up" in caught.value.details()

    server.call(server.server.warm_up())
    assert [health_of(channel, s) for s in SERVICES] == [SERVING] * 3

    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert next(watch).status == SERVING
    stopping = asyncio.run_coroutine_threadsafe(server.server.stop(grace=2), server.loop)
    assert next(watch).status == NOT_SERVING
    watch.cancel()
    stopping.result(10)
    channel.close()


def capture_json(caplog, monkeypatch) -> None:
    """Capture the server's JSON log lines from here on, formatted as they are logged (request ids and all); what
    was captured before (such as asyncio's line about a task of an earlier test collected meanwhile) is dropped.
    pytest keeps one capture handler for every test: its formatter is put back after the test."""
    monkeypatch.setattr(caplog.handler, "formatter", JsonFormatter())
    caplog.clear()


def logged_events(caplog) -> set[str]:
    """The events of the JSON lines captured so far (`capture_json`)."""
    return {json.loads(line).get("event") for line in caplog.text.splitlines()}


def stop_with_a_call_held(server, gate, cancel_it: bool, caplog, monkeypatch) -> dict:
    """Stop `server` while a Classify call is held in the tokenizer, with a grace of 0.3 s; `cancel_it`: its client
    cancels it meanwhile, before the grace runs out (of 5 s then, so that a stall of the machine does not let it run
    out first; the cancelled call ends the drain). The client's status code, the server's scrape after it stopped
    and its log lines."""
    capture_json(caplog, monkeypatch)
    with caplog.at_level(logging.INFO), server.channel() as channel:
        call = classifier_pb2_grpc.ClassifierStub(channel).Classify.future(
            pb.ClassifyRequest(texts=[GATED]), timeout=30
        )
        gate.wait_held(1)
        grace = 5.0 if cancel_it else 0.3
        stopping = asyncio.run_coroutine_threadsafe(server.server.stop(grace=grace), server.loop)
        if cancel_it:
            call.cancel()
        stopping.result(10)
        code = grpc.StatusCode.CANCELLED if call.cancelled() else call.exception().code()
    scraped = generate_latest(server.server.metrics.registry).decode()
    return {"code": code, "scrape": scraped, "lines": [json.loads(line) for line in caplog.text.splitlines()]}


@pytest.fixture
def cut_at_shutdown(start_server, bundle, slow_tokenizer, caplog, monkeypatch):
    """A call still running when the shutdown's grace ran out."""
    return stop_with_a_call_held(start_server(settings_for(bundle)), slow_tokenizer, False, caplog, monkeypatch)


def test_a_call_cut_by_the_shutdown_ends_unavailable_for_its_client(cut_at_shutdown):
    assert cut_at_shutdown["code"] == grpc.StatusCode.UNAVAILABLE


def test_a_call_cut_by_the_shutdown_is_counted_as_the_servers_unavailable(cut_at_shutdown):
    assert metric(cut_at_shutdown["scrape"], "edgedistill_errors_total", code="UNAVAILABLE", kind="server") == 1


def test_a_call_cut_by_the_shutdown_is_not_counted_as_abandoned_by_its_client(cut_at_shutdown):
    assert metric(cut_at_shutdown["scrape"], "edgedistill_abandoned_calls_total", code="CANCELLED") == 0


def test_a_call_cut_by_the_shutdown_is_logged_as_a_warning_saying_so(cut_at_shutdown):
    (line,) = [e for e in cut_at_shutdown["lines"] if e.get("event") == "rpc"]
    assert line["level"] == "WARNING"
    assert line["code"] == "UNAVAILABLE"
    assert line["details"] == CUT_DETAILS


def test_the_stopped_line_counts_the_calls_the_shutdown_cut(cut_at_shutdown):
    (line,) = [e for e in cut_at_shutdown["lines"] if e.get("event") == "stopped"]
    assert line["cut_calls"] == 1


def test_a_call_its_client_cancels_during_the_drain_is_counted_as_abandoned(
    start_server, bundle, slow_tokenizer, caplog, monkeypatch
):
    cancelled = stop_with_a_call_held(start_server(settings_for(bundle)), slow_tokenizer, True, caplog, monkeypatch)
    assert metric(cancelled["scrape"], "edgedistill_abandoned_calls_total", code="CANCELLED") == 1


def test_reflection_lists_both_services(served):
    with served.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="edgedistill.v1.Classifier"),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService"),
        ]
        listed, classifier, kserve = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
    names = {s.name for s in listed.list_services_response.service}
    assert {"edgedistill.v1.Classifier", "inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names
    assert classifier.file_descriptor_response.file_descriptor_proto
    assert kserve.file_descriptor_response.file_descriptor_proto


@pytest.mark.parametrize(
    ("symbol", "file"),
    [
        ("edgedistill.v1.Classifier.Classify", "classifier.proto"),
        ("inference.GRPCInferenceService.ModelInfer", "kserve.proto"),
    ],
)
def test_reflection_finds_the_file_of_an_rpc_by_its_full_name(served, symbol, file):
    with served.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
        (reply,) = stub.ServerReflectionInfo(iter([request]), timeout=10)
    found = [FileDescriptorProto.FromString(d).name for d in reply.file_descriptor_response.file_descriptor_proto]
    assert found == [file]


@pytest.fixture
def small_messages(make_bundle, start_server):
    """A server whose MAX_MESSAGE_BYTES (1 KiB, the least it takes) is below its full reply to MAX_TEXTS texts."""
    return start_server(settings_for(make_bundle(), max_message_bytes=1024, max_texts=64, max_queued=64))


def test_a_reply_larger_than_max_message_bytes_is_sent(small_messages):
    with small_messages.channel() as channel:
        reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(
            pb.ClassifyRequest(texts=["a good film"] * 64), timeout=10
        )
    assert reply.ByteSize() > 1024


def test_reflection_describes_a_service_whose_file_is_larger_than_max_message_bytes(small_messages):
    with small_messages.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService")
        (reply,) = stub.ServerReflectionInfo(iter([request]), timeout=10)
    assert reply.file_descriptor_response.file_descriptor_proto


def test_reflection_answers_not_found_for_an_rpc_a_service_lacks(served):
    with served.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="edgedistill.v1.Classifier.Nope")
        (reply,) = stub.ServerReflectionInfo(iter([request]), timeout=10)
    assert reply.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


@pytest.fixture
def reflection_of_bytes_that_do_not_parse(start_server, bundle):
    """A reflection stream whose message does not parse as a ServerReflectionRequest: its client's error and the
    server's scrape."""
    server = start_server(settings_for(bundle))
    method = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    with server.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        list(channel.stream_stream(method)(iter([b"\xff\xff\xff"]), timeout=10))
    deadline = time.monotonic() + 5
    while (
        not metric(text := scrape(server), "edgedistill_requests_total", method=method) and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return {"code": caught.value.code(), "scrape": text}


def test_a_reflection_stream_message_that_does_not_parse_is_refused_invalid_argument(
    reflection_of_bytes_that_do_not_parse,
):
    assert reflection_of_bytes_that_do_not_parse["code"] == grpc.StatusCode.INVALID_ARGUMENT


def test_a_reflection_stream_message_that_does_not_parse_is_counted_as_the_clients_error(
    reflection_of_bytes_that_do_not_parse,
):
    scraped = reflection_of_bytes_that_do_not_parse["scrape"]
    assert metric(scraped, "edgedistill_errors_total", code="INVALID_ARGUMENT", kind="client") == 1


def test_a_reflection_stream_cancelled_while_its_replies_are_sent_counts_as_cancelled(start_server, bundle):
    server = start_server(settings_for(bundle))
    method = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService")
    with server.channel() as channel:
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([request] * 2000), timeout=10
        )
        next(call)
        time.sleep(0.5)  # unread replies fill the flow-control window: the server waits to send the next one
        call.cancel()
    deadline = time.monotonic() + 5
    while (
        not metric(text := scrape(server), "edgedistill_requests_total", method=method) and time.monotonic() < deadline
    ):
        gc.collect()  # an abandoned reply generator is closed only once collected
        time.sleep(0.05)
    assert metric(text, "edgedistill_requests_total", method=method, code="CANCELLED") == 1


CLASSIFY = "/edgedistill.v1.Classifier/Classify"


@pytest.fixture(scope="module")
def two_calls_scraped(served) -> tuple[str, str]:
    """Scrapes of the module's server before and after two calls of Classify: one of two texts, one refused as
    empty."""
    before = scrape(served)
    with served.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        stub.Classify(pb.ClassifyRequest(texts=["good", "bad"]), timeout=10)
        with contextlib.suppress(grpc.RpcError):  # its code is read from the scrape below
            stub.Classify(pb.ClassifyRequest(), timeout=10)
    refused = {"method": CLASSIFY, "code": "INVALID_ARGUMENT"}
    # `abort` sends the status before the handler's wrapper records the call: allow it a moment
    deadline = time.monotonic() + 5
    while (
        metric(after := scrape(served), "edgedistill_requests_total", **refused)
        == metric(before, "edgedistill_requests_total", **refused)
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    return before, after


def rise(scrapes: tuple[str, str], sample_name: str, **labels) -> float:
    """How much a sample rose between two scrapes."""
    before, after = scrapes
    return metric(after, sample_name, **labels) - metric(before, sample_name, **labels)


def test_metrics_count_an_ok_call_by_method_and_code(two_calls_scraped):
    assert rise(two_calls_scraped, "edgedistill_requests_total", method=CLASSIFY, code="OK") == 1


def test_metrics_count_a_refused_call_by_method_and_code(two_calls_scraped):
    assert rise(two_calls_scraped, "edgedistill_requests_total", method=CLASSIFY, code="INVALID_ARGUMENT") == 1


def test_metrics_count_a_refused_call_as_an_error_by_its_code(two_calls_scraped):
    assert rise(two_calls_scraped, "edgedistill_errors_total", code="INVALID_ARGUMENT") == 1


def test_metrics_time_every_call_by_method(two_calls_scraped):
    assert rise(two_calls_scraped, "edgedistill_request_seconds_count", method=CLASSIFY) == 2


def test_metrics_time_the_queue_wait_of_a_request_that_reached_the_batcher(two_calls_scraped):
    assert rise(two_calls_scraped, "edgedistill_queue_wait_seconds_count") == 1


def test_metrics_time_the_inference_of_a_batch(two_calls_scraped):
    assert rise(two_calls_scraped, "edgedistill_inference_seconds_count") >= 1  # the batcher may cut the texts


def test_metrics_sum_the_rows_of_the_batches(two_calls_scraped):
    assert rise(two_calls_scraped, "edgedistill_batch_size_sum") == 2


def test_metrics_show_the_queue_empty_once_the_calls_ended(two_calls_scraped):
    assert "edgedistill_queue_depth 0.0" in two_calls_scraped[1]


def test_metrics_name_the_served_model_its_version_and_providers(two_calls_scraped):
    labels = {"name": "tiny-sentiment", "version": "1", "providers": "CPUExecutionProvider"}
    assert metric(two_calls_scraped[1], "edgedistill_model_info", **labels) == 1


@pytest.mark.parametrize("scheme", ["bearer", "BEARER"])
def test_the_bearer_scheme_is_read_in_any_case(start_server, bundle, scheme):
    server = start_server(settings_for(bundle, token="s3cret"))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        metadata = (("authorization", f"{scheme} s3cret"),)
        assert stub.Classify(pb.ClassifyRequest(texts=["good"]), metadata=metadata, timeout=5).predictions


def classify_streamed(channel: grpc.Channel):
    """`Classify` called with its request streamed (the same on the wire as a unary call)."""
    return channel.stream_unary(
        CLASSIFY,
        request_serializer=pb.ClassifyRequest.SerializeToString,
        response_deserializer=pb.ClassifyResponse.FromString,
    )


@contextlib.contextmanager
def stalled_without_the_token(channel: grpc.Channel):
    """A `Classify` future with a wrong token whose client sends no message until the block ends."""
    sent = threading.Event()

    def stalled():
        sent.wait(10)
        yield pb.ClassifyRequest(texts=["good"])

    try:
        yield classify_streamed(channel).future(stalled(), metadata=(("authorization", "Bearer wrong"),), timeout=10)
    finally:
        sent.set()


def classified(channel: grpc.Channel) -> bool:
    """Whether a `Classify` with the token was answered, False where MAX_CONCURRENT_RPCS refused it. gRPC frees a
    finished call's place among them once the server has finished it, moments after its client has the status: a
    test that a call holds no place polls this, where a call that held one would hold it for seconds."""
    stub = classifier_pb2_grpc.ClassifierStub(channel)
    try:
        reply = stub.Classify(
            pb.ClassifyRequest(texts=["good"]), metadata=(("authorization", "Bearer s3cret"),), timeout=5
        )
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return False
    return bool(reply.predictions)


def test_a_call_without_the_token_is_refused_before_its_request_arrives(start_server, bundle):
    server = start_server(settings_for(bundle, token="s3cret"))
    with server.channel() as channel, stalled_without_the_token(channel) as call:
        assert call.exception(timeout=3).code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_call_without_the_token_holds_no_place_among_the_concurrent_calls(start_server, bundle):
    server = start_server(settings_for(bundle, token="s3cret", max_concurrent_rpcs=1))
    with server.channel() as channel, stalled_without_the_token(channel) as call:
        call.exception(timeout=3)
        wait_until(functools.partial(classified, channel), "the refused call kept its place", timeout=5)


def test_a_call_with_the_token_that_ends_before_its_request_is_invalid(start_server, bundle):
    server = start_server(settings_for(bundle, token="s3cret"))
    with server.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        classify_streamed(channel)(iter([]), metadata=(("authorization", "Bearer s3cret"),), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def answered(client: RawClient) -> set[int]:
    """The streams the server has ended: trailers (HEADERS with END_STREAM) or RST_STREAM."""
    return {
        stream
        for kind, flags, stream, _ in list(client.frames)
        if kind == Kind.RST_STREAM or (kind == Kind.HEADERS and flags & END_STREAM)
    }


def test_calls_with_the_token_that_half_close_before_their_request_hold_no_place(start_server, bundle):
    # gRPC's unary path never answers such a call, which holds its place until CONNECTION_AGE_S: this one answers
    server = start_server(settings_for(bundle, token="s3cret", max_concurrent_rpcs=2))
    client = RawClient(server.port)
    try:
        for stream in (1, 3, 5, 7):  # twice the places: headers with END_STREAM, no message
            headers = header_block(CLASSIFY, (("authorization", "Bearer s3cret"),))
            client.send(frame(Kind.HEADERS, END_HEADERS | END_STREAM, stream, headers))
        deadline = time.monotonic() + 5
        while len(answered(client)) < 4 and time.monotonic() < deadline:  # the server has taken them all
            time.sleep(0.01)
        with server.channel() as channel:
            wait_until(functools.partial(classified, channel), "the half-closed calls kept their places", timeout=5)
    finally:
        client.close()


@pytest.fixture
def request_awaited(monkeypatch) -> threading.Event:
    """Set once a `Classify` with the token has passed its check on a server started in the test: the server then
    awaits its request (`CallObserver.wrap`), and a cancellation reaches the call there at the earliest, since
    nothing else runs on the server's event loop before it."""
    awaited = threading.Event()
    denied = CallObserver._denied

    def checked(self, method: str, metadata: dict[str, str]) -> str | None:
        why = denied(self, method, metadata)
        if method == CLASSIFY and why is None:
            awaited.set()
        return why

    monkeypatch.setattr(CallObserver, "_denied", checked)
    return awaited


def ended_while_its_request_is_awaited(start_server, bundle, request_awaited, cancel: bool) -> str:
    """The scrape of a server with a token once a call with the token, whose message never comes, has ended and been
    counted: its client cancels it (`cancel`), else its 0.5 s deadline passes."""
    server = start_server(settings_for(bundle, token="s3cret"))
    sent = threading.Event()

    def stalled():
        sent.wait(10)
        yield pb.ClassifyRequest(texts=["good"])

    with server.channel() as channel:
        timeout = 10 if cancel else 0.5
        call = classify_streamed(channel).future(
            stalled(), metadata=(("authorization", "Bearer s3cret"),), timeout=timeout
        )
        try:
            assert request_awaited.wait(5), "the server never awaited the call's request"
            if cancel:
                call.cancel()
            else:
                call.exception(timeout=5)
        finally:
            sent.set()

    def counted() -> float:
        return metric(scrape(server), "edgedistill_requests_total", method=CLASSIFY)

    wait_until(counted, "the call was never counted", 5)
    return scrape(server)


def test_a_call_cancelled_while_its_request_is_awaited_is_counted_as_abandoned(start_server, bundle, request_awaited):
    scraped = ended_while_its_request_is_awaited(start_server, bundle, request_awaited, cancel=True)
    assert metric(scraped, "edgedistill_requests_total", method=CLASSIFY, code="CANCELLED") == 1


def test_a_call_cancelled_while_its_request_is_awaited_is_no_clients_error(start_server, bundle, request_awaited):
    scraped = ended_while_its_request_is_awaited(start_server, bundle, request_awaited, cancel=True)
    assert metric(scraped, "edgedistill_errors_total", code="INVALID_ARGUMENT") == 0


def test_a_call_whose_deadline_passes_while_its_request_is_awaited_is_counted_as_expired(
    start_server, bundle, request_awaited
):
    scraped = ended_while_its_request_is_awaited(start_server, bundle, request_awaited, cancel=False)
    assert metric(scraped, "edgedistill_requests_total", method=CLASSIFY, code="DEADLINE_EXCEEDED") == 1


@pytest.fixture
def unsent_at_shutdown(start_server, bundle, caplog, monkeypatch, request_awaited) -> dict:
    """A call with the token whose message had not come when the shutdown's grace (0.3 s) ran out: the server's
    scrape after it stopped, and its log lines."""
    server = start_server(settings_for(bundle, token="s3cret"))
    capture_json(caplog, monkeypatch)
    sent = threading.Event()

    def stalled():
        sent.wait(10)
        yield pb.ClassifyRequest(texts=["good"])

    with caplog.at_level(logging.INFO), server.channel() as channel:
        call = classify_streamed(channel).future(stalled(), metadata=(("authorization", "Bearer s3cret"),), timeout=30)
        try:
            assert request_awaited.wait(5), "the server never awaited the call's request"
            asyncio.run_coroutine_threadsafe(server.server.stop(grace=0.3), server.loop).result(10)
            call.exception(timeout=5)
            # the handler ends on the server's loop after the client saw it end: its metrics, then its line
            wait_until(lambda: '"event": "rpc"' in caplog.text, "the call's log line")
        finally:
            sent.set()
    scraped = generate_latest(server.server.metrics.registry).decode()
    return {"scrape": scraped, "lines": [json.loads(line) for line in caplog.text.splitlines()]}


def test_a_call_whose_request_had_not_come_when_the_grace_ran_out_is_not_counted_as_cut(unsent_at_shutdown):
    (line,) = [e for e in unsent_at_shutdown["lines"] if e.get("event") == "stopped"]
    assert line["cut_calls"] == 0


def test_a_call_whose_request_had_not_come_when_the_grace_ran_out_is_its_clients_unavailable(unsent_at_shutdown):
    assert metric(unsent_at_shutdown["scrape"], "edgedistill_errors_total", code="UNAVAILABLE", kind="client") == 1


def test_a_call_whose_request_had_not_come_when_the_grace_ran_out_is_logged_saying_so(unsent_at_shutdown):
    (line,) = [e for e in unsent_at_shutdown["lines"] if e.get("event") == "rpc"]
    assert line["details"] == UNSENT_DETAILS


def test_a_message_over_the_limit_on_a_server_with_a_token_is_counted_as_cancelled(start_server, bundle):
    # gRPC refuses it RESOURCE_EXHAUSTED and ends the handler reading it as a cancellation would, unexplained
    server = start_server(settings_for(bundle, token="s3cret", max_message_bytes=1024))
    with server.channel() as channel, contextlib.suppress(grpc.RpcError):
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        stub.Classify(
            pb.ClassifyRequest(texts=["good " * 400]), metadata=(("authorization", "Bearer s3cret"),), timeout=5
        )
    deadline = time.monotonic() + 5
    while (
        not metric(text := scrape(server), "edgedistill_requests_total", method=CLASSIFY)
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert metric(text, "edgedistill_requests_total", method=CLASSIFY, code="CANCELLED") == 1


def test_bearer_token_is_required_except_for_health(start_server, bundle):
    server = start_server(settings_for(bundle, token="s3cret"))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        request = pb.ClassifyRequest(texts=["good"])
        for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)):
            with pytest.raises(grpc.RpcError) as caught:
                stub.Classify(request, metadata=metadata, timeout=5)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.ClassifyStream(iter([request]), timeout=5))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as caught:
            kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ServerReady(kserve_pb2.ServerReadyRequest(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.Classify(request, metadata=(("authorization", "Bearer s3cret"),), timeout=5).predictions
        assert health_of(channel) == SERVING  # probes need no token
    with Client(server.address, token="s3cret") as client:
        assert client.classify(["a great movie"])["predictions"][0]["label"] == "positive"
    text = scrape(server)
    assert (
        metric(text, "edgedistill_requests_total", method="/edgedistill.v1.Classifier/Classify", code="UNAUTHENTICATED")
        == 3
    )


def test_tls_server_refuses_plaintext_and_serves_a_client_trusting_its_ca(start_server, bundle, certs):
    server = start_server(settings_for(bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key"))
    credentials = grpc.ssl_channel_credentials(root_certificates=(certs / "ca.pem").read_bytes())
    with grpc.secure_channel(server.address, credentials) as channel:
        assert health_of(channel) == SERVING
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as caught:
        health_of(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with Client(server.address, tls_ca=certs / "ca.pem") as client:
        assert client.classify(["awful"])["predictions"][0]["label"] == "negative"


def test_plaintext_health_port_answers_probes_while_the_main_port_uses_tls(start_server, bundle, certs):
    settings = settings_for(bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key", health_port=0)
    server = start_server(settings, warm=False)
    probe = grpc.insecure_channel(f"127.0.0.1:{server.server.health_port}")
    with probe:
        assert health_of(probe) == NOT_SERVING  # not warm yet
        server.call(server.server.warm_up())
        assert health_of(probe) == SERVING
        with pytest.raises(grpc.RpcError) as caught:  # the probe port serves health only
            classifier_pb2_grpc.ClassifierStub(probe).Classify(pb.ClassifyRequest(texts=["good"]), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        server.call(server.server.health.enter_graceful_shutdown())
        assert health_of(probe) == NOT_SERVING


def test_the_health_port_answers_check_but_not_watch_which_it_could_not_bound(start_server, bundle):
    server = start_server(settings_for(bundle, health_port=0))
    with grpc.insecure_channel(f"127.0.0.1:{server.server.health_port}") as probe:
        watch = health_pb2_grpc.HealthStub(probe).Watch(health_pb2.HealthCheckRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as caught:
            next(watch)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_the_health_port_refuses_a_request_larger_than_a_check(start_server, bundle):
    server = start_server(settings_for(bundle, health_port=0))
    with (
        grpc.insecure_channel(f"127.0.0.1:{server.server.health_port}") as probe,
        pytest.raises(grpc.RpcError) as caught,
    ):
        health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest(service="x" * 4096), timeout=5)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def at_call_limit(start_server, bundle):
    """A server with a health port whose MAX_CONCURRENT_RPCS (2) calls are all taken by streams left open."""
    server = start_server(settings_for(bundle, max_concurrent_rpcs=2, health_port=0))
    done = threading.Event()

    def one_request_then_wait():
        yield pb.ClassifyRequest(texts=["good"])
        done.wait()

    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        streams = [stub.ClassifyStream(one_request_then_wait()) for _ in range(2)]
        for stream in streams:
            next(stream)  # answered: the server holds this call
        yield server
        done.set()
        for stream in streams:
            stream.cancel()


def test_the_grpc_port_refuses_health_checks_at_the_call_limit(at_call_limit):
    with grpc.insecure_channel(at_call_limit.address) as channel, pytest.raises(grpc.RpcError) as caught:
        health_of(channel)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_health_port_answers_serving_at_the_call_limit(at_call_limit):
    with grpc.insecure_channel(f"127.0.0.1:{at_call_limit.server.health_port}") as probe:
        assert health_of(probe) == SERVING


def test_mutual_tls_requires_a_client_certificate_from_its_ca(start_server, bundle, certs):
    settings = settings_for(
        bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key", tls_ca=certs / "ca.pem"
    )
    server = start_server(settings)
    anonymous = grpc.ssl_channel_credentials(root_certificates=(certs / "ca.pem").read_bytes())
    with grpc.secure_channel(server.address, anonymous) as channel, pytest.raises(grpc.RpcError) as caught:
        health_of(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    stranger = grpc.ssl_channel_credentials(  # a client certificate the server's CA did not sign
        (certs / "ca.pem").read_bytes(), (certs / "stranger.key").read_bytes(), (certs / "stranger.pem").read_bytes()
    )
    with grpc.secure_channel(server.address, stranger) as channel, pytest.raises(grpc.RpcError) as caught:
        health_of(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with Client(
        server.address, tls_ca=certs / "ca.pem", tls_cert=certs / "client.pem", tls_key=certs / "client.key"
    ) as client:
        assert client.classify(["great fun"])["predictions"][0]["label"] == "positive"


def test_a_reload_path_without_a_leading_slash_names_a_folder_of_the_reload_root(start_server, make_bundle):
    first = make_bundle("v1")
    make_bundle("v2", version="2")
    server = start_server(settings_for(first, reload_root=first.parent, admin_token=ADMIN_TOKEN))
    with Client(server.address, token=ADMIN_TOKEN) as client:
        assert client.reload("v2")["model"]["version"] == "2"


def test_reload_swaps_the_model_without_dropping_requests(start_server, make_bundle):
    first = make_bundle("v1")
    second = make_bundle("v2", version="2", bias=3.0)  # pushes every text towards "negative"
    server = start_server(settings_for(first, reload_root=first.parent, admin_token=ADMIN_TOKEN))
    failures, replies = [], []
    stop = threading.Event()

    def hammer():
        with server.channel() as channel:
            stub = classifier_pb2_grpc.ClassifierStub(channel)
            while not stop.is_set():
                try:
                    replies.append(stub.Classify(pb.ClassifyRequest(texts=["a great movie"]), timeout=10).model_version)
                except grpc.RpcError as err:
                    failures.append(err)

    workers = [threading.Thread(target=hammer) for _ in range(3)]
    for worker in workers:
        worker.start()
    # however long the threads take to start, or the machine stalls; a failed call ends the wait, and the test
    wait_until(lambda: "1" in replies or failures, "no reply of the first model")
    with Client(server.address, token=ADMIN_TOKEN) as client:
        result = client.reload(str(second))
        wait_until(lambda: "2" in replies or failures, "no reply of the second model")
        stop.set()
        for worker in workers:
            worker.join(10)
        assert result["model"]["version"] == "2"
        assert result["previous"]["version"] == "1"
        assert client.model_info()["bundle_path"] == str(second)
        assert client.classify(["a great movie"])["predictions"][0]["label"] == "negative"
    assert not failures, failures[:3]
    assert "1" in replies
    assert "2" in replies
    text = scrape(server)
    assert metric(text, "edgedistill_model_info", version="2") == 1
    assert metric(text, "edgedistill_model_info", version="1") == 0


def test_a_reload_call_is_logged_with_its_trigger_peer_and_request_id(start_server, make_bundle, caplog, monkeypatch):
    server = start_server(settings_for(make_bundle("v1"), admin_token=ADMIN_TOKEN))
    capture_json(caplog, monkeypatch)
    with caplog.at_level(logging.INFO, logger=serve_host.__name__), server.channel() as channel:
        classifier_pb2_grpc.ClassifierStub(channel).Reload(
            pb.ReloadRequest(), metadata=[*ADMIN, ("x-request-id", "swap-1")], timeout=10
        )
    (started,) = [e for e in map(json.loads, caplog.text.splitlines()) if e.get("event") == "reload_started"]
    assert started["trigger"].startswith("a Reload call from ipv4:127.0.0.1:")
    assert started["request_id"] == "swap-1"


RELOAD_ENDED = ("model_active", "reload_failed")  # the events that end a reload's log


@pytest.fixture(scope="module")
def reload_past_its_deadline(tmp_path_factory) -> tuple[grpc.StatusCode, str, list]:
    """A Reload onto version 2, whose warm-up (2.5 s) outlasts the call's 1 s deadline: the call's status code, the
    version served once the server logged the reload's end (at most 10 s on), and the server's log lines."""
    from tests.serve.conftest import RunningServer, write_bundle

    folder = tmp_path_factory.mktemp("reload-past-its-deadline")
    first, second = write_bundle(folder / "v1"), write_bundle(folder / "v2", version="2")
    warm_up = serve_host.ModelRuntime.warm_up

    def slow_warm_up(runtime):
        time.sleep(2.5)  # a deadline of 0.5 s passed before a 0.6 s stall of the server let it see the call
        warm_up(runtime)

    logged = io.StringIO()  # the server's JSON lines, as it writes them
    handler = logging.StreamHandler(logged)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(serve_host.__name__)
    level = logger.level

    def lines() -> list[dict]:
        return [json.loads(line) for line in logged.getvalue().splitlines()]

    server = RunningServer(settings_for(first, admin_token=ADMIN_TOKEN, reload_root=folder))
    try:
        with pytest.MonkeyPatch.context() as patch, server.channel() as channel:
            patch.setattr(serve_host.ModelRuntime, "warm_up", slow_warm_up)
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            stub = classifier_pb2_grpc.ClassifierStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Reload(pb.ReloadRequest(bundle_path=str(second)), metadata=ADMIN, timeout=1.0)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(e.get("event") in RELOAD_ENDED for e in lines()):
                time.sleep(0.05)
            served = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).version
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        server.close()
    return caught.value.code(), served, lines()


def test_a_reload_whose_call_passes_its_deadline_leaves_the_caller_deadline_exceeded(reload_past_its_deadline):
    code, _, _ = reload_past_its_deadline
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_reload_whose_call_passes_its_deadline_goes_on_to_serve_the_new_model(reload_past_its_deadline):
    _, served, _ = reload_past_its_deadline
    assert served == "2"


def test_a_reload_whose_call_passes_its_deadline_logs_the_new_model_active(reload_past_its_deadline):
    _, _, lines = reload_past_its_deadline
    assert [e["served"]["version"] for e in lines if e.get("event") == "model_active"] == ["2"]


def test_a_reload_whose_caller_is_cancelled_still_runs_its_then_once_the_new_model_serves(
    start_server, make_bundle, monkeypatch
):
    server = start_server(settings_for(make_bundle("v1")))
    warm_up = serve_host.ModelRuntime.warm_up
    monkeypatch.setattr(serve_host.ModelRuntime, "warm_up", lambda runtime: time.sleep(1.0) or warm_up(runtime))
    told = threading.Event()  # as a worker tells its supervisor, for the other workers to reload
    caller = asyncio.run_coroutine_threadsafe(server.server.host.reload(then=told.set), server.loop)
    time.sleep(0.3)  # the new model is warming up
    caller.cancel()
    assert told.wait(10)


@pytest.mark.parametrize("kind", ["corrupted", "missing"])
def test_failed_reload_keeps_the_old_model(start_server, make_bundle, kind):
    first = make_bundle("v1")
    server = start_server(settings_for(first, reload_root=first.parent, admin_token=ADMIN_TOKEN))
    bad = corrupt(make_bundle("bad", version="2")) if kind == "corrupted" else server.settings.bundle / "nowhere"
    refusal = server.refused_reload(bad, ADMIN)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "current model keeps serving" in refusal.details
    assert ("sha256" if kind == "corrupted" else "manifest.json is missing") in refusal.details
    assert refusal.serving.version == "1"
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        assert stub.Classify(pb.ClassifyRequest(texts=["good"]), timeout=5).model_version == "1"
        # reloading the served folder again works
        assert stub.Reload(pb.ReloadRequest(), metadata=ADMIN, timeout=10).model.version == "1"


def test_reload_without_an_admin_token_is_refused_and_reloads_nothing(start_server, make_bundle):
    folder = make_bundle()
    server = start_server(settings_for(folder))
    make_bundle(version="2")  # the served folder now holds version 2
    refusal = server.refused_reload(None)
    assert refusal.code == grpc.StatusCode.PERMISSION_DENIED
    assert "EDGEDISTILL_ADMIN_TOKEN" in refusal.details
    assert refusal.serving.version == "1"


def test_a_bundle_that_fails_verification_is_refused_at_start(make_bundle):
    folder = corrupt(make_bundle())

    async def build():
        create_server(settings_for(folder))

    with pytest.raises(BundleRejected, match="does not match its sha256"):
        asyncio.run(build())


def test_a_bundle_that_fails_verification_is_refused_naming_the_command_that_builds_it_again(make_bundle):
    folder = corrupt(make_bundle("bundle-tiny"))

    async def build():
        create_server(settings_for(folder))

    with pytest.raises(BundleRejected, match=r"\(corrupted or edited\); build it again: edgedistill bundles RECIPE"):
        asyncio.run(build())


def swapped_words(tokenizer_json: str, a: str, b: str) -> str:
    """The tokenizer.json text with the token ids of words `a` and `b` exchanged."""
    return tokenizer_json.replace(f'"{a}"', '"\0"').replace(f'"{b}"', f'"{a}"').replace('"\0"', f'"{b}"')


@pytest.mark.parametrize("swapped", ["model.onnx", "tokenizer.json"])
def test_a_file_swapped_after_verification_is_never_served(start_server, make_bundle, monkeypatch, swapped):
    folder = make_bundle()
    negative = make_bundle("negative", bias=5.0)  # the same model leaning hard to "negative"

    def swap():  # between the check of the bundle and the opening of its files
        if swapped == "model.onnx":
            shutil.copyfile(negative / "model.onnx", folder / "model.onnx")
        else:
            tokenizer = folder / "tokenizer.json"
            tokenizer.write_text(swapped_words(tokenizer.read_text(), "great", "awful"))

    class SwappingEncoder(TextEncoder):
        def __init__(self, *args, **kwargs):
            swap()
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(serve_host, "TextEncoder", SwappingEncoder)
    server = start_server(settings_for(folder))
    with server.channel() as channel:
        reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=["great"]), timeout=10)
    assert reply.predictions[0].label == "positive"


def test_the_bundle_sha256_reported_is_of_the_manifest_read_not_of_one_swapped_in_since(
    start_server, make_bundle, monkeypatch
):
    folder = make_bundle()
    loaded = hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    other = make_bundle("other", version="2")
    verified = common_bundle.mf.verified

    def swapping(bundle_folder, manifest, keep=()):  # the manifest changes while the files it lists are read
        shutil.copyfile(other / "manifest.json", folder / "manifest.json")
        return verified(bundle_folder, manifest, keep)

    with monkeypatch.context() as patch:  # `monkeypatch.undo` would undo the hermetic settings too
        patch.setattr(common_bundle.mf, "verified", swapping)
        server = start_server(settings_for(folder))
    with server.channel() as channel:
        info = classifier_pb2_grpc.ClassifierStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.bundle_sha256 == loaded


QUEUE_DELAY_S = 1.5  # long enough that a stall of the machine between a test's calls does not let a batch run
# A call's deadline half-way to the queue delay: its rows are queued before it passes, whatever the server's thread
# was doing when the call came (at 0.1 s, a 0.2 s stall of the server expired the call before it was queued)
DROPPED_DEADLINE_S = QUEUE_DELAY_S / 2


@pytest.fixture(scope="module")
def slow_queue(tmp_path_factory):
    """A server whose rows wait `QUEUE_DELAY_S` for a batch, with room for 4 queued rows."""
    from tests.serve.conftest import RunningServer, write_bundle

    folder = write_bundle(tmp_path_factory.mktemp("slow") / "bundle")
    delay_ms = int(QUEUE_DELAY_S * 1000)
    server = RunningServer(
        settings_for(folder, max_queue_delay_ms=delay_ms, max_batch_size=64, max_queued=4, max_texts=4)
    )
    yield server
    server.close()


def wait_for_queued(server, rows: int, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while server.server.host.current.batcher.queued_rows != rows:
        assert time.monotonic() < deadline, f"the queue never held {rows} rows"
        time.sleep(0.005)


def test_overload_is_resource_exhausted_and_recovers(slow_queue):
    with slow_queue.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        waiting = stub.Classify.future(pb.ClassifyRequest(texts=["good", "bad", "fun"]), timeout=10)
        wait_for_queued(slow_queue, 3)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Classify(pb.ClassifyRequest(texts=["great", "dull"]), timeout=10)
        assert not waiting.done(), "the refusal waited for the queued call's batch"
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit of 4" in caught.value.details()
        assert [p.label for p in waiting.result().predictions] == ["positive", "negative", "positive"]
        assert [
            p.label for p in stub.Classify(pb.ClassifyRequest(texts=["great", "dull"]), timeout=10).predictions
        ] == [
            "positive",
            "negative",
        ]


def test_deadline_shorter_than_the_queue_delay_drops_the_work(slow_queue):
    before = scrape(slow_queue)
    with slow_queue.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Classify(pb.ClassifyRequest(texts=["good", "bad"]), timeout=DROPPED_DEADLINE_S)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        cancelled = stub.Classify.future(pb.ClassifyRequest(texts=["fun"]), timeout=10)
        wait_for_queued(slow_queue, 1)
        cancelled.cancel()
        wait_for_queued(slow_queue, 0)
        time.sleep(QUEUE_DELAY_S + 0.1)  # past the queue delay: a batch would have run by now
    after = scrape(slow_queue)
    dropped = sum(metric(after, "edgedistill_dropped_rows_total", reason=r) for r in ("cancelled", "deadline"))
    dropped -= sum(metric(before, "edgedistill_dropped_rows_total", reason=r) for r in ("cancelled", "deadline"))
    assert dropped == 3
    assert metric(after, "edgedistill_batch_size_count") == metric(before, "edgedistill_batch_size_count")
    calls = {c: metric(after, "edgedistill_requests_total", method="/edgedistill.v1.Classifier/Classify", code=c) - metric(before, "edgedistill_requests_total", method="/edgedistill.v1.Classifier/Classify", code=c) for c in ("DEADLINE_EXCEEDED", "CANCELLED")}  # fmt: skip
    assert calls["DEADLINE_EXCEEDED"] == 1
    assert calls["CANCELLED"] == 1


LATE = "fails-late"  # a model name whose stream request fails once the request after it is queued (`ended_stream`)
CLASSIFY_STREAM = "/edgedistill.v1.Classifier/ClassifyStream"


@pytest.fixture(scope="module", params=["its idle limit", "a failed request"])
def ended_stream(request, tmp_path_factory) -> tuple[str, str]:
    """Prometheus scrapes before and after a stream the server ends while a request of it waits `QUEUE_DELAY_S` in the
    queue: by its idle limit (0.3 s), its client reading no reply (a window of 0) to a full batch sent before, or by
    an earlier request of it that fails (model `LATE`) once that one is queued."""
    from edgedistill.serve.transport import ClassifierServicer

    from tests.serve.conftest import RunningServer, write_bundle

    folder = write_bundle(tmp_path_factory.mktemp("ended") / "bundle")
    by_idle = request.param == "its idle limit"
    settings = settings_for(
        folder, max_queue_delay_ms=int(QUEUE_DELAY_S * 1000), max_batch_size=64, stream_idle_s=0.3 if by_idle else 10.0
    )
    classify = ClassifierServicer._classify

    async def failing_late(self, name, *rest):
        while name == LATE and self.host.current.batcher.queued_rows < 1:
            await asyncio.sleep(0.005)
        return await classify(self, name, *rest)

    # a full batch runs at once, and the write of its reply waits for good
    first = pb.ClassifyRequest(texts=["fun"] * 64) if by_idle else pb.ClassifyRequest(texts=["fun"], model_name=LATE)
    messages = [m.SerializeToString() for m in (first, pb.ClassifyRequest(texts=["fun"]))]
    ended = {"method": CLASSIFY_STREAM, "code": "DEADLINE_EXCEEDED" if by_idle else "NOT_FOUND"}
    server = RunningServer(settings)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ClassifierServicer, "_classify", failing_late)
            before = scrape(server)
            with contextlib.closing(RawClient(server.port)) as client:
                client.read_nothing()
                client.open_call(1, CLASSIFY_STREAM)
                client.send(frame(Kind.DATA, END_STREAM, 1, b"".join(message_prefix(len(m)) + m for m in messages)))
                wait_until(
                    lambda: metric(scrape(server), "edgedistill_requests_total", **ended), "the stream never ended"
                )
            return before, scrape(server)
    finally:
        server.close()


def test_rows_of_a_stream_the_server_ended_are_dropped_as_ended(ended_stream):
    before, after = ended_stream
    ended = (metric(s, "edgedistill_dropped_rows_total", reason="ended") for s in (after, before))
    assert next(ended) - next(ended) == 1


def test_rows_of_a_stream_the_server_ended_are_not_counted_as_cancelled_by_the_client(ended_stream):
    before, after = ended_stream
    cancelled = (metric(s, "edgedistill_dropped_rows_total", reason="cancelled") for s in (after, before))
    assert next(cancelled) - next(cancelled) == 0


def test_a_call_past_its_deadline_is_counted_as_abandoned_not_as_an_error(slow_queue):
    before = scrape(slow_queue)
    with slow_queue.channel() as channel, pytest.raises(grpc.RpcError):
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        stub.Classify(pb.ClassifyRequest(texts=["good"]), timeout=DROPPED_DEADLINE_S)
    deadline = time.monotonic() + 5  # the status reaches the client before the call is recorded
    while (
        metric(after := scrape(slow_queue), "edgedistill_abandoned_calls_total", code="DEADLINE_EXCEEDED")
        == metric(before, "edgedistill_abandoned_calls_total", code="DEADLINE_EXCEEDED")
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    counted = {name: metric(after, name, code="DEADLINE_EXCEEDED") - metric(before, name, code="DEADLINE_EXCEEDED") for name in ("edgedistill_abandoned_calls_total", "edgedistill_errors_total")}  # fmt: skip
    assert counted["edgedistill_abandoned_calls_total"] == 1
    assert counted["edgedistill_errors_total"] == 0


def errors_after(server, call) -> dict[tuple[str, str], float]:
    """The rise of `edgedistill_errors_total` by (code, kind) over `call()`, which must fail."""
    labels = [(code, kind) for code in ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT") for kind in ("client", "server")]
    before = scrape(server)
    with pytest.raises(grpc.RpcError):
        call()
    deadline = time.monotonic() + 5  # the status reaches the client before the call is recorded
    while time.monotonic() < deadline:
        after = scrape(server)
        rise = {(c, k): metric(after, "edgedistill_errors_total", code=c, kind=k) - metric(before, "edgedistill_errors_total", code=c, kind=k) for c, k in labels}  # fmt: skip
        if any(rise.values()):
            return rise
        time.sleep(0.01)
    return rise


def test_a_request_over_the_texts_limit_counts_as_a_client_error(served):
    with served.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        rise = errors_after(served, lambda: stub.Classify(pb.ClassifyRequest(texts=["good"] * 9), timeout=10))
    assert rise[("RESOURCE_EXHAUSTED", "client")] == 1
    assert rise[("RESOURCE_EXHAUSTED", "server")] == 0


def test_a_full_queue_counts_as_a_server_error(slow_queue):
    with slow_queue.channel() as channel:
        infer = kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        waiting = infer.future(text_infer("good", "bad", "fun"), timeout=10)
        wait_for_queued(slow_queue, 3)
        rise = errors_after(slow_queue, lambda: infer(text_infer("great", "dull"), timeout=10))
        waiting.result()
    assert rise[("RESOURCE_EXHAUSTED", "server")] == 1
    assert rise[("RESOURCE_EXHAUSTED", "client")] == 0


def test_overload_is_refused_before_tokenizing(start_server, bundle, slow_tokenizer):
    server = start_server(settings_for(bundle, max_queued=4, max_texts=2))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        admitted = [stub.Classify.future(pb.ClassifyRequest(texts=[GATED, GATED]), timeout=30) for _ in range(2)]
        slow_tokenizer.wait_held(2)  # 4 rows being tokenized, none queued
        codes = []
        for texts in ([GATED], ["good"]):  # a large request (a thread) and a small one (the event loop)
            with pytest.raises(grpc.RpcError) as caught:
                stub.Classify(pb.ClassifyRequest(texts=texts), timeout=5)
            codes.append(caught.value.code())
        held = slow_tokenizer.held
        slow_tokenizer.open.set()
        # the tokenizer stays shut until both refusals are in: one that waited for it would be DEADLINE_EXCEEDED
        assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
        assert held == 2, "a refused request reached the tokenizer"
        assert [len(call.result().predictions) for call in admitted] == [2, 2]


def test_rows_admitted_while_tokenized_in_threads_are_exported(start_server, bundle, slow_tokenizer):
    # they hold queue places as queued rows do: an operator told RESOURCE_EXHAUSTED must see them
    server = start_server(settings_for(bundle))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        calls = [stub.Classify.future(pb.ClassifyRequest(texts=[GATED, GATED]), timeout=30) for _ in range(2)]
        slow_tokenizer.wait_held(2)
        while_tokenized = metric(scrape(server), "edgedistill_admitted_rows")
        slow_tokenizer.open.set()
        for call in calls:
            call.result()
        assert (while_tokenized, metric(scrape(server), "edgedistill_admitted_rows")) == (4, 0)


def test_large_requests_are_tokenized_in_a_bounded_pool(start_server, bundle, slow_tokenizer):
    server = start_server(settings_for(bundle))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        calls = [stub.Classify.future(pb.ClassifyRequest(texts=[GATED]), timeout=30) for _ in range(8)]
        slow_tokenizer.wait_held(TOKENIZE_THREADS)
        time.sleep(0.3)  # time for more threads to start, were the pool unbounded
        most = slow_tokenizer.most
        slow_tokenizer.open.set()
        assert most == TOKENIZE_THREADS
        assert all(call.result().predictions for call in calls)


def text_infer(*texts: str) -> kserve_pb2.ModelInferRequest:
    request = kserve_pb2.ModelInferRequest(model_name="tiny-sentiment")
    request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    request.raw_input_contents.append(tensors.serialize_bytes([t.encode() for t in texts]))
    return request


def test_kserve_overload_is_resource_exhausted_and_recovers(slow_queue):
    with slow_queue.channel() as channel:
        infer = kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        waiting = infer.future(text_infer("good", "bad", "fun"), timeout=10)
        wait_for_queued(slow_queue, 3)
        with pytest.raises(grpc.RpcError) as caught:
            infer(text_infer("great", "dull"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit of 4" in caught.value.details()
        assert list(waiting.result().outputs[0].shape) == [3, 2]
        assert list(infer(text_infer("great", "dull"), timeout=10).outputs[0].shape) == [2, 2]


def test_kserve_deadline_shorter_than_the_queue_delay_drops_the_work(slow_queue):
    before = scrape(slow_queue)
    with slow_queue.channel() as channel:
        infer = kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        with pytest.raises(grpc.RpcError) as caught:
            infer(text_infer("good", "bad"), timeout=DROPPED_DEADLINE_S)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for_queued(slow_queue, 0)
        time.sleep(QUEUE_DELAY_S + 0.1)  # past the queue delay: a batch would have run by now
    after = scrape(slow_queue)
    reasons = ("cancelled", "deadline")  # whichever comes first: the server's deadline or the client's cancel
    dropped = sum(metric(after, "edgedistill_dropped_rows_total", reason=r) for r in reasons)
    assert dropped - sum(metric(before, "edgedistill_dropped_rows_total", reason=r) for r in reasons) == 2
    assert metric(after, "edgedistill_batch_size_count") == metric(before, "edgedistill_batch_size_count")


def test_warm_up_refuses_a_model_whose_outputs_do_not_fit_the_labels(start_server, make_bundle):
    three_labels = make_bundle("mismatch", labels=["negative", "neutral", "positive"])
    server = start_server(settings_for(three_labels), warm=False)
    with pytest.raises(BundleRejected, match=r"warm-up at batch 1, length 1 gave logits of shape \(1, 2\)"):
        server.call(server.server.warm_up())
    with server.channel() as channel:
        assert health_of(channel) == NOT_SERVING
    good = start_server(settings_for(make_bundle("good"), reload_root=three_labels.parent, admin_token=ADMIN_TOKEN))
    refusal = good.refused_reload(three_labels, ADMIN)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "warm-up" in refusal.details


def test_warm_up_calibrates_the_batchers_cost_model(start_server, bundle):
    server = start_server(settings_for(bundle))
    cost = server.server.host.current.batcher.cost  # not get(), which names its model in this thread's log context
    assert cost is not None, "warm-up times the backend at several shapes"


@pytest.mark.parametrize(("host", "warned"), [("127.0.0.1", False), ("0.0.0.0", True)])
def test_a_token_on_a_plaintext_port_beyond_loopback_is_warned_of(start_server, bundle, caplog, host, warned):
    with caplog.at_level(logging.WARNING, logger="serve"):
        start_server(settings_for(bundle, host=host, token="s3cret"))
    assert any(getattr(r, "event", None) == "plaintext_token" for r in caplog.records) is warned


@pytest.fixture
def stream_at_shutdown(start_server, bundle, slow_tokenizer):
    """A ClassifyStream open when the server stops with a grace of 5 s: one request answered before, one held in
    the tokenizer until the drain has begun. Its replies, how it ended, and how long the stop took."""
    server = start_server(settings_for(bundle))
    requests = queue.Queue()
    with server.channel() as channel:
        stream = classifier_pb2_grpc.ClassifierStub(channel).ClassifyStream(iter(requests.get, None), timeout=30)
        requests.put(pb.ClassifyRequest(texts=["good"]))
        replies = [next(stream)]
        requests.put(pb.ClassifyRequest(texts=[GATED]))
        slow_tokenizer.wait_held(1)
        began = time.monotonic()
        stopping = asyncio.run_coroutine_threadsafe(server.server.stop(grace=5), server.loop)
        while not server.server.host.draining:
            time.sleep(0.005)
        slow_tokenizer.open.set()
        with contextlib.suppress(grpc.RpcError):  # the stream's end, read below
            for reply in stream:
                replies.append(reply)
        stopping.result(10)
        requests.put(None)
        return {
            "replies": replies,
            "code": stream.code(),
            "details": stream.details(),
            "stop_s": time.monotonic() - began,
        }


def test_a_stream_gets_the_reply_to_a_request_it_sent_before_the_drain(stream_at_shutdown):
    assert len(stream_at_shutdown["replies"]) == 2


def test_an_open_stream_ends_unavailable_when_the_server_drains(stream_at_shutdown):
    assert stream_at_shutdown["code"] == grpc.StatusCode.UNAVAILABLE


def test_an_open_stream_is_told_to_open_a_new_one_when_the_server_drains(stream_at_shutdown):
    assert "open a new stream" in stream_at_shutdown["details"]


@pytest.mark.serial  # a bound on time
def test_an_open_stream_does_not_hold_the_drain_for_its_grace(stream_at_shutdown):
    assert stream_at_shutdown["stop_s"] < 2.5


@pytest.fixture
def reflection_at_shutdown(start_server, bundle):
    """A reflection stream, one request answered and the stream held open, when the server stops with a grace of
    30 s: its replies, how it ended, and how long the stop took."""
    server = start_server(settings_for(bundle))
    requests = queue.Queue()
    with server.channel() as channel:
        stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter(requests.get, None), timeout=60
        )
        requests.put(reflection_pb2.ServerReflectionRequest(list_services=""))
        replies = [next(stream)]
        began = time.monotonic()
        stopping = asyncio.run_coroutine_threadsafe(server.server.stop(grace=30), server.loop)
        with contextlib.suppress(grpc.RpcError):  # the stream's end, read below
            replies.extend(stream)
        stopping.result(40)
        stop_s = time.monotonic() - began
        requests.put(None)
        return {"replies": replies, "code": stream.code(), "details": stream.details(), "stop_s": stop_s}


@pytest.mark.serial  # a bound on time
def test_an_open_reflection_stream_does_not_hold_the_drain_for_its_grace(reflection_at_shutdown):
    assert reflection_at_shutdown["stop_s"] < 10


def test_an_open_reflection_stream_ends_unavailable_when_the_server_drains(reflection_at_shutdown):
    assert reflection_at_shutdown["code"] == grpc.StatusCode.UNAVAILABLE


def test_an_open_reflection_stream_is_told_to_open_a_new_one_when_the_server_drains(reflection_at_shutdown):
    assert "open a new stream" in reflection_at_shutdown["details"]


def test_an_open_reflection_stream_gets_no_reply_after_the_one_it_was_owed(reflection_at_shutdown):
    assert len(reflection_at_shutdown["replies"]) == 1


def test_a_reflection_stream_opened_during_the_drain_ends_unavailable(start_server, bundle):
    server = start_server(settings_for(bundle))
    server.call(server.server.host.drain(deadline=0))  # the drain begun, its queue empty
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    with server.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([request]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
