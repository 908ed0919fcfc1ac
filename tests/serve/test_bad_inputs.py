"""Bad inputs through both APIs, one table each: every case gets its status code, then the server is
still SERVING and classifies a known text exactly as before.

Cases already in test_classifier.py and test_kserve.py are not repeated; these are the variants they
leave out (other positions, other encodings, limits by orders of magnitude, auth and TLS, bytes that
are not a protobuf message at all). Lone surrogates cannot be put in a protobuf string (the client
refuses to encode them, see the test below); their wire form, the UTF-8 bytes of a surrogate, is sent
as raw bytes instead.
"""

import re
import threading
import urllib.request
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from edgedistill.serve import tensors
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc
from edgedistill.serve.proto.kserve_pb2 import ModelInferRequest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import wait_until
from tests.serve.conftest import LABELS, VOCAB, RunningServer, settings_for, write_bundle

MODEL = "tiny-sentiment"
TOKEN = "s3cret-token"
MEGABYTE = 1 << 20
KNOWN = ["a great movie", "awful boring film", "the plot was good and fun"]
SERVICES = ("", "edgedistill.v1.Classifier", "inference.GRPCInferenceService")
SURROGATE_UTF8 = b"\xed\xa0\x80"  # what U+D800 would be in UTF-8; invalid UTF-8


@dataclass(frozen=True)
class Case:
    """One bad input. `target` is the server: "plain" (the `served` fixture), "guarded" (TLS, a token,
    2 MiB messages) or "plaintext" (the guarded server through a channel without TLS)."""

    id: str
    request: object  # a request message, a list of them (ClassifyStream), or raw bytes (a list for a stream)
    code: str
    fragment: str = ""  # in the error details; for OK, in the reply's text format
    method: str = ""  # empty: Classify or ModelInfer
    target: str = "plain"
    metadata: tuple = ()


AUTH = (("authorization", f"Bearer {TOKEN}"),)
ADMIN_TOKEN = "adm1n-token"
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)


def classify(*texts: str, pairs=None, **fields) -> pb.ClassifyRequest:
    return pb.ClassifyRequest(texts=texts, text_pairs=pairs or [], **fields)


def infer(*inputs, raw=None, outputs=(), model=MODEL, **fields) -> ModelInferRequest:
    """`inputs` are (name, datatype, shape, values); values fill the datatype's typed contents (None: nothing)."""
    request = ModelInferRequest(model_name=model, **fields)
    for name, datatype, shape, values in inputs:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        if values is not None:
            getattr(tensor.contents, tensors.CONTENTS.get(datatype, "bytes_contents")).extend(values)
    request.raw_input_contents.extend(raw or [])
    for name in outputs:
        request.outputs.add(name=name)
    return request


def raw_text(*elements: bytes, name="text", shape=None, **fields) -> ModelInferRequest:
    """One BYTES input sent as raw_input_contents."""
    shape = [len(elements)] if shape is None else shape
    return infer((name, "BYTES", shape, None), raw=[tensors.serialize_bytes(list(elements))], **fields)


def with_unknown_fields(request: ModelInferRequest, count: int) -> ModelInferRequest:
    """`request` followed by `count` two-byte fields of a number ModelInferRequest does not have (kept unparsed)."""
    padded = ModelInferRequest()
    padded.ParseFromString(request.SerializeToString() + b"\x78\x01" * count)  # field 15, varint 1
    return padded


def with_parameters(request: ModelInferRequest, count: int, output: str = "") -> ModelInferRequest:
    """`request` with `count` boolean parameters on its first input, or on the output `output` added."""
    tensor = request.outputs.add(name=output) if output else request.inputs[0]
    for i in range(count):
        tensor.parameters[f"{i:x}"].bool_param = True
    return request


def in_shared_memory(request: ModelInferRequest, output: str = "") -> ModelInferRequest:
    """`request` with its first input, or the output `output` added, in a shared-memory region, as tritonclient's
    `set_shared_memory` names one."""
    tensor = request.outputs.add(name=output) if output else request.inputs[0]
    tensor.parameters["shared_memory_region"].string_param = "region-0"
    tensor.parameters["shared_memory_byte_size"].int64_param = 64
    return request


def ids(*rows, name="input_ids") -> tuple:
    return (name, "INT64", [len(rows), len(rows[0]) if rows else 0], [v for row in rows for v in row])


CLS, SEP, GOOD = (VOCAB.index(word) for word in ("[CLS]", "[SEP]", "good"))


