"""A bundle's text style on a real server: each text written as the model's training text was, in both APIs."""

import grpc
import pytest
from edgedistill.serve.client import Client
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc

from tests.serve.conftest import pair_spec, settings_for

SENT = "GREAT<br />film!"  # as a client writes it: cased, with markup and punctuation against a word
TRAINED = "great film !"  # as a ptb_lower task's training text writes it


@pytest.fixture
def client_of(make_bundle, start_server):
    def start(style: str) -> Client:
        server = start_server(settings_for(make_bundle(f"bundle-{style}", text_style=style)))
        return Client(server.address, timeout=10)

    return start


@pytest.mark.parametrize("api", ["classify", "kserve_infer"])
def test_a_ptb_lower_bundle_reads_a_text_as_its_training_text_is_written(client_of, api):
    with client_of("ptb_lower") as client:
        sent, trained = getattr(client, api)([SENT, TRAINED])["predictions"]
    assert sent["probabilities"] == trained["probabilities"]


@pytest.mark.parametrize("api", ["classify", "kserve_infer"])
def test_a_raw_bundle_reads_a_text_as_sent(client_of, api):
    with client_of("raw") as client:
        sent, trained = getattr(client, api)([SENT, TRAINED])["predictions"]
    assert sent["probabilities"] != trained["probabilities"]


def test_model_info_gives_the_bundles_text_style(make_bundle, start_server):
    server = start_server(settings_for(make_bundle(text_style="ptb_lower")))
    with server.channel() as channel:
        info = classifier_pb2_grpc.ClassifierStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.text_style == "ptb_lower"


def test_model_config_gives_the_bundles_text_style(make_bundle, start_server):
    server = start_server(settings_for(make_bundle(text_style="ptb_lower")))
    with server.channel() as channel:
        config = kserve_pb2_grpc.GRPCInferenceServiceStub(channel).ModelConfig(
            kserve_pb2.ModelConfigRequest(), timeout=10
        )
    assert config.config.parameters["text_style"].string_value == "ptb_lower"


def test_a_text_of_markup_alone_is_refused_naming_the_text_style(client_of):
    with (
        client_of("ptb_lower") as client,
        pytest.raises(grpc.RpcError, match="HTML markup, which the text style removes") as refused,
    ):
        client.classify(["<br />"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
def cut_to_200(make_bundle, start_server):
    """A client of a `ptb_lower` bundle served with MAX_TEXT_CHARS=200."""
    server = start_server(settings_for(make_bundle(text_style="ptb_lower"), max_text_chars=200))
    with Client(server.address, timeout=10) as client:
        yield client


@pytest.mark.parametrize("api", ["classify", "kserve_infer"])
def test_a_text_read_as_nothing_up_to_max_text_chars_is_refused_naming_the_limit(cut_to_200, api):
    named = "text 0 holds nothing the tokenizer keeps in its first 200 characters"
    with pytest.raises(grpc.RpcError, match=named) as refused:
        getattr(cut_to_200, api)(["<br>" * 60 + "great"])  # its word comes after the 200 characters read
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_pair_read_as_nothing_up_to_max_text_chars_is_refused_naming_the_limit(make_bundle, start_server):
    server = start_server(settings_for(make_bundle(text_style="ptb_lower", **pair_spec()), max_text_chars=200))
    with (
        Client(server.address, timeout=10) as client,
        pytest.raises(grpc.RpcError, match="text pair 0 .* first 200") as refused,
    ):
        client.classify(["good"], ["<br>" * 60 + "great"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("length", [60, 200], ids=["short", "of max_text_chars"])
def test_a_text_read_as_nothing_that_was_not_cut_is_refused_without_naming_the_limit(cut_to_200, length):
    with pytest.raises(grpc.RpcError, match=r"text 0 holds nothing the tokenizer keeps \(only") as refused:
        cut_to_200.classify(["<br>" * (length // 4)])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_ptb_lower_pair_bundle_writes_both_texts_of_a_pair_in_its_style(make_bundle, start_server):
    server = start_server(settings_for(make_bundle(text_style="ptb_lower", **pair_spec())))
    with Client(server.address, timeout=10) as client:
        sent, trained = client.classify(["a movie", "A MOVIE"], [SENT, TRAINED])["predictions"]
    assert sent["probabilities"] == trained["probabilities"]
