"""Property-based fuzzing of both APIs against a real server: any request gets OK or a client error
(never UNKNOWN or INTERNAL), a well-formed one gets OK with one prediction per text, and after every
example the server is still SERVING and scores a known text as before.

`ClassifyStream` gets streams of such requests with a random `x-request-id`.
Texts are arbitrary Unicode without surrogates, which protobuf strings cannot carry (see
test_bad_inputs.py). KServe tensors get random names, datatypes, shapes (including products that
overflow int64 and more dimensions than numpy allows) and contents, typed or raw.
"""

import grpc
import numpy as np
import pytest
from edgedistill.serve import tensors
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc, kserve_pb2_grpc
from edgedistill.serve.proto.kserve_pb2 import ModelInferRequest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serve.conftest import LABELS, MAX_LENGTH, VOCAB

MODEL = "tiny-sentiment"
MAX_TEXTS = 8  # the `served` fixture's limit
CLIENT_ERRORS = {"INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"}
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
KNOWN = ["a great movie", "awful boring film"]
INPUTS = {"text": "BYTES", "text_pair": "BYTES", "input_ids": "INT64", "attention_mask": "INT64"}


def mostly(valid, other, tenths: int = 8):
    """`valid` in `tenths` of ten examples, else `other`: most requests get past the first check."""
    return st.sampled_from([True] * tenths + [False] * (10 - tenths)).flatmap(lambda hit: valid if hit else other)


names = mostly(st.sampled_from(["", MODEL]), st.sampled_from(["bert", f"{MODEL} "]) | st.text(max_size=12))
versions = mostly(st.sampled_from(["", "1"]), st.sampled_from(["2", "01"]) | st.text(max_size=4))
words = st.sampled_from(VOCAB + ["GOOD", "awful!", "\x00", "\u200b", "\U0001f3ac", "e\u0301", "\u202e"])
sentences = mostly(st.lists(words, min_size=1, max_size=20).map(" ".join), st.text(max_size=300), tenths=7)


@pytest.fixture(scope="module")
def known(channel) -> np.ndarray:
    reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=KNOWN), timeout=10)
    return np.array([p.probabilities for p in reply.predictions])


def assert_healthy(channel, known: np.ndarray) -> None:
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=KNOWN), timeout=10)
    np.testing.assert_allclose([p.probabilities for p in reply.predictions], known, atol=1e-6)


def outcome(call, request):
    """(status code name, reply or None); any code but OK and the client errors fails the test."""
    try:
        return "OK", call(request, timeout=10)
    except grpc.RpcError as err:
        assert err.code().name in CLIENT_ERRORS, f"{err.code().name}: {err.details()}"
        return err.code().name, None


@st.composite
def classify_requests(draw) -> pb.ClassifyRequest:
    texts = draw(mostly(st.lists(sentences, min_size=1, max_size=MAX_TEXTS), st.lists(sentences, max_size=12)))
    same_count = st.lists(sentences, min_size=len(texts), max_size=len(texts))
    pairs = draw(mostly(st.just([]) | same_count, st.lists(sentences, max_size=10)))
    return pb.ClassifyRequest(texts=texts, text_pairs=pairs, model_name=draw(names), model_version=draw(versions))


def well_formed(request: pb.ClassifyRequest) -> bool:
    texts, pairs = list(request.texts), list(request.text_pairs)
    return (
        1 <= len(texts) <= MAX_TEXTS
        and not pairs  # the tiny model takes single texts
        and all(t.strip() for t in texts)
        and request.model_name in ("", MODEL)
        and request.model_version in ("", "1")
    )


@FUZZ
@given(request=classify_requests())
def test_classify_fuzz(channel, known, request):
    code, reply = outcome(classifier_pb2_grpc.ClassifierStub(channel).Classify, request)
    if well_formed(request):
        assert code == "OK"
    if code == "OK":
        assert len(reply.predictions) == len(request.texts)
        for p in reply.predictions:
            assert p.label == LABELS[p.label_id]
            assert abs(sum(p.probabilities) - 1) < 1e-5
    assert_healthy(channel, known)


request_ids = st.text(alphabet="abcXYZ0189-_.:", max_size=300)


@FUZZ
@given(requests=st.lists(classify_requests(), max_size=4), request_id=request_ids)
def test_classify_stream_fuzz(channel, known, requests, request_id):
    """A stream answers every request in order, or ends with a client error; the request id comes back."""
    metadata = (("x-request-id", request_id),) if request_id else None
    stream = classifier_pb2_grpc.ClassifierStub(channel).ClassifyStream(iter(requests), timeout=10, metadata=metadata)
    replies, code = [], "OK"
    try:
        replies.extend(stream)
    except grpc.RpcError as err:
        code = err.code().name
        assert code in CLIENT_ERRORS, f"{code}: {err.details()}"
    if all(well_formed(r) for r in requests):
        assert code == "OK"
        assert len(replies) == len(requests)
    for request, reply in zip(requests, replies, strict=False):
        assert len(reply.predictions) == len(request.texts)
    returned = dict(stream.trailing_metadata() or ())["x-request-id"]
    assert returned == request_id[:128] if request_id else len(returned) == 32
    assert_healthy(channel, known)


