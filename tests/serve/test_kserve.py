"""The KServe v2 protocol (inference.GRPCInferenceService): raw and typed contents, token ids, errors, tritonclient."""

import json
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from edgedistill.serve import tensors, transport
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc
from edgedistill.serve.proto.kserve_pb2 import ModelConfigResponse, ModelInferRequest

from tests.serve.conftest import (
    LABELS,
    MAX_LENGTH,
    RunningServer,
    settings_for,
    tiny_tokenizer,
    write_bundle,
    write_cascade,
)

MODEL = "tiny-sentiment"
TEXTS = ["a great movie", "awful boring film", "this film is not very good"]
PROBE = Path(__file__).with_name("triton_probe.py")


@pytest.fixture(scope="module")
def stub(channel):
    return kserve_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def expected(channel) -> dict[str, np.ndarray]:
    """What the Classifier API says for TEXTS."""
    reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(
        classifier_pb2.ClassifyRequest(texts=TEXTS), timeout=10
    )
    return {
        "logits": np.array([p.logits for p in reply.predictions], np.float32),
        "probabilities": np.array([p.probabilities for p in reply.predictions], np.float32),
    }


def token_ids(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded (N, 16) ids and mask, as a client tokenizing on its side would send them."""
    encodings = tiny_tokenizer().encode_batch(texts)
    return np.array([e.ids for e in encodings], np.int64), np.array([e.attention_mask for e in encodings], np.int64)


def text_request(texts, raw: bool = True, shape=None, **fields) -> ModelInferRequest:
    request = ModelInferRequest(**({"model_name": MODEL} | fields))
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=shape or [len(texts)])
    elements = [t if isinstance(t, bytes) else t.encode() for t in texts]
    if raw:
        request.raw_input_contents.append(tensors.serialize_bytes(elements))
    else:
        tensor.contents.bytes_contents.extend(elements)
    return request


def outputs_of(reply) -> dict[str, np.ndarray]:
    raw = list(reply.raw_output_contents)
    return {
        out.name: tensors.decode(out.name, out.datatype, list(out.shape), out.contents, raw[i] if raw else None)
        for i, out in enumerate(reply.outputs)
    }


def code_of(stub, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=10)
    return caught.value.code(), caught.value.details()


def test_raw_text_in_raw_outputs_out(stub, expected):
    reply = stub.ModelInfer(text_request(TEXTS, raw=True, id="req-7"), timeout=10)
    assert reply.model_name == MODEL
    assert reply.model_version == "1"
    assert reply.id == "req-7"
    assert [o.name for o in reply.outputs] == ["logits", "probabilities"]
    assert [o.datatype for o in reply.outputs] == ["FP32", "FP32"]
    assert [list(o.shape) for o in reply.outputs] == [[3, 2], [3, 2]]
    assert len(reply.raw_output_contents) == 2
    assert not reply.outputs[0].HasField("contents")
    got = outputs_of(reply)
    np.testing.assert_allclose(got["logits"], expected["logits"], atol=1e-6)
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], atol=1e-6)


def test_typed_contents_in_typed_contents_out(stub, expected):
    reply = stub.ModelInfer(text_request(TEXTS, raw=False, shape=[3, 1]), timeout=10)
    assert not reply.raw_output_contents
    assert len(reply.outputs[1].contents.fp32_contents) == 6
    np.testing.assert_allclose(outputs_of(reply)["probabilities"], expected["probabilities"], atol=1e-6)


def test_requested_outputs_only(stub, expected):
    request = text_request(TEXTS)
    request.outputs.add(name="probabilities")
    reply = stub.ModelInfer(request, timeout=10)
    assert [o.name for o in reply.outputs] == ["probabilities"]
    np.testing.assert_allclose(outputs_of(reply)["probabilities"], expected["probabilities"], atol=1e-6)


@pytest.mark.parametrize("raw", [True, False])
def test_token_ids_give_the_same_scores_as_text(stub, expected, raw):
    ids, mask = token_ids(TEXTS)
    request = ModelInferRequest(model_name=MODEL)
    for name, value in (("input_ids", ids), ("attention_mask", mask)):
        tensor = request.inputs.add(name=name, datatype="INT64", shape=list(value.shape))
        data = tensors.encode(value, "INT64", tensor.contents, raw)
        if raw:
            request.raw_input_contents.append(data)
    reply = stub.ModelInfer(request, timeout=10)
    np.testing.assert_allclose(outputs_of(reply)["probabilities"], expected["probabilities"], atol=1e-6)


def test_token_ids_without_the_batch_axis_past_the_limit_are_a_wrong_shape(stub):
    ids = np.ones(200, np.int64)  # one text's ids, more than MAX_TEXTS x max_length (128) of them
    code, details = code_of(stub, _ids_request(ids, ids))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "must have shape [batch, sequence], got [200]" in details


def test_texts_in_one_row_past_the_limit_are_a_wrong_shape(stub):
    code, details = code_of(stub, text_request(["good"] * 9, shape=[1, 9]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "must have shape [batch] or [batch, 1], got [1, 9]" in details


def test_health_and_metadata_rpcs(stub):
    assert stub.ServerLive(kserve_pb2.ServerLiveRequest()).live
    assert stub.ServerReady(kserve_pb2.ServerReadyRequest()).ready
    assert stub.ModelReady(kserve_pb2.ModelReadyRequest(name=MODEL)).ready
    assert stub.ModelReady(kserve_pb2.ModelReadyRequest(name=MODEL, version="1")).ready
    assert not stub.ModelReady(kserve_pb2.ModelReadyRequest(name="bert")).ready
    assert stub.ServerMetadata(kserve_pb2.ServerMetadataRequest()).name == "edgedistill"
    meta = stub.ModelMetadata(kserve_pb2.ModelMetadataRequest(name=MODEL))
    assert meta.name == MODEL
    assert list(meta.versions) == ["1"]
    assert meta.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("text", "BYTES", [-1, 1])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("logits", "FP32", [-1, 2]),
        ("probabilities", "FP32", [-1, 2]),
    ]
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelMetadata(kserve_pb2.ModelMetadataRequest(name="bert"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_server_metadata_names_the_extensions(stub):
    reply = stub.ServerMetadata(kserve_pb2.ServerMetadataRequest())
    assert list(reply.extensions) == ["classification", "model_configuration"]


def test_model_config_describes_the_model_as_triton_does(stub):
    config = stub.ModelConfig(kserve_pb2.ModelConfigRequest(name=MODEL, version="1"), timeout=10).config
    assert config.name == MODEL
    assert config.platform == "onnxruntime_onnx"
    assert config.backend == "onnxruntime"
    assert config.max_batch_size == 8  # the server's MAX_TEXTS
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("text", kserve_pb2.ModelConfigResponse.TYPE_STRING, [1])
    ]
    assert [(t.name, t.data_type, list(t.dims), t.label_filename) for t in config.output] == [
        ("logits", kserve_pb2.ModelConfigResponse.TYPE_FP32, [2], "labels.txt"),
        ("probabilities", kserve_pb2.ModelConfigResponse.TYPE_FP32, [2], "labels.txt"),
    ]


def test_model_metadata_gives_the_text_inputs_the_model_configs_dims_with_the_batch_axis(stub):
    meta = stub.ModelMetadata(kserve_pb2.ModelMetadataRequest(name=MODEL), timeout=10)
    config = stub.ModelConfig(kserve_pb2.ModelConfigRequest(name=MODEL), timeout=10).config
    assert [list(t.shape) for t in meta.inputs] == [[-1, *t.dims] for t in config.input]


def test_a_text_input_shaped_as_model_metadata_gives_is_classified(stub, expected):
    meta = stub.ModelMetadata(kserve_pb2.ModelMetadataRequest(name=MODEL), timeout=10)
    shape = [len(TEXTS) if dim == -1 else dim for dim in meta.inputs[0].shape]
    reply = stub.ModelInfer(text_request(TEXTS, shape=shape), timeout=10)
    np.testing.assert_allclose(outputs_of(reply)["probabilities"], expected["probabilities"], atol=1e-6)


# Triton's model-configuration data type of each KServe datatype (Triton's datatypes table: BYTES is TYPE_STRING)
TRITON_TYPES = {
    "FP32": ModelConfigResponse.TYPE_FP32,
    "BYTES": ModelConfigResponse.TYPE_STRING,
    "BOOL": ModelConfigResponse.TYPE_BOOL,
}


@pytest.fixture(scope="module")
def served_cascade(tmp_path_factory):
    """One warm server on a cascade of two tiny bundles, shared by a test module."""
    folder = tmp_path_factory.mktemp("cascade")
    members = {"student": write_bundle(folder / "student"), "teacher": write_bundle(folder / "teacher", bias=0.5)}
    server = RunningServer(settings_for(write_cascade(folder / "bundle-cascade", members, [0.9])))
    yield server
    server.close()


def described_outputs(server) -> tuple[list, list]:
    """The served model's outputs as ModelMetadata and as ModelConfig list them: name, Triton data type and shape
    with the batch axis."""
    with server.channel() as channel:
        kserve = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
        meta = kserve.ModelMetadata(kserve_pb2.ModelMetadataRequest(), timeout=10)
        config = kserve.ModelConfig(kserve_pb2.ModelConfigRequest(), timeout=10).config
    return (
        [(t.name, TRITON_TYPES[t.datatype], list(t.shape)) for t in meta.outputs],
        [(o.name, o.data_type, [-1, *o.dims]) for o in config.output],
    )


@pytest.mark.parametrize("server", ["served", "served_cascade"], ids=["bundle", "cascade"])
def test_model_config_lists_the_outputs_model_metadata_lists(request, server):
    metadata, config = described_outputs(request.getfixturevalue(server))
    assert config == metadata


def test_model_config_lists_a_cascade_output_model_metadata_lists(served_cascade, monkeypatch):
    # an output a cascade gains (`CASCADE_OUTPUTS`) is described by both methods
    monkeypatch.setattr(transport, "CASCADE_OUTPUTS", transport.CASCADE_OUTPUTS | {"member_margin": "FP32"})
    metadata, config = described_outputs(served_cascade)
    assert config == metadata


def test_model_metadata_lists_an_output_a_cascade_gains(served_cascade, monkeypatch):
    monkeypatch.setattr(transport, "CASCADE_OUTPUTS", transport.CASCADE_OUTPUTS | {"member_margin": "FP32"})
    metadata, _ = described_outputs(served_cascade)
    assert "member_margin" in [name for name, *_ in metadata]


def test_model_config_gives_the_label_names(stub):
    config = stub.ModelConfig(kserve_pb2.ModelConfigRequest(name=MODEL), timeout=10).config
    assert json.loads(config.parameters["labels"].string_value) == LABELS


def test_model_config_gives_the_servers_message_limit(stub):
    config = stub.ModelConfig(kserve_pb2.ModelConfigRequest(name=MODEL), timeout=10).config
    assert int(config.parameters["max_message_bytes"].string_value) == 64 * 1024  # `served`'s MAX_MESSAGE_BYTES


def test_model_config_gives_the_token_inputs_a_client_sending_token_ids_sends(stub):
    config = stub.ModelConfig(kserve_pb2.ModelConfigRequest(name=MODEL), timeout=10).config
    assert json.loads(config.parameters["token_inputs"].string_value) == ["input_ids", "attention_mask"]


def test_model_config_gives_the_length_a_client_sending_token_ids_cuts_at(stub):
    config = stub.ModelConfig(kserve_pb2.ModelConfigRequest(name=MODEL), timeout=10).config
    assert int(config.parameters["max_length"].string_value) == MAX_LENGTH


def test_model_config_tells_a_client_sending_token_ids_to_pad_on_the_right(stub):
    config = stub.ModelConfig(kserve_pb2.ModelConfigRequest(name=MODEL), timeout=10).config
    assert config.parameters["padding_side"].string_value == "right"


def test_model_config_of_an_unknown_model_is_not_found(stub):
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelConfig(kserve_pb2.ModelConfigRequest(name="bert"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def classes_request(raw: bool, **counts: int) -> ModelInferRequest:
    """TEXTS, with the outputs named in `counts` requested with that many classes."""
    request = text_request(TEXTS, raw=raw)
    for name, count in counts.items():
        request.outputs.add(name=name).parameters["classification"].int64_param = count
    return request


def expected_classes(values: np.ndarray) -> list[list[str]]:
    """Triton's strings for every class of each row of (N, 2) values, highest first."""
    return [[f"{row[i]:f}:{i}:{LABELS[i]}" for i in np.argsort(-row, kind="stable")] for row in values]


@pytest.mark.parametrize("raw", [True, False])
def test_classification_gives_score_index_label_strings_for_the_top_classes(stub, expected, raw):
    reply = stub.ModelInfer(classes_request(raw, probabilities=2), timeout=10)
    output = reply.outputs[0]
    assert output.name == "probabilities"
    assert output.datatype == "BYTES"
    assert list(output.shape) == [3, 2]
    got = outputs_of(reply)["probabilities"]
    assert [[element.decode() for element in row] for row in got] == expected_classes(expected["probabilities"])


def test_classification_of_the_logits_gives_logit_values(stub, expected):
    got = outputs_of(stub.ModelInfer(classes_request(True, logits=2), timeout=10))["logits"]
    assert [[element.decode() for element in row] for row in got] == expected_classes(expected["logits"])


def test_classification_with_one_class_gives_the_best(stub, expected):
    got = outputs_of(stub.ModelInfer(classes_request(True, probabilities=1), timeout=10))["probabilities"]
    assert [row[0].decode().rsplit(":", 1)[1] for row in got] == [
        LABELS[i] for i in expected["probabilities"].argmax(axis=1)
    ]


def test_classification_beyond_the_labels_gives_every_class_as_triton_does(stub):
    reply = stub.ModelInfer(classes_request(True, probabilities=5), timeout=10)
    assert list(reply.outputs[0].shape) == [3, 2]


def test_classification_applies_only_to_the_output_that_asks(stub, expected):
    request = classes_request(True, probabilities=2)
    request.outputs.add(name="logits")
    got = outputs_of(stub.ModelInfer(request, timeout=10))
    np.testing.assert_allclose(got["logits"], expected["logits"], atol=1e-6)


def _ids_request(ids, mask, **changes) -> ModelInferRequest:
    request = ModelInferRequest(model_name=MODEL)
    for name, value in (("input_ids", ids), ("attention_mask", mask)):
        tensor = request.inputs.add(name=name, datatype="INT64", shape=list(value.shape))
        tensor.contents.int64_contents.extend(value.reshape(-1).tolist())
    for key, value in changes.items():
        setattr(request, key, value)
    return request


def _bad_requests():
    ids, mask = token_ids(TEXTS[:1])
    wrong_type = ModelInferRequest(model_name=MODEL)
    wrong_type.inputs.add(name="text", datatype="INT64", shape=[1]).contents.int64_contents.append(3)
    short = text_request(["good", "bad"], raw=False, shape=[3])
    mixed = text_request(["good"], raw=True)
    mixed.inputs[0].contents.bytes_contents.append(b"good")
    missing_raw = text_request(["good"], raw=True)
    missing_raw.inputs.add(name="text_pair", datatype="BYTES", shape=[1])
    truncated = ModelInferRequest(model_name=MODEL)
    truncated.inputs.add(name="text", datatype="BYTES", shape=[1])
    truncated.raw_input_contents.append(b"\x10\x00\x00\x00good")
    unknown_output = text_request(["good"])
    unknown_output.outputs.add(name="embeddings")
    no_classes = text_request(["good"])
    no_classes.outputs.add(name="probabilities").parameters["classification"].int64_param = 0
    classes_as_text = text_request(["good"])
    classes_as_text.outputs.add(name="probabilities").parameters["classification"].string_param = "2"
    pair = text_request(["good"])
    pair.inputs.add(name="text_pair", datatype="BYTES", shape=[1])
    pair.raw_input_contents.append(tensors.serialize_bytes([b"bad"]))
    both = text_request(["good"], raw=False)
    both.inputs.add(name="input_ids", datatype="INT64", shape=[1, 1]).contents.int64_contents.append(5)
    return [
        ("empty", ModelInferRequest(model_name=MODEL), "INVALID_ARGUMENT", "missing input: send BYTES 'text' [batch], or INT64"),
        ("invalid utf-8", text_request([b"\xff\xfe oops"]), "INVALID_ARGUMENT", "element 0 is not valid UTF-8"),
        ("empty text", text_request(["good", "  "]), "INVALID_ARGUMENT", "text 1 is empty or whitespace only"),
        ("no texts", text_request([], shape=[0]), "INVALID_ARGUMENT", "empty request"),
        ("too many", text_request(["good"] * 9), "RESOURCE_EXHAUSTED", "limit is 8"),
        ("datatype", wrong_type, "INVALID_ARGUMENT", "input 'text' must be BYTES, got 'INT64'"),
        ("shape", short, "INVALID_ARGUMENT", "2 elements for shape [3]"),
        ("shape past the limit", text_request(["good"], raw=False, shape=[100]), "INVALID_ARGUMENT", "1 elements for shape [100]"),
        ("raw shape past the limit", text_request(["good"], shape=[100]), "INVALID_ARGUMENT", "1 elements for shape [100]"),
        ("ids too long, few rows", _ids_request(np.ones((4, 40), np.int64), np.ones((4, 40), np.int64)), "INVALID_ARGUMENT", "exceeds the model's max_length"),
        ("rank", text_request(["good", "bad"], shape=[1, 2]), "INVALID_ARGUMENT", "shape [batch] or [batch, 1]"),
        ("mixed raw and contents", mixed, "INVALID_ARGUMENT", "has contents although"),
        ("raw count", missing_raw, "INVALID_ARGUMENT", "1 raw_input_contents for 2 inputs"),
        ("truncated raw", truncated, "INVALID_ARGUMENT", "claims 16 bytes past the end"),
        ("unknown input", _renamed("image"), "INVALID_ARGUMENT", "unknown input 'image'"),
        ("unknown output", unknown_output, "INVALID_ARGUMENT", "unknown output 'embeddings'"),
        ("no classes", no_classes, "INVALID_ARGUMENT", "'classification' must be at least 1, got 0"),
        ("classes as text", classes_as_text, "INVALID_ARGUMENT", "must be an int64_param"),
        ("pair to a single-text model", pair, "INVALID_ARGUMENT", "takes single texts, not text pairs"),
        ("text and ids", both, "INVALID_ARGUMENT", "not both"),
        ("ids only", _only_ids(ids), "INVALID_ARGUMENT", "must be exactly"),
        ("ids out of vocab", _ids_request(ids + 1000, mask), "INVALID_ARGUMENT", "must lie in [0, 30)"),
        ("too long", _ids_request(np.ones((1, 17), np.int64), np.ones((1, 17), np.int64)), "INVALID_ARGUMENT", "exceeds the model's max_length 16"),
        ("bad mask", _ids_request(ids, mask * 2), "INVALID_ARGUMENT", "only 0 and 1"),
        ("unknown model", text_request(["good"], model_name="bert"), "NOT_FOUND", "unknown model 'bert'"),
        ("unknown version", text_request(["good"], model_version="2"), "NOT_FOUND", "no version '2'"),
    ]  # fmt: skip


def _renamed(name: str) -> ModelInferRequest:
    request = text_request(["good"], raw=False)
    request.inputs[0].name = name
    return request


def _only_ids(ids: np.ndarray) -> ModelInferRequest:
    request = ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="input_ids", datatype="INT64", shape=list(ids.shape)).contents.int64_contents.extend(
        ids.reshape(-1).tolist()
    )
    return request