def misplaced_ids() -> ModelInferRequest:
    """INT64 token ids in `int_contents`, INT32's field, as a client filling the wrong typed field sends them."""
    request = infer(("input_ids", "INT64", [1, 3], None), ids([1, 1, 1], name="attention_mask"))
    request.inputs[0].contents.int_contents.extend([CLS, GOOD, SEP])
    return request


CLASSIFIER_CASES = [
    Case("empty request naming the model", classify(model_name=MODEL), "INVALID_ARGUMENT", "empty request"),
    Case("pairs without texts", classify(pairs=["good"]), "INVALID_ARGUMENT", "empty request"),
    Case("empty text last of eight", classify(*["good"] * 7, ""), "INVALID_ARGUMENT", "text 7 is empty"),
    Case("unicode whitespace only", classify("\u00a0\u2003\u3000\t\r\n\v\f"), "INVALID_ARGUMENT", "text 0 is empty or whitespace only"),
    Case("empty pair second, to a single-text model", classify("a", "b", pairs=["c", ""]), "INVALID_ARGUMENT", "takes single texts, not text pairs"),
    Case("words only after 200 characters of spaces", classify(" " * 200 + "great"), "INVALID_ARGUMENT", "text 0 is whitespace only in its first 200 characters (MAX_TEXT_CHARS)"),
    Case("pair's words only after 200 characters of spaces, to a single-text model", classify("good", pairs=["\t" * 250 + "bad"]), "INVALID_ARGUMENT", "takes single texts, not text pairs"),
    Case("10,000 texts", classify(*["good"] * 10_000), "RESOURCE_EXHAUSTED", "10000 texts in one request; the limit is 8"),
    Case("10,000 pairs for one text", classify("good", pairs=["bad"] * 10_000), "INVALID_ARGUMENT", "10000 text pairs for 1 texts"),
    Case("1 MB text over the 64 KiB limit", classify("great " * (MEGABYTE // 6)), "RESOURCE_EXHAUSTED", "larger than max"),
    Case("1 MB pair over the 64 KiB limit", classify("good", pairs=["x" * MEGABYTE]), "RESOURCE_EXHAUSTED", "larger than max"),
    Case("1 MB text within a 2 MiB limit is truncated", classify("great " * (MEGABYTE // 6)), "OK", 'label: "positive"', target="guarded", metadata=AUTH),
    Case("NUL around a word", classify("\x00great\x00"), "OK", 'label: "positive"'),
    Case("control characters only", classify("\x00\x01\x07\x1b\x7f"), "OK", "predictions"),
    Case("zero-width characters only", classify("\u200b\u200c\u200d\u2060"), "OK", "predictions"),
    Case("RTL override and marks", classify("\u202egreat\u202c \u200f"), "OK", 'label: "positive"'),
    Case("emoji and ZWJ sequences", classify("great \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f3ac"), "OK", 'label: "positive"'),
    Case("combining characters", classify("good " + "e\u0301\u0302\u0303" * 50), "OK", 'label: "positive"'),
    Case("BOM, private use, last code point", classify("\ufeff\ue000\U0010ffff good \ufffd"), "OK", 'label: "positive"'),
    Case("surrogate bytes on the wire", b"\x0a\x03" + SURROGATE_UTF8, "INVALID_ARGUMENT"),
    Case("not a protobuf message", b"\xff\xff\xff\xff", "INVALID_ARGUMENT"),
    Case("unknown model, 60 KB name", classify("good", model_name="\u00e9" * 30_000), "NOT_FOUND", "unknown model"),
    Case("model name in another case", classify("good", model_name="Tiny-Sentiment"), "NOT_FOUND", "unknown model 'Tiny-Sentiment'"),
    Case("unknown version of the served model", classify("good", model_name=MODEL, model_version="1.0"), "NOT_FOUND", "has no version '1.0'"),
    Case("model info, unknown version", pb.GetModelInfoRequest(model_version="2"), "NOT_FOUND", "has no version '2'", method="GetModelInfo"),
    Case("stream of no requests", [], "OK", method="ClassifyStream"),
    Case("stream, empty third request", [classify("good"), classify("bad"), classify()], "INVALID_ARGUMENT", "empty request", method="ClassifyStream"),
    Case("stream, 10,000 texts", [classify(*["a"] * 10_000)], "RESOURCE_EXHAUSTED", "10000 texts", method="ClassifyStream"),
    Case("stream, unknown model", [classify("good", model_name="bert")], "NOT_FOUND", "unknown model 'bert'", method="ClassifyStream"),
    Case("stream, a request refused by its checks named by its place", [classify("good"), classify("bad"), classify()], "INVALID_ARGUMENT", "stream request 2: empty request", method="ClassifyStream"),
    Case("stream, a request refused by the model named by its place", [classify("good"), classify("good", model_name="bert")], "NOT_FOUND", "stream request 1: unknown model", method="ClassifyStream"),
    Case("stream, surrogate bytes on the wire", [classify("good").SerializeToString(), b"\x0a\x03" + SURROGATE_UTF8], "INVALID_ARGUMENT"),
    Case("stream, 1 MB message", [classify("good"), classify("x" * MEGABYTE)], "RESOURCE_EXHAUSTED", method="ClassifyStream"),
    Case("reload naming a path without an admin token", pb.ReloadRequest(bundle_path="/etc"), "PERMISSION_DENIED", "EDGEDISTILL_ADMIN_TOKEN", method="Reload"),
    Case("reload without a path or an admin token", pb.ReloadRequest(), "PERMISSION_DENIED", "Reload is off", method="Reload"),
    Case("reload, NUL in the path", pb.ReloadRequest(bundle_path="/tmp/\x00bundle"), "INVALID_ARGUMENT", "not a usable path", method="Reload", target="guarded", metadata=ADMIN),
    Case("reload, path too long for the OS", pb.ReloadRequest(bundle_path="/" + "x" * 5000), "PERMISSION_DENIED", "must lie inside", method="Reload", target="guarded", metadata=ADMIN),
    Case("reload, a name in the root too long for the OS", pb.ReloadRequest(bundle_path="x" * 5000), "FAILED_PRECONDITION", "reload of ", method="Reload", target="guarded", metadata=ADMIN),
    Case("reload, a device file", pb.ReloadRequest(bundle_path="/dev/null"), "PERMISSION_DENIED", "must lie inside", method="Reload", target="guarded", metadata=ADMIN),
    Case("reload, outside the reload root", pb.ReloadRequest(bundle_path="/etc"), "PERMISSION_DENIED", "must lie inside", method="Reload", target="guarded", metadata=ADMIN),
    Case("reload, escaping the root with ..", pb.ReloadRequest(bundle_path="../../../../etc"), "PERMISSION_DENIED", "must lie inside", method="Reload", target="guarded", metadata=ADMIN),
    Case("reload with the classify token", pb.ReloadRequest(), "UNAUTHENTICATED", "needs 'authorization: Bearer <ADMIN_TOKEN>'", method="Reload", target="guarded", metadata=AUTH),
    Case("classify with the admin token", classify("good"), "UNAUTHENTICATED", "bearer token", target="guarded", metadata=ADMIN),
    Case("request id over 16 KiB", classify("good"), "RESOURCE_EXHAUSTED", "metadata", metadata=(("x-request-id", "r" * 20_000),)),
    Case("no token", classify("good"), "UNAUTHENTICATED", "bearer token", target="guarded"),
    Case("the token under another scheme", classify("good"), "UNAUTHENTICATED", "bearer token", target="guarded", metadata=(("authorization", f"Basic {TOKEN}"),)),
    Case("token prefix only", classify("good"), "UNAUTHENTICATED", "bearer token", target="guarded", metadata=(("authorization", f"Bearer {TOKEN[:-1]}"),)),
    Case("token with trailing space", classify("good"), "UNAUTHENTICATED", "bearer token", target="guarded", metadata=(("authorization", f"Bearer {TOKEN} "),)),
    Case("reload without a token", pb.ReloadRequest(), "UNAUTHENTICATED", "missing or invalid admin token", method="Reload", target="guarded"),
    Case("model info without a token", pb.GetModelInfoRequest(), "UNAUTHENTICATED", "bearer token", method="GetModelInfo", target="guarded"),
    Case("plaintext client to the TLS port", classify("good"), "UNAVAILABLE", target="plaintext", metadata=AUTH),
]  # fmt: skip

KSERVE_CASES = [
    Case("only outputs requested", infer(outputs=["probabilities"]), "INVALID_ARGUMENT", "missing input"),
    Case("typed text of shape [0, 1]", infer(("text", "BYTES", [0, 1], [])), "INVALID_ARGUMENT", "empty request"),
    Case("whitespace third element", raw_text(b"good", b"bad", b"\t \n"), "INVALID_ARGUMENT", "text 2 is empty"),
    Case("whitespace pair, to a single-text model", infer(("text", "BYTES", [1], [b"good"]), ("text_pair", "BYTES", [1], [b" "])), "INVALID_ARGUMENT", "takes single texts, not text pairs"),
    Case("surrogate bytes in raw BYTES", raw_text(b"good", SURROGATE_UTF8), "INVALID_ARGUMENT", "element 1 is not valid UTF-8"),
    Case("overlong UTF-8 in typed BYTES", infer(("text", "BYTES", [1], [b"\xc0\xaf"])), "INVALID_ARGUMENT", "element 0 is not valid UTF-8"),
    Case("truncated UTF-8 in text_pair", infer(("text", "BYTES", [1], [b"good"]), ("text_pair", "BYTES", [1], ["é".encode()[:1]])), "INVALID_ARGUMENT", "input 'text_pair' element 0 is not valid UTF-8"),
    Case("NUL, emoji and RTL marks in BYTES", raw_text("\x00great \U0001f3ac \u202e".encode()), "OK", "outputs"),
    Case("text as FP32", infer(("text", "FP32", [1], [1.0])), "INVALID_ARGUMENT", "input 'text' must be BYTES, got 'FP32'"),
    Case("unknown datatype", infer(("text", "STRING", [1], [b"good"])), "INVALID_ARGUMENT", "must be BYTES, got 'STRING'"),
    Case("empty datatype", infer(("text", "", [1], [b"good"])), "INVALID_ARGUMENT", "must be BYTES, got ''"),
    Case("token ids as INT32", infer(("input_ids", "INT32", [1, 3], [CLS, GOOD, SEP])), "INVALID_ARGUMENT", "must be INT64, got 'INT32'"),
    Case("negative dimension", infer(("text", "BYTES", [-1], [b"good"])), "INVALID_ARGUMENT", "negative dimension"),
    Case("shape overflowing int64", infer(("input_ids", "INT64", [2**60, 16], [CLS])), "INVALID_ARGUMENT", "elements for shape [1152921504606846976, 16] (18446744073709551616 expected)"),
    Case("empty tensor with a huge dimension", infer(("input_ids", "INT64", [2**63 - 1, 0], [])), "INVALID_ARGUMENT", "is not supported"),
    Case("70 dimensions", infer(("text", "BYTES", [1] * 70, [b"good"])), "INVALID_ARGUMENT", "shape [batch] or [batch, 1]"),
    Case("scalar text", infer(("text", "BYTES", [], [b"good"])), "INVALID_ARGUMENT", "shape [batch] or [batch, 1], got []"),
    Case("text of rank 3", infer(("text", "BYTES", [1, 1, 1], [b"good"])), "INVALID_ARGUMENT", "shape [batch] or [batch, 1]"),
    Case("attention_mask alone", infer(ids([1, 1, 1], name="attention_mask")), "INVALID_ARGUMENT", "missing input"),
    Case("extra token_type_ids", infer(ids([CLS, GOOD, SEP]), ids([1, 1, 1], name="attention_mask"), ids([0, 0, 0], name="token_type_ids")), "INVALID_ARGUMENT", "must be exactly ['attention_mask', 'input_ids']"),
    Case("text twice", infer(("text", "BYTES", [1], [b"good"]), ("text", "BYTES", [1], [b"bad"])), "INVALID_ARGUMENT", "input 'text' appears twice"),
    Case("text and attention_mask", infer(("text", "BYTES", [1], [b"good"]), ids([1], name="attention_mask")), "INVALID_ARGUMENT", "not both"),
    Case("ids and mask of different lengths", infer(ids([CLS, GOOD, SEP, 0]), ids([1, 1, 1], name="attention_mask")), "INVALID_ARGUMENT", "same [batch, sequence] shape"),
    Case("all-zero attention mask", infer(ids([CLS, GOOD, SEP]), ids([0, 0, 0], name="attention_mask")), "INVALID_ARGUMENT", "row 0: attention_mask is all zeros"),
    Case("left-padded attention mask", infer(ids([0, CLS, GOOD, SEP]), ids([0, 1, 1, 1], name="attention_mask")), "INVALID_ARGUMENT", "row 0: attention_mask has a 1 after a 0 (position 1)"),
    Case("attention mask with a gap", infer(ids([CLS, GOOD, SEP, 0], [CLS, GOOD, 0, SEP]), ids([1, 1, 1, 0], [1, 1, 0, 1], name="attention_mask")), "INVALID_ARGUMENT", "row 1: attention_mask has a 1 after a 0 (position 3)"),
    Case("negative token id", infer(ids([CLS, -5, SEP]), ids([1, 1, 1], name="attention_mask")), "INVALID_ARGUMENT", "must lie in [0, 30)"),
    Case("INT64 token ids in int_contents", misplaced_ids(), "INVALID_ARGUMENT", "3 expected in contents.int64_contents, the field of INT64"),
    Case("raw INT64 of the wrong size", infer(("input_ids", "INT64", [1, 3], None), ("attention_mask", "INT64", [1, 3], None), raw=[b"\x00" * 20, b"\x00" * 24]), "INVALID_ARGUMENT", "20 raw bytes for shape [1, 3] of INT64 (expected 24)"),
    Case("more raw contents than inputs", infer(("text", "BYTES", [1], None), raw=[tensors.serialize_bytes([b"good"])] * 2), "INVALID_ARGUMENT", "2 raw_input_contents for 1 inputs"),
    Case("raw BYTES ends in a length prefix", infer(("text", "BYTES", [2], None), raw=[tensors.serialize_bytes([b"good"]) + b"\x01\x00"]), "INVALID_ARGUMENT", "ends inside an element's 4-byte length prefix"),
    Case("raw BYTES with big-endian lengths", infer(("text", "BYTES", [1], None), raw=[b"\x00\x00\x00\x04good"]), "INVALID_ARGUMENT", "its length as a 4-byte little-endian unsigned integer"),
    Case("raw BYTES without lengths", infer(("text", "BYTES", [1], None), raw=[b"a great movie"]), "INVALID_ARGUMENT", "its length as a 4-byte little-endian unsigned integer"),
    Case("raw BYTES of fewer elements than the shape", raw_text(b"good", b"bad", shape=[3]), "INVALID_ARGUMENT", "2 elements for shape [3]"),
    Case("10,000 texts", raw_text(*[b"a"] * 10_000), "RESOURCE_EXHAUSTED", "holds 10000 elements; the limit is 8"),
    Case("10,000 rows of token ids", infer(ids(*[[GOOD]] * 10_000), ids(*[[1]] * 10_000, name="attention_mask")), "RESOURCE_EXHAUSTED", "holds 10000 elements; the limit is 128"),
    Case("raw BYTES claiming a billion elements", raw_text(b"good", shape=[10**9]), "INVALID_ARGUMENT", "1 elements for shape [1000000000] (1000000000 expected)"),
    Case("300,000 typed BYTES elements", infer(("text", "BYTES", [300_000], [b""] * 300_000)), "INVALID_ARGUMENT", "contents hold more than 32 elements in all (4 x the server's MAX_TEXTS, 8)", target="guarded", metadata=AUTH),
    Case("20 typed BYTES elements", infer(("text", "BYTES", [20], [b"good"] * 20)), "RESOURCE_EXHAUSTED", "holds 20 elements; the limit is 8"),
    Case("20 typed BYTES elements for shape [2**62]", infer(("text", "BYTES", [2**62], [b"good"] * 20)), "INVALID_ARGUMENT", "20 elements for shape [4611686018427387904]"),
    Case("raw BYTES of 20 elements for shape [2**62]", raw_text(*[b"good"] * 20, shape=[2**62]), "INVALID_ARGUMENT", "more than 8 elements for shape [4611686018427387904]"),
    Case("20 typed BYTES elements for shape [1]", infer(("text", "BYTES", [1], [b"good"] * 20)), "INVALID_ARGUMENT", "20 elements for shape [1]"),
    Case("300,000 raw BYTES elements for shape [2]", raw_text(*[b""] * 300_000, shape=[2]), "INVALID_ARGUMENT", "more than the 2 elements of its shape", target="guarded", metadata=AUTH),
    Case("200,000 token ids for shape [1, 1]", infer(("input_ids", "INT64", [1, 1], [GOOD] * 200_000), ids([1], name="attention_mask")), "INVALID_ARGUMENT", "200000 elements for shape [1, 1]", target="guarded", metadata=AUTH),
    Case("token ids of a 2**40 sequence", infer(("input_ids", "INT64", [1, 2**40], None), ids([1], name="attention_mask")), "INVALID_ARGUMENT", "sequence length 1099511627776 exceeds the model's max_length"),
    Case("logits twice", raw_text(b"good", outputs=["logits", "logits"]), "INVALID_ARGUMENT", "output 'logits' is requested twice"),
    Case("150,000 duplicate outputs", raw_text(b"good", outputs=["logits"] * 150_000), "INVALID_ARGUMENT", "holds more than 16 outputs", target="guarded", metadata=AUTH),
    Case("500,000 unknown fields", with_unknown_fields(raw_text(b"good"), 500_000), "INVALID_ARGUMENT", "holds more than 256 fields", target="guarded", metadata=AUTH),
    Case("200 unknown fields are kept unparsed", with_unknown_fields(raw_text(b"good"), 200), "OK", "outputs"),
    Case("17 outputs", raw_text(b"good", outputs=["logits", "probabilities"] * 8 + ["logits"]), "INVALID_ARGUMENT", "holds more than 16 outputs: name each input and output once"),
    Case("17 inputs", infer(*[("text", "BYTES", [1], [b"good"])] * 17), "INVALID_ARGUMENT", "holds more than 16 inputs"),
    Case("17 raw_input_contents", infer(("text", "BYTES", [1], None), raw=[tensors.serialize_bytes([b"good"])] * 17), "INVALID_ARGUMENT", "holds more than 16 raw_input_contents"),
    Case("84,000 parameters on an input", with_parameters(raw_text(b"good"), 84_000), "INVALID_ARGUMENT", "inputs[0].parameters holds more than 16 entries", target="guarded", metadata=AUTH),
    Case("84,000 parameters on an output", with_parameters(raw_text(b"good"), 84_000, output="logits"), "INVALID_ARGUMENT", "outputs[0].parameters holds more than 16 entries", target="guarded", metadata=AUTH),
    Case("100 request parameters", raw_text(b"good", parameters={f"p{i}": kserve_pb2.InferParameter(bool_param=True) for i in range(100)}), "INVALID_ARGUMENT", "holds more than 64 parameters"),
    Case("input in shared memory", in_shared_memory(infer(("text", "BYTES", [1], None))), "INVALID_ARGUMENT", "input 'text' is in shared memory"),
    Case("output to shared memory", in_shared_memory(raw_text(b"good"), output="probabilities"), "INVALID_ARGUMENT", "output 'probabilities' is in shared memory"),
    Case("unknown output after the known ones", raw_text(b"good", outputs=["logits", "probabilities", "embeddings"]), "INVALID_ARGUMENT", "unknown output 'embeddings'"),
    Case("1 MB raw text over the 64 KiB limit", raw_text(b"great " * (MEGABYTE // 6)), "RESOURCE_EXHAUSTED", "larger than max"),
    Case("1 MB text within a 2 MiB limit is truncated", raw_text(b"great " * (MEGABYTE // 6)), "OK", "outputs", target="guarded", metadata=AUTH),
    Case("unknown model with broken tensors", infer(("text", "FP32", [-1], None), model="bert"), "NOT_FOUND", "unknown model 'bert'"),
    Case("unknown version", raw_text(b"good", model_version="01"), "NOT_FOUND", "has no version '01'"),
    Case("unknown input, 60 KB name", infer(("\u00e9" * 30_000, "BYTES", [1], [b"good"])), "INVALID_ARGUMENT", "unknown input"),
    Case("empty model name is the served model", raw_text(b"good", model=""), "OK", f'model_name: "{MODEL}"'),
    Case("metadata, unknown version", kserve_pb2.ModelMetadataRequest(name=MODEL, version="3"), "NOT_FOUND", "has no version '3'", method="ModelMetadata"),
    Case("surrogate bytes in model_name on the wire", b"\x0a\x03" + SURROGATE_UTF8, "INVALID_ARGUMENT", method="ModelInfer"),
    Case("infer without a token", raw_text(b"good"), "UNAUTHENTICATED", "bearer token", method="ModelInfer", target="guarded"),
    Case("infer with the wrong token", raw_text(b"good"), "UNAUTHENTICATED", "bearer token", method="ModelInfer", target="guarded", metadata=(("authorization", "Bearer nope"),)),
    Case("server metadata without a token", kserve_pb2.ServerMetadataRequest(), "UNAUTHENTICATED", "bearer token", method="ServerMetadata", target="guarded"),
    Case("plaintext client to the TLS port", raw_text(b"good"), "UNAVAILABLE", method="ModelInfer", target="plaintext", metadata=AUTH),
]  # fmt: skip

STUBS = {
    "Classifier": classifier_pb2_grpc.ClassifierStub,
    "GRPCInferenceService": kserve_pb2_grpc.GRPCInferenceServiceStub,
}
DEFAULT_METHODS = {"Classifier": "Classify", "GRPCInferenceService": "ModelInfer"}
SERVICE_NAMES = {"Classifier": "edgedistill.v1.Classifier", "GRPCInferenceService": "inference.GRPCInferenceService"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, certs):
    """TLS, a bearer token, an admin token with a reload root, and 2 MiB messages (the same 8 texts of 200
    characters as `served`)."""
    folder = write_bundle(tmp_path_factory.mktemp("guarded") / "bundle-tiny")
    settings = settings_for(
        folder,
        max_texts=8,
        max_text_chars=200,
        max_message_bytes=2 * MEGABYTE,
        token=TOKEN,
        admin_token=ADMIN_TOKEN,
        reload_root=folder.parent,
        tls_cert=certs / "server.pem",
        tls_key=certs / "server.key",
    )
    server = RunningServer(settings)
    yield server
    server.close()


@pytest.fixture(scope="module")
def channels(served, guarded, certs):
    credentials = grpc.ssl_channel_credentials(root_certificates=(certs / "ca.pem").read_bytes())
    options = [("grpc.max_send_message_length", 4 * MEGABYTE)]
    opened = {
        "plain": grpc.insecure_channel(served.address, options=options),
        "guarded": grpc.secure_channel(guarded.address, credentials, options=options),
        "plaintext": grpc.insecure_channel(guarded.address),
    }
    yield opened
    for channel in opened.values():
        channel.close()


def known_scores(channel, metadata=()) -> dict[str, np.ndarray]:
    """KNOWN through both APIs: Classifier probabilities and KServe probabilities."""
    reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(classify(*KNOWN), metadata=metadata, timeout=10)
    request = raw_text(*(t.encode() for t in KNOWN), outputs=["probabilities"])
    infer_reply = kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=metadata, timeout=10)
    out = infer_reply.outputs[0]
    kserve = tensors.decode(out.name, out.datatype, list(out.shape), None, infer_reply.raw_output_contents[0])
    return {"classifier": np.array([p.probabilities for p in reply.predictions]), "kserve": kserve}


@pytest.fixture(scope="module")
def before(channels) -> dict[str, dict[str, np.ndarray]]:
    """The scores of KNOWN on both servers before any bad input is sent."""
    return {"plain": known_scores(channels["plain"]), "guarded": known_scores(channels["guarded"], AUTH)}


def send(channels, service: str, case: Case) -> str:
    """Send `case`; the reply's text format, or grpc.RpcError."""
    channel = channels[case.target]
    method = "ClassifyStream" if isinstance(case.request, list) else case.method or DEFAULT_METHODS[service]
    path = f"/{SERVICE_NAMES[service]}/{method}"
    if isinstance(case.request, bytes):  # no serializer: the bytes go as they are
        return repr(channel.unary_unary(path)(case.request, metadata=case.metadata, timeout=10))
    if isinstance(case.request, list) and case.request and isinstance(case.request[0], bytes):
        return repr(list(channel.stream_stream(path)(iter(case.request), metadata=case.metadata, timeout=10)))
    call = getattr(STUBS[service](channel), method)
    if method == "ClassifyStream":
        return "\n".join(str(r) for r in call(iter(case.request), metadata=case.metadata, timeout=10))
    return str(call(case.request, metadata=case.metadata, timeout=10))


def check(channels, service: str, case: Case) -> None:
    try:
        reply = send(channels, service, case)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode[case.code], f"{err.code()}: {err.details()}"
        assert case.fragment in err.details()
        return
    assert case.code == "OK", f"expected {case.code}, got OK"
    assert case.fragment in reply


@pytest.mark.parametrize("case", CLASSIFIER_CASES, ids=[c.id for c in CLASSIFIER_CASES])
def test_bad_classifier_requests(channels, before, case):
    check(channels, "Classifier", case)


@pytest.mark.parametrize("case", KSERVE_CASES, ids=[c.id for c in KSERVE_CASES])
def test_bad_kserve_requests(channels, before, case):
    check(channels, "GRPCInferenceService", case)


def test_lone_surrogates_cannot_be_sent_in_protobuf_strings():
    """Protobuf strings are UTF-8, so the client refuses a lone surrogate before anything is sent."""
    with pytest.raises(UnicodeEncodeError, match="surrogates not allowed"):
        classify("good \ud800").SerializeToString()


def test_error_details_are_capped_so_the_status_arrives(channels):
    with pytest.raises(grpc.RpcError) as caught:
        classifier_pb2_grpc.ClassifierStub(channels["plain"]).Classify(classify("good", model_name="m" * 50_000))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    details = caught.value.details()
    assert details.startswith("unknown model 'mmm")
    assert "(message truncated)" in details
    assert details.endswith("this server serves 'tiny-sentiment'")
    assert len(details.encode()) < 1100


def test_reload_cannot_name_even_the_served_bundle_without_a_reload_root(start_server, bundle):
    refusal = start_server(settings_for(bundle, admin_token=ADMIN_TOKEN)).refused_reload(bundle, ADMIN)
    assert refusal.code == grpc.StatusCode.PERMISSION_DENIED
    assert "EDGEDISTILL_RELOAD_ROOT" in refusal.details


@pytest.fixture
def reload_without_an_admin_token(start_server, bundle) -> grpc.RpcError:
    """The refusal of a Reload call on a server with a token and no admin token."""
    server = start_server(settings_for(bundle, token=TOKEN))
    with server.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        classifier_pb2_grpc.ClassifierStub(channel).Reload(pb.ReloadRequest(), timeout=30)
    return caught.value


def test_reload_on_a_server_with_a_token_and_no_admin_token_is_permission_denied(reload_without_an_admin_token):
    assert reload_without_an_admin_token.code() == grpc.StatusCode.PERMISSION_DENIED


def test_reload_on_a_server_with_a_token_and_no_admin_token_is_refused_naming_the_admin_token(
    reload_without_an_admin_token,
):
    assert "EDGEDISTILL_ADMIN_TOKEN" in reload_without_an_admin_token.details()


def held_streams(channel, count: int) -> tuple[list, threading.Event]:
    """`count` ClassifyStream calls that each got one reply and then hold their call open, as a slow client
    would; set the event to let them finish."""
    release = threading.Event()

    def requests():
        yield classify("good")
        release.wait(30)

    calls = [classifier_pb2_grpc.ClassifierStub(channel).ClassifyStream(requests(), timeout=30) for _ in range(count)]
    for call in calls:
        next(call)  # the call is in progress on the server
    return calls, release


def test_calls_over_the_concurrent_rpc_limit_are_resource_exhausted(start_server, bundle):
    server = start_server(settings_for(bundle, max_concurrent_rpcs=4))
    with server.channel() as channel:
        calls, release = held_streams(channel, 4)
        try:
            with pytest.raises(grpc.RpcError) as caught:
                classifier_pb2_grpc.ClassifierStub(channel).Classify(classify("good"), timeout=5)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            release.set()
        for call in calls:
            list(call)
        assert classifier_pb2_grpc.ClassifierStub(channel).Classify(classify("good"), timeout=5).predictions


def test_a_flood_of_held_streams_is_refused_beyond_the_limit_and_the_server_recovers(start_server, bundle):
    server = start_server(settings_for(bundle, max_concurrent_rpcs=16, max_concurrent_streams=1000))
    release = threading.Event()
    codes = []

    def requests():
        yield classify("good")
        release.wait(30)

    with server.channel() as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        calls = [stub.ClassifyStream(requests(), timeout=30) for _ in range(200)]
        refused = 200 - 16  # every call the server did not admit has ended; the admitted ones are held
        wait_until(lambda: sum(call.done() for call in calls) >= refused, f"fewer than {refused} calls ended")
        release.set()
        for call in calls:
            try:
                list(call)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                codes.append(err.code())
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= refused
        assert stub.Classify(classify("good"), timeout=5).predictions


def test_streams_over_the_connections_limit_wait_in_the_client(start_server, bundle):
    server = start_server(settings_for(bundle, max_concurrent_streams=2))
    with server.channel() as channel:
        calls, release = held_streams(channel, 2)
        try:
            with pytest.raises(grpc.RpcError) as caught:
                classifier_pb2_grpc.ClassifierStub(channel).Classify(classify("good"), timeout=1)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # another connection has its own streams (a local subchannel pool: not the first channel's connection)
            with grpc.insecure_channel(server.address, options=[("grpc.use_local_subchannel_pool", 1)]) as other:
                assert classifier_pb2_grpc.ClassifierStub(other).Classify(classify("good"), timeout=5).predictions
        finally:
            release.set()
        for call in calls:
            list(call)


def test_the_metrics_port_binds_to_loopback_even_when_grpc_listens_everywhere(start_server, bundle):
    server = start_server(settings_for(bundle, host="0.0.0.0"))
    assert [http.server_address[0] for http in server.server.metrics._http.servers] == ["127.0.0.1"]


def requests_by_code(server: RunningServer) -> dict[str, dict[str, float]]:
    """{code: {method: calls}} from the server's metrics."""
    scrape = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    counts: dict[str, dict[str, float]] = {}
    for labels, value in re.findall(r"^edgedistill_requests_total\{([^}]*)\} (\S+)$", scrape, re.M):
        label = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        counts.setdefault(label["code"], {})[label["method"]] = float(value)
    return counts


def test_still_serving_and_correct_after_the_bad_inputs(channels, before, served, guarded):
    for target, metadata in (("plain", ()), ("guarded", AUTH)):
        health = health_pb2_grpc.HealthStub(channels[target])
        for service in SERVICES:
            status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING, (target, service)
        after = known_scores(channels[target], metadata)
        for api in ("classifier", "kserve"):
            np.testing.assert_allclose(after[api], before[target][api], atol=1e-6)
        assert [LABELS[i] for i in after["classifier"].argmax(-1)] == ["positive", "negative", "positive"]
    for server in (served, guarded):
        counts = requests_by_code(server)
        assert sum(counts.get("OK", {}).values()) > 0
        assert not counts.get("INTERNAL"), counts
        assert not counts.get("UNKNOWN"), counts