DATATYPES = st.sampled_from([*tensors.CONTENTS, "", "STRING", "fp32"])
EDGE_DIMENSIONS = st.sampled_from([-1, 0, 1, 2**31, 2**32, 2**62, 2**63 - 1])  # products overflow int64
SHAPES = mostly(
    st.lists(st.integers(-1, 10), max_size=3),
    st.lists(EDGE_DIMENSIONS, min_size=1, max_size=4) | st.lists(st.just(1), min_size=9, max_size=70),
    tenths=5,
)
TYPED_VALUES = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=40) | sentences.map(str.encode),
}


@st.composite
def random_tensors(draw) -> ModelInferRequest:
    """Anything: random names, datatypes and shapes, typed contents in any field, or random raw bytes."""
    request = ModelInferRequest(model_name=draw(names), model_version=draw(versions))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        name = draw(mostly(st.sampled_from([*INPUTS, "token_type_ids"]), st.text(max_size=6)))
        datatype = draw(mostly(st.just(INPUTS.get(name, "INT64")), DATATYPES))
        tensor = request.inputs.add(name=name, datatype=datatype, shape=draw(SHAPES))
        if raw:
            request.raw_input_contents.append(draw(st.binary(max_size=120)))
        else:
            field = draw(st.sampled_from(sorted(TYPED_VALUES)))
            getattr(tensor.contents, field).extend(draw(st.lists(TYPED_VALUES[field], max_size=12)))
    if raw and draw(st.booleans()):
        request.raw_input_contents.append(draw(st.binary(max_size=20)))  # one more than there are inputs
    return request


@st.composite
def text_tensors(draw) -> tuple[ModelInferRequest, bool]:
    """Text requests, mostly well formed: BYTES `text` (and maybe `text_pair`, refused) of shape [n] or [n, 1],
    typed or raw; with whether the request is well formed."""
    request = ModelInferRequest(model_name=draw(st.sampled_from(["", MODEL])))
    count = draw(mostly(st.integers(1, MAX_TEXTS), st.integers(0, 12)))
    raw, column = draw(st.booleans()), draw(st.booleans())
    paired = draw(st.booleans())
    valid = 1 <= count <= MAX_TEXTS and not paired  # the tiny model takes single texts
    for name in ["text"] + (["text_pair"] if paired else []):
        texts = draw(st.lists(sentences, min_size=count, max_size=count))
        elements = draw(
            mostly(
                st.just([t.encode() for t in texts]), st.lists(st.binary(max_size=8), min_size=count, max_size=count)
            )
        )
        valid = valid and elements == [t.encode() for t in texts] and all(t.strip() for t in texts)
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[count, 1] if column else [count])
        if raw:
            request.raw_input_contents.append(tensors.serialize_bytes(elements))
        else:
            tensor.contents.bytes_contents.extend(elements)
    for name in draw(st.lists(st.sampled_from(["logits", "probabilities"]), max_size=2, unique=True)):
        request.outputs.add(name=name)
    return request, valid


@st.composite
def id_tensors(draw) -> tuple[ModelInferRequest, bool]:
    """Token-id requests, mostly well formed: ids in or just outside the vocabulary, masks of 0/1 (or 2),
    odd shapes, a missing or an extra input; with whether the request is well formed."""
    fitting = st.tuples(st.integers(1, MAX_TEXTS), st.integers(1, MAX_LENGTH))
    rows, length = draw(mostly(fitting, st.tuples(st.integers(0, 10), st.integers(0, MAX_LENGTH + 2))))
    size = rows * length
    in_vocabulary = st.lists(st.integers(0, len(VOCAB) - 1), min_size=size, max_size=size)
    ids = draw(mostly(in_vocabulary, st.lists(st.integers(-1, len(VOCAB)), min_size=size, max_size=size)))
    mask = draw(mostly(st.just([1] * size), st.lists(st.sampled_from([0, 1, 2]), min_size=size, max_size=size)))
    inputs = [("input_ids", ids), ("attention_mask", mask)]
    extra = [*inputs, ("token_type_ids", [0] * size)]
    chosen = draw(mostly(st.just(inputs), st.sampled_from([inputs[:1], extra])))
    valid = (
        chosen == inputs
        and 1 <= rows <= MAX_TEXTS
        and 1 <= length <= MAX_LENGTH
        and all(0 <= i < len(VOCAB) for i in ids)
        and mask == [1] * size
    )
    raw = draw(st.booleans())
    request = ModelInferRequest(model_name=MODEL)
    for name, values in chosen:
        tensor = request.inputs.add(name=name, datatype="INT64", shape=[rows, length])
        data = tensors.encode(np.array(values, np.int64), "INT64", tensor.contents, raw)
        if raw:
            request.raw_input_contents.append(data)
    return request, valid


def check_infer(channel, known, request: ModelInferRequest, valid: bool = False) -> None:
    code, reply = outcome(kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer, request)
    if valid:
        assert code == "OK"
    if code == "OK":
        raw = list(reply.raw_output_contents)
        assert bool(raw) == bool(request.raw_input_contents)
        for i, out in enumerate(reply.outputs):
            value = tensors.decode(out.name, out.datatype, list(out.shape), out.contents, raw[i] if raw else None)
            assert value.shape[1] == len(LABELS)
            assert np.isfinite(value).all()
    assert_healthy(channel, known)


@FUZZ
@given(request=random_tensors())
def test_model_infer_fuzz_random_tensors(channel, known, request):
    check_infer(channel, known, request)


@FUZZ
@given(case=text_tensors() | id_tensors())
def test_model_infer_fuzz_texts_and_token_ids(channel, known, case):
    check_infer(channel, known, *case)
