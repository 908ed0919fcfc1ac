"""edgedistill.v1.Classifier against a real server: results, streaming, limits, errors, request ids."""

import asyncio
import contextlib
import gc
import re
import urllib.request

import grpc
import numpy as np
import pytest
from edgedistill.common import manifest as mf
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc
from edgedistill.serve.transport import STREAM_WINDOW, ClassifierServicer

from tests.serve.conftest import LABELS, settings_for

TEXTS = ["a great movie", "awful boring film", "the plot was good and fun", "worst acting", "i love it", "dull"]


@pytest.fixture(scope="module")
def stub(served):
    channel = served.channel()
    yield classifier_pb2_grpc.ClassifierStub(channel)
    channel.close()


def probabilities(reply) -> np.ndarray:
    return np.array([p.probabilities for p in reply.predictions])


def test_classify_labels_scores_and_model(stub):
    reply = stub.Classify(pb.ClassifyRequest(texts=TEXTS[:2]), timeout=10)
    assert reply.model_name == "tiny-sentiment"
    assert reply.model_version == "1"
    assert [p.label for p in reply.predictions] == ["positive", "negative"]
    for p in reply.predictions:
        assert len(p.probabilities) == len(LABELS)
        assert sum(p.probabilities) == pytest.approx(1.0, abs=1e-6)
        assert p.score == pytest.approx(max(p.probabilities))
        assert p.label == LABELS[p.label_id]
        logits = np.array(p.logits, np.float64)
        assert np.allclose(np.exp(logits) / np.exp(logits).sum(), p.probabilities, atol=1e-6)


def test_one_request_of_many_texts_equals_one_request_per_text(stub):
    together = probabilities(stub.Classify(pb.ClassifyRequest(texts=TEXTS), timeout=10))
    alone = np.concatenate([probabilities(stub.Classify(pb.ClassifyRequest(texts=[t]), timeout=10)) for t in TEXTS])
    np.testing.assert_allclose(together, alone, atol=1e-6)


def test_stream_answers_each_request_in_order(stub):
    requests = [pb.ClassifyRequest(texts=[t]) for t in TEXTS] + [pb.ClassifyRequest(texts=TEXTS[:3])]
    replies = list(stub.ClassifyStream(iter(requests), timeout=10))
    assert len(replies) == len(requests)
    for request, reply in zip(requests, replies, strict=True):
        expected = stub.Classify(request, timeout=10)
        np.testing.assert_allclose(probabilities(reply), probabilities(expected), atol=1e-6)


def test_stream_with_a_bad_request_ends_with_invalid_argument(stub):
    requests = [pb.ClassifyRequest(texts=["good"]), pb.ClassifyRequest(texts=["   "])]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.ClassifyStream(iter(requests), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "text 0 is empty" in caught.value.details()


class FailedCall:
    """The servicer context of a stream whose call gRPC has already failed (e.g. it refused an oversized
    message and answered the client itself) before the servicer knows: writes fail as gRPC's do."""

    def __init__(self, writes_fail: bool):
        self.writes_fail = writes_fail
        self.code = None
        self.aborted = None

    def time_remaining(self):
        return None

    def done(self):
        return False  # gRPC, not the servicer, ended the call

    async def write(self, reply):
        if self.writes_fail:
            raise grpc.aio.InternalError("the batch of operations failed")

    def set_code(self, code):
        self.code = code

    async def abort(self, code, details=""):
        self.aborted = code
        raise grpc.aio.AbortError(details)


@pytest.mark.parametrize("failure", ["write", "read"])
def test_a_stream_whose_call_grpc_already_failed_ends_cancelled_not_internal(served, failure):
    async def requests():
        yield pb.ClassifyRequest(texts=["good"])
        if failure == "read":
            raise grpc.aio.UsageError("RPC already finished.")

    context = FailedCall(writes_fail=failure == "write")  # else the first reply goes out and the next read fails
    servicer = ClassifierServicer(served.server.host, served.settings)
    served.call(servicer.ClassifyStream(requests(), context))
    assert context.code == grpc.StatusCode.CANCELLED
    assert context.aborted is None


class UnreadStream:
    """The servicer context of a stream whose client reads no reply: the first write waits for good."""

    def time_remaining(self):
        return None

    def done(self):
        return False

    async def write(self, reply):
        await asyncio.Event().wait()


def test_a_stream_ended_while_its_window_is_full_leaves_no_request_unowned(served, caplog):
    """The client reads no reply and sends more requests than the window holds, then goes away: the request read
    while the window was full is cancelled with the rest, not left to fail with no one to see its error."""
    sent_past_window = asyncio.Event()

    async def requests():
        yield pb.ClassifyRequest(texts=["good"])  # its reply's write never ends
        for i in range(STREAM_WINDOW + 4):
            if i == STREAM_WINDOW - 1:  # the request that waits for a place in the full window
                sent_past_window.set()
            yield pb.ClassifyRequest(texts=["good"], model_name="no-such-model")  # refused at once, in its task

    async def client_goes_away():
        servicer = ClassifierServicer(served.server.host, served.settings)
        stream = asyncio.ensure_future(servicer.ClassifyStream(requests(), UnreadStream()))
        await sent_past_window.wait()
        await asyncio.sleep(0.1)
        stream.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stream
        await asyncio.sleep(0.1)

    served.call(client_goes_away())
    gc.collect()
    assert "Task exception was never retrieved" not in caplog.text


class HeldClassifier(ClassifierServicer):
    """A servicer whose requests wait for `release` once started, counting the most in flight at once."""

    def __init__(self, *args):
        super().__init__(*args)
        self.release = asyncio.Event()
        self.running = self.most = 0

    async def _classify(self, *args):
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
            return await super()._classify(*args)
        finally:
            self.running -= 1


def test_a_stream_has_at_most_its_window_of_requests_in_flight(served):
    async def requests():
        for _ in range(STREAM_WINDOW + 8):
            yield pb.ClassifyRequest(texts=["good"])

    async def stream_while_held():
        servicer = HeldClassifier(served.server.host, served.settings)
        stream = asyncio.ensure_future(servicer.ClassifyStream(requests(), FailedCall(writes_fail=False)))
        await asyncio.sleep(0.3)  # the reader fills the window and waits for a place
        servicer.release.set()
        await stream
        return servicer.most

    assert served.call(stream_while_held()) == STREAM_WINDOW


def test_model_info_describes_the_served_bundle(stub, served):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.name == "tiny-sentiment"
    assert info.version == "1"
    assert list(info.labels) == LABELS
    assert list(info.providers) == ["CPUExecutionProvider"]
    assert list(info.inputs) == ["input_ids", "attention_mask"]
    assert list(info.text_inputs) == ["text"]
    assert info.runtime == "onnxruntime"
    assert info.max_length == 16
    assert info.bundle_sha256 == mf.sha256_file(served.settings.bundle / mf.MANIFEST)


def test_model_info_gives_the_servers_request_limits(stub, served):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    expected = (served.settings.max_texts, served.settings.max_message_bytes)
    assert (info.max_texts, info.max_message_bytes) == expected


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (pb.ClassifyRequest(), "INVALID_ARGUMENT", "empty request"),
        (pb.ClassifyRequest(texts=["good", ""]), "INVALID_ARGUMENT", "text 1 is empty"),
        (pb.ClassifyRequest(texts=[" \t\n"]), "INVALID_ARGUMENT", "text 0 is empty or whitespace only"),
        (pb.ClassifyRequest(texts=["good"] * 9), "RESOURCE_EXHAUSTED", "9 texts in one request; the limit is 8"),
        (pb.ClassifyRequest(texts=["a", "b"], text_pairs=["c"]), "INVALID_ARGUMENT", "1 text pairs for 2 texts"),
        (pb.ClassifyRequest(texts=["a"], text_pairs=[" "]), "INVALID_ARGUMENT", "takes single texts, not text pairs"),
        (pb.ClassifyRequest(texts=["good"], model_name="bert"), "NOT_FOUND", "unknown model 'bert'"),
        (pb.ClassifyRequest(texts=["good"], model_version="7"), "NOT_FOUND", "has no version '7'"),
    ],
)
def test_bad_requests(stub, request_, code, message):
    with pytest.raises(grpc.RpcError) as caught:
        stub.Classify(request_, timeout=10)
    assert caught.value.code() == grpc.StatusCode[code]
    assert message in caught.value.details()


