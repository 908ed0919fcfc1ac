"""Pair models and single-text models, through both APIs: each takes what its bundle spec says, and refuses the rest."""

import grpc
import numpy as np
import pytest
from edgedistill.serve import tensors
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc
from edgedistill.serve.proto.kserve_pb2 import ModelInferRequest

from tests.serve.conftest import pair_spec, settings_for, tiny_tokenizer

TEXTS = ["good", "awful", "a great movie"]
PAIRS = ["awful awful", "great fun", "the plot was dull"]


@pytest.fixture(scope="module")
def pair_channel(served_pairs):
    channel = served_pairs.channel()
    yield channel
    channel.close()


@pytest.fixture(scope="module")
def classifier(pair_channel):
    return classifier_pb2_grpc.ClassifierStub(pair_channel)


@pytest.fixture(scope="module")
def kserve(pair_channel):
    return kserve_pb2_grpc.GRPCInferenceServiceStub(pair_channel)


def infer_request(**inputs: list[str]) -> ModelInferRequest:
    """Raw BYTES inputs, e.g. text=[...], text_pair=[...]."""
    request = ModelInferRequest()
    for name, values in inputs.items():
        request.inputs.add(name=name, datatype="BYTES", shape=[len(values)])
        request.raw_input_contents.append(tensors.serialize_bytes([v.encode() for v in values]))
    request.outputs.add(name="probabilities")
    return request


def probabilities_of(reply: kserve_pb2.ModelInferResponse) -> np.ndarray:
    output = reply.outputs[0]
    return tensors.decode(output.name, output.datatype, list(output.shape), raw=reply.raw_output_contents[0])


def refusal(call, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=10)
    return caught.value.code(), caught.value.details()


def test_the_pair_decides_the_label(classifier):
    reply = classifier.Classify(pb.ClassifyRequest(texts=TEXTS, text_pairs=PAIRS), timeout=10)
    assert [p.label for p in reply.predictions] == ["negative", "positive", "negative"]


def test_kserve_pairs_score_as_classify_pairs(classifier, kserve):
    classified = classifier.Classify(pb.ClassifyRequest(texts=TEXTS, text_pairs=PAIRS), timeout=10)
    inferred = probabilities_of(kserve.ModelInfer(infer_request(text=TEXTS, text_pair=PAIRS), timeout=10))
    np.testing.assert_allclose(inferred, [p.probabilities for p in classified.predictions], atol=1e-6)


