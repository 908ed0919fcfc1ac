"""Property-based fuzzing of what surrounds the tensors, against a real server: KServe parameters of every type on the
request, its inputs and its outputs (Triton's `classification` among them), requested outputs, model names and
versions in every RPC that takes them, and call metadata (bearer tokens, request ids, other headers, deadlines).

Every call ends OK or with a client error that names the problem; an OK reply is what ModelMetadata describes; the
server stays SERVING and scores a known text as before.
"""

import time

import grpc
import numpy as np
import pytest
from edgedistill.serve import tensors
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.serve.conftest import LABELS, RunningServer, settings_for, write_bundle
from tests.serve.rawh2 import END_STREAM, Kind, RawClient, frame, message_prefix
from tests.serve.test_fuzz import FUZZ, KNOWN, MODEL, assert_healthy, known, mostly, names, sentences, versions

__all__ = ["known"]  # the fixture, used by the tests below

TOKEN = "s3cret-token"
CLIENT_ERRORS = {"INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAUTHENTICATED", "DEADLINE_EXCEEDED"}
PARAMETER_VALUES = {
    "bool_param": st.booleans(),
    "int64_param": st.integers(-(2**63), 2**63 - 1),
    "string_param": st.text(max_size=20),
    "double_param": st.floats(),
    "uint64_param": st.integers(0, 2**64 - 1),
}
PARAMETER_NAMES = mostly(st.sampled_from(["classification", "binary_data", "priority", "timeout"]), st.text(max_size=8))


@st.composite
def parameter_maps(draw, max_size: int = 4) -> dict[str, kserve_pb2.InferParameter]:
    """Parameters of any name, each of any type with any value (`classification` mostly a small int64)."""
    parameters = {}
    for name in draw(st.lists(PARAMETER_NAMES, max_size=max_size, unique=True)):
        small_count = st.just("int64_param").flatmap(lambda f: st.tuples(st.just(f), st.integers(-1, 4)))
        anything = st.sampled_from(sorted(PARAMETER_VALUES)).flatmap(
            lambda f: st.tuples(st.just(f), PARAMETER_VALUES[f])
        )
        field, value = draw(mostly(small_count, anything) if name == "classification" else anything)
        parameters[name] = kserve_pb2.InferParameter(**{field: value})
    return parameters


def metadata_of(channel) -> kserve_pb2.ModelMetadataResponse:
    return kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(kserve_pb2.ModelMetadataRequest(), timeout=5)


@st.composite
def parameterized_requests(draw) -> kserve_pb2.ModelInferRequest:
    """A well-formed text request with parameters everywhere, requested outputs of any name, and any id."""
    texts = draw(st.lists(sentences.filter(str.strip), min_size=1, max_size=8))
    request = kserve_pb2.ModelInferRequest(model_name=MODEL, id=draw(st.text(max_size=40)))
    for name, value in draw(parameter_maps()).items():
        request.parameters[name].CopyFrom(value)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    for name, value in draw(parameter_maps(max_size=2)).items():
        tensor.parameters[name].CopyFrom(value)
    elements = [t.encode() for t in texts]
    if draw(st.booleans()):
        request.raw_input_contents.append(tensors.serialize_bytes(elements))
    else:
        tensor.contents.bytes_contents.extend(elements)
    output_names = mostly(st.sampled_from(["logits", "probabilities"]), st.text(max_size=8))
    for name in draw(st.lists(output_names, max_size=3)):
        output = request.outputs.add(name=name)
        for key, value in draw(parameter_maps(max_size=2)).items():
            output.parameters[key].CopyFrom(value)
    return request


def call(method, request, **kwargs):
    """(status code name, reply or None); any code but OK and the client errors fails the test."""
    try:
        return "OK", method(request, timeout=kwargs.pop("timeout", 10), **kwargs)
    except grpc.RpcError as err:
        assert err.code().name in CLIENT_ERRORS, f"{err.code().name}: {err.details()}"
        assert err.details()
        return err.code().name, None


def check_outputs(request: kserve_pb2.ModelInferRequest, reply: kserve_pb2.ModelInferResponse, described) -> None:
    """Each output as ModelMetadata describes it (or, with `classification`, BYTES "value:index:label" of at most as
    many classes as labels), in the requested order, raw when the request was."""
    requested = [out.name for out in request.outputs] or [out.name for out in described.outputs]
    assert [out.name for out in reply.outputs] == requested
    raw = list(reply.raw_output_contents)
    datatypes = {out.name: out.datatype for out in described.outputs}
    rows = request.inputs[0].shape[0]
    counts = {
        o.name: o.parameters["classification"].int64_param for o in request.outputs if "classification" in o.parameters
    }
    for i, out in enumerate(reply.outputs):
        value = tensors.decode(out.name, out.datatype, list(out.shape), out.contents, raw[i] if raw else None)
        if out.name in counts:
            assert out.datatype == "BYTES"
            assert value.shape == (rows, min(counts[out.name], len(LABELS)))
            for entry in value.reshape(-1):
                score, index, label = entry.decode().split(":")
                assert LABELS[int(index)] == label
                assert 0 <= float(score) <= 1 or out.name == "logits"
        else:
            assert out.datatype == datatypes[out.name]
            assert value.shape == (rows, len(LABELS))
            assert np.isfinite(value).all()
    assert reply.id == request.id