def test_unknown_model_in_model_info_is_not_found(stub):
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetModelInfo(pb.GetModelInfoRequest(model_name="bert"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_overlong_text_is_truncated_not_refused(stub):
    reply = stub.Classify(pb.ClassifyRequest(texts=["great " * 5000]), timeout=10)  # 30k chars, limit 200
    assert reply.predictions[0].label == "positive"


def test_message_over_the_size_limit_is_resource_exhausted(stub):
    with pytest.raises(grpc.RpcError) as caught:
        stub.Classify(pb.ClassifyRequest(texts=["x" * 100_000]), timeout=10)  # limit 64 KiB
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_request_id_is_echoed_or_generated_also_on_errors(stub):
    _, call = stub.Classify.with_call(pb.ClassifyRequest(texts=["good"]), metadata=[("x-request-id", "req-42")])
    assert dict(call.trailing_metadata())["x-request-id"] == "req-42"
    _, call = stub.Classify.with_call(pb.ClassifyRequest(texts=["good"]))
    assert re.fullmatch(r"[0-9a-f]{32}", dict(call.trailing_metadata())["x-request-id"])
    with pytest.raises(grpc.RpcError) as caught:
        stub.Classify(pb.ClassifyRequest(), metadata=[("x-request-id", "req-43")])
    assert dict(caught.value.trailing_metadata())["x-request-id"] == "req-43"


def test_calls_without_a_request_id_each_get_a_new_one(stub):
    ids = {dict(stub.Classify.with_call(pb.ClassifyRequest(texts=["good"]))[1].trailing_metadata())["x-request-id"] for _ in range(3)}  # fmt: skip
    assert len(ids) == 3


def test_concurrent_requests_share_batches_with_the_same_results(start_server, bundle):
    server = start_server(settings_for(bundle, max_queue_delay_ms=100, max_batch_size=16))
    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        texts = TEXTS * 2
        futures = [stub.Classify.future(pb.ClassifyRequest(texts=[t]), timeout=10) for t in texts]
        together = np.concatenate([probabilities(f.result()) for f in futures])
        alone = np.concatenate([probabilities(stub.Classify(pb.ClassifyRequest(texts=[t]), timeout=10)) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-6)
    scrape = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    count = float(re.search(r"^edgedistill_batch_size_count (\S+)$", scrape, re.M).group(1))
    rows = float(re.search(r"^edgedistill_batch_size_sum (\S+)$", scrape, re.M).group(1))
    assert rows == 2 * len(texts)
    single_batches = float(re.search(r'^edgedistill_batch_size_bucket\{le="1.0"\} (\S+)$', scrape, re.M).group(1))
    assert single_batches < count, "no batch held more than one row"