@pytest.mark.parametrize(("case", "request_", "code", "message"), _bad_requests(), ids=[c[0] for c in _bad_requests()])
def test_bad_infer_requests(stub, case, request_, code, message):
    got_code, details = code_of(stub, request_)
    assert got_code == grpc.StatusCode[code], details
    assert message in details


def test_tritonclient_works_unchanged(served, expected):
    ids, mask = token_ids(TEXTS)
    args = {
        "address": served.address,
        "model": MODEL,
        "texts": TEXTS,
        "input_ids": ids.tolist(),
        "attention_mask": mask.tolist(),
        "class_count": 2,
    }
    result = subprocess.run(
        [sys.executable, str(PROBE), "client", json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["live"]
    assert seen["ready"]
    assert seen["model_ready"]
    assert not seen["unknown_model_ready"]
    assert seen["server_metadata"]["name"] == "edgedistill"
    assert seen["model_metadata"]["name"] == MODEL
    assert seen["model_metadata"]["platform"] == "onnxruntime_onnx"
    assert seen["text"]["id"] == "probe-1"
    assert seen["text"]["model_name"] == MODEL
    np.testing.assert_allclose(seen["text"]["logits"], expected["logits"], atol=1e-6)
    np.testing.assert_allclose(seen["text"]["probabilities"], expected["probabilities"], atol=1e-6)
    np.testing.assert_allclose(seen["tokens"]["probabilities"], expected["probabilities"], atol=1e-6)
    assert seen["unknown_model_error"] == "StatusCode.NOT_FOUND"
    assert seen["invalid_utf8_error"] == "StatusCode.INVALID_ARGUMENT"
    assert seen["model_config"]["config"]["max_batch_size"] == 8
    assert json.loads(seen["model_config"]["config"]["parameters"]["labels"]["string_value"]) == LABELS
    assert seen["classification"] == expected_classes(expected["probabilities"])