@FUZZ
@given(request=parameterized_requests())
def test_model_infer_fuzz_parameters_and_outputs(channel, known, request):
    """Parameters the server does not use are ignored; misused `classification` and unknown outputs are refused."""
    code, reply = call(kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer, request)
    if code == "OK":
        check_outputs(request, reply, metadata_of(channel))
    assert_healthy(channel, known)


@FUZZ
@given(name=names, version=versions)
def test_model_lookups_fuzz_names_and_versions(channel, known, name, version):
    """Every RPC that names a model finds the served one by "" or its name, at "" or its version, else NOT_FOUND
    (ModelReady: not ready)."""
    served = name in ("", MODEL) and version in ("", "1")
    kserve = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
    lookups = [
        (kserve.ModelMetadata, kserve_pb2.ModelMetadataRequest(name=name, version=version)),
        (kserve.ModelConfig, kserve_pb2.ModelConfigRequest(name=name, version=version)),
        (classifier_pb2_grpc.ClassifierStub(channel).GetModelInfo, pb.GetModelInfoRequest(model_name=name, model_version=version)),
    ]  # fmt: skip
    for method, request in lookups:
        code, _ = call(method, request)
        assert code == ("OK" if served else "NOT_FOUND")
    ready = kserve.ModelReady(kserve_pb2.ModelReadyRequest(name=name, version=version), timeout=5).ready
    assert ready == served
    assert_healthy(channel, known)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A server that wants a bearer token (the `served` fixture's limits)."""
    folder = write_bundle(tmp_path_factory.mktemp("guarded") / "bundle-tiny")
    server = RunningServer(settings_for(folder, max_texts=8, max_text_chars=200, token=TOKEN))
    yield server
    server.close()


HEADER_VALUES = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)
HEADER_KEYS = st.text("abcxyz0189-_.", min_size=1, max_size=12).filter(lambda k: not k.startswith(("grpc-", ":")))
AUTHORIZATIONS = mostly(st.just(f"Bearer {TOKEN}"), st.sampled_from(["", "Bearer", f"bearer {TOKEN}", TOKEN]) | HEADER_VALUES, tenths=5)  # fmt: skip


@st.composite
def call_metadata(draw) -> tuple[tuple[str, str | bytes], ...]:
    """Any authorization (mostly the token), a request id, other text and binary headers."""
    headers = [("authorization", draw(AUTHORIZATIONS))] if draw(st.booleans()) else []
    if draw(st.booleans()):
        headers.append(("x-request-id", draw(HEADER_VALUES)))
    for key in draw(st.lists(HEADER_KEYS, max_size=3)):
        headers.append(
            (f"{key}-bin", draw(st.binary(max_size=40))) if draw(st.booleans()) else (key, draw(HEADER_VALUES))
        )
    return tuple(headers)


@FUZZ
@given(headers=call_metadata(), timeout=mostly(st.just(10.0), st.floats(1e-4, 0.05)), stream=st.booleans())
def test_calls_fuzz_metadata_and_deadlines(guarded, headers, timeout, stream):
    """Only the exact token, under the bearer scheme in any case, is let in; other headers are ignored; a short
    deadline may pass, nothing else fails."""
    with guarded.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        request = pb.ClassifyRequest(texts=KNOWN)
        method = (lambda r, **kw: list(stub.ClassifyStream(iter([r]), **kw))) if stream else stub.Classify
        code, _ = call(method, request, metadata=headers, timeout=timeout)
        scheme, _, credentials = dict(headers).get("authorization", "").partition(" ")
        authorized = scheme.lower() == "bearer" and credentials == TOKEN  # the scheme in any case, as in HTTP
        assert code in ({"OK", "DEADLINE_EXCEEDED"} if authorized else {"UNAUTHENTICATED", "DEADLINE_EXCEEDED"})
        if timeout == 10.0:
            assert code == ("OK" if authorized else "UNAUTHENTICATED")
        assert stub.Classify(request, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10).predictions


def stream_end(client: RawClient, stream: int, timeout: float = 5) -> list[int]:
    """The kinds of the frames the server sent on `stream`, once it ended it (END_STREAM, or RST_STREAM)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sent = [(kind, flags) for kind, flags, on, _ in list(client.frames) if on == stream]
        if any(kind == Kind.RST_STREAM or (kind == Kind.HEADERS and flags & END_STREAM) for kind, flags in sent):
            return [kind for kind, _ in sent]
        time.sleep(0.005)
    raise AssertionError(f"stream {stream} did not end within {timeout} s")


@settings(FUZZ, max_examples=30)
@given(request_id=st.text(st.characters(min_codepoint=0, max_codepoint=0xFF), min_size=1, max_size=40))
@example(request_id="a\tb")
@example(request_id="caf\u00e9")
def test_any_request_id_a_client_sends_gets_the_reply(served, request_id):
    """Request ids that gRPC libraries would not send (a tab, UTF-8) reach the server from bare HTTP/2 clients; the
    reply still comes (under a new request id)."""
    body = pb.ClassifyRequest(texts=KNOWN).SerializeToString()
    client = RawClient(served.port)
    try:
        client.open_call(1, "/edgedistill.v1.Classifier/Classify", (("x-request-id", request_id),))
        client.send(frame(Kind.DATA, END_STREAM, 1, message_prefix(len(body)) + body))
        assert Kind.DATA in stream_end(client, 1)
    finally:
        client.close()