def test_kserve_token_ids_with_token_type_ids_score_as_pairs(classifier, kserve):
    encodings = tiny_tokenizer().encode_batch(list(zip(TEXTS, PAIRS, strict=True)))
    request = ModelInferRequest()
    for name, field in (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids")):
        value = np.array([getattr(e, field) for e in encodings], np.int64)
        request.inputs.add(name=name, datatype="INT64", shape=list(value.shape))
        request.raw_input_contents.append(tensors.encode(value, "INT64", None, raw=True))
    request.outputs.add(name="probabilities")
    classified = classifier.Classify(pb.ClassifyRequest(texts=TEXTS, text_pairs=PAIRS), timeout=10)
    np.testing.assert_allclose(
        probabilities_of(kserve.ModelInfer(request, timeout=10)),
        [p.probabilities for p in classified.predictions],
        atol=1e-6,
    )


def test_classify_without_pairs_to_a_pair_model_is_invalid_argument(classifier):
    code, details = refusal(classifier.Classify, pb.ClassifyRequest(texts=TEXTS))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'tiny-pairs' takes text pairs" in details


def test_kserve_without_text_pair_to_a_pair_model_is_invalid_argument(kserve):
    code, details = refusal(kserve.ModelInfer, infer_request(text=TEXTS))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'tiny-pairs' takes text pairs" in details


def test_fewer_pairs_than_texts_to_a_pair_model_are_refused_without_advising_to_send_none(classifier):
    _, details = refusal(classifier.Classify, pb.ClassifyRequest(texts=TEXTS, text_pairs=TEXTS[:1]))
    assert details.endswith("send one pair per text (none to a model of single texts)")


def test_classify_stream_without_pairs_to_a_pair_model_ends_with_invalid_argument(classifier):
    with pytest.raises(grpc.RpcError) as caught:
        list(classifier.ClassifyStream(iter([pb.ClassifyRequest(texts=["good"])]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_classify_with_pairs_to_a_single_text_model_is_invalid_argument(channel):
    stub = classifier_pb2_grpc.ClassifierStub(channel)
    code, details = refusal(stub.Classify, pb.ClassifyRequest(texts=TEXTS, text_pairs=PAIRS))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'tiny-sentiment' takes single texts, not text pairs" in details


def test_kserve_with_text_pair_to_a_single_text_model_is_invalid_argument(channel):
    stub = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
    code, details = refusal(stub.ModelInfer, infer_request(text=TEXTS, text_pair=PAIRS))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'tiny-sentiment' takes single texts, not text pairs" in details


def test_a_blank_pair_to_a_pair_model_is_invalid_argument_naming_it(classifier):
    code, details = refusal(classifier.Classify, pb.ClassifyRequest(texts=TEXTS, text_pairs=[*PAIRS[:2], " "]))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "text pair 2 is empty or whitespace only")


def test_a_pair_blank_in_the_characters_the_server_reads_is_refused_naming_the_limit(classifier):
    pairs = [*PAIRS[:2], " " * 5000 + "words"]
    _, details = refusal(classifier.Classify, pb.ClassifyRequest(texts=TEXTS, text_pairs=pairs))
    assert details.startswith("text pair 2 is whitespace only in its first")


def test_model_info_of_a_pair_model_names_both_text_inputs(classifier):
    info = classifier.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert list(info.text_inputs) == ["text", "text_pair"]


def test_model_metadata_of_a_pair_model_lists_text_and_text_pair(kserve):
    meta = kserve.ModelMetadata(kserve_pb2.ModelMetadataRequest(name="tiny-pairs"), timeout=10)
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("text", "BYTES", [-1, 1]),
        ("text_pair", "BYTES", [-1, 1]),
    ]


def test_model_config_of_a_pair_model_lists_text_and_text_pair(kserve):
    config = kserve.ModelConfig(kserve_pb2.ModelConfigRequest(name="tiny-pairs"), timeout=10).config
    assert [(t.name, t.data_type) for t in config.input] == [
        ("text", kserve_pb2.ModelConfigResponse.TYPE_STRING),
        ("text_pair", kserve_pb2.ModelConfigResponse.TYPE_STRING),
    ]


def test_model_config_gives_a_bundle_s_pair_segments_for_clients_that_send_token_ids(make_bundle, start_server):
    server = start_server(settings_for(make_bundle(**pair_spec(pair_segments="sequence_ids"))))
    with server.channel() as channel:
        stub = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
        config = stub.ModelConfig(kserve_pb2.ModelConfigRequest(), timeout=10).config
    assert config.parameters["pair_segments"].string_value == "sequence_ids"


def test_model_config_of_a_pair_model_split_by_token_types_has_no_pair_segments(kserve):
    config = kserve.ModelConfig(kserve_pb2.ModelConfigRequest(name="tiny-pairs"), timeout=10).config
    assert "pair_segments" not in config.parameters


def test_classification_of_a_pair_model_labels_the_pairs(kserve):
    request = infer_request(text=TEXTS, text_pair=PAIRS)
    request.outputs[0].parameters["classification"].int64_param = 1
    got = tensors.decode(
        "probabilities", "BYTES", [3, 1], raw=kserve.ModelInfer(request, timeout=10).raw_output_contents[0]
    )
    assert [row[0].decode().rsplit(":", 1)[1] for row in got] == ["negative", "positive", "negative"]
