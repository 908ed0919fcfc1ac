"""The client library's wait for a server: ready once its health service says SERVING, not while it warms up, not
once it is gone, and not past its seconds; the serving page's example of the library; the texts it takes."""

import contextlib
import io
import re
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from edgedistill.bench.ports import free_port
from edgedistill.serve.client import Client, wait_ready
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc

from tests.conftest import ROOT
from tests.serve.conftest import settings_for


def unused_address() -> str:
    return f"127.0.0.1:{free_port()}"


def test_a_serving_server_is_ready(served):
    assert wait_ready(served.address, 10)


def test_a_server_still_warming_up_is_not_ready(start_server, bundle):
    server = start_server(settings_for(bundle), warm=False)
    assert not wait_ready(server.address, 1)


def test_nothing_listening_is_not_ready():
    assert not wait_ready(unused_address(), 0.5)


def test_a_wait_ends_once_its_seconds_pass():
    started = time.monotonic()
    wait_ready(unused_address(), 0.5)
    assert time.monotonic() - started < 5


def test_a_server_gone_is_not_waited_for():
    started = time.monotonic()
    wait_ready(unused_address(), 60, running=lambda: False)
    assert time.monotonic() - started < 5


def test_a_proxy_of_the_environment_is_not_asked_for_a_server_on_this_machine(served, monkeypatch):
    # gRPC takes http_proxy for any channel, and Docker and podman copy it into containers
    monkeypatch.setenv("http_proxy", f"http://{unused_address()}")
    assert wait_ready(served.address, 5)


@pytest.mark.parametrize("target", ["{}", "dns:///{}", "ipv4:{}"], ids=["host:port", "dns", "ipv4"])
def test_the_client_calls_a_server_on_this_machine_past_a_proxy_of_the_environment(served, monkeypatch, target):
    monkeypatch.setenv("http_proxy", f"http://{unused_address()}")
    with Client(target.format(served.address), retries=0) as client:
        assert len(client.classify(["a fine film"])["predictions"]) == 1


def test_the_serving_pages_python_example_prints_a_label_per_text(served):
    page = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    example = re.search(r"From Python, .*?```python\n(.*?)```", page, flags=re.DOTALL).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(example.replace("localhost:50051", served.address), {})  # noqa: S102 - the page's own code
    labels = [line.split(" ", 1)[0] for line in printed.getvalue().splitlines()]
    assert [label in ("negative", "positive") for label in labels] == [True, True]  # one line per text


@pytest.mark.parametrize(
    "given", [{"tls_cert": "client.pem"}, {"tls_key": "client.key"}, {"tls": True, "tls_key": "k"}]
)
def test_a_client_certificate_without_its_key_or_the_reverse_is_refused(given):
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        Client("localhost:1", **given)


@pytest.mark.parametrize("token", ["", " ", "none", "off"])
def test_a_blank_token_is_refused_not_sent_as_none(token):
    with pytest.raises(ValueError, match="token is empty, 'none' or 'off', which no server's TOKEN can be"):
        Client("localhost:1", token=token)


PLAINTEXT_TOKEN = "the token goes to .* in plaintext"


@pytest.mark.parametrize("address", ["vm:1", "10.0.0.1:1", "dns:///vm:1"])
def test_a_token_to_go_in_plaintext_beyond_loopback_is_warned_of(address):
    with pytest.warns(UserWarning, match=PLAINTEXT_TOKEN):
        Client(address, token="s3cret").close()


@pytest.mark.parametrize(
    "address, given",
    [
        ("127.0.0.1:1", {"token": "s3cret"}),
        ("localhost:1", {"token": "s3cret"}),
        ("0.0.0.0:1", {"token": "s3cret"}),
        ("[::]:1", {"token": "s3cret"}),
        ("vm:1", {"token": "s3cret", "tls": True}),
        ("vm:1", {}),
    ],
    ids=["loopback", "localhost", "unspecified", "unspecified v6", "tls", "no token"],
)
def test_a_client_over_tls_on_loopback_or_without_a_token_warns_of_nothing(recwarn, address, given):
    Client(address, **given).close()
    assert [str(w.message) for w in recwarn if "in plaintext" in str(w.message)] == []


def test_a_token_with_a_newline_is_refused():
    with pytest.raises(ValueError, match="token must be printable ASCII"):
        Client("localhost:1", token="s3cret\n")


@pytest.mark.parametrize("timeout", [0, -5, float("nan"), 1e12])
def test_a_timeout_no_call_can_keep_is_refused(timeout):
    with pytest.raises(ValueError, match="timeout must be above 0 and at most 1e"):
        Client("localhost:1", timeout=timeout)


@pytest.mark.parametrize("method", ["classify", "kserve_infer"])
def test_a_string_for_the_texts_is_refused_not_sent_as_its_characters(method):
    with Client("localhost:1") as client, pytest.raises(TypeError, match=r"texts is a str: give a list of texts"):
        getattr(client, method)("a good film")


@pytest.mark.parametrize("method", ["classify", "kserve_infer"])
def test_pairs_other_in_number_than_the_texts_are_refused_before_sending(method):
    with Client("localhost:1") as client, pytest.raises(ValueError, match="0 pairs for 2 texts"):
        getattr(client, method)(["a", "b"], pairs=[])


@pytest.mark.parametrize("method", ["classify", "kserve_infer"])
def test_pairs_other_in_number_than_texts_from_a_generator_are_refused_before_sending(method):
    with Client("localhost:1") as client, pytest.raises(ValueError, match="1 pairs for 2 texts"):
        getattr(client, method)((text for text in ["a", "b"]), pairs=["c"])


@pytest.mark.parametrize("method", ["classify", "kserve_infer"])
def test_texts_from_a_generator_are_classified(served, method):
    with Client(served.address) as client:
        predictions = getattr(client, method)(text for text in ["a great film", "a dull film"])["predictions"]
    assert [p["text"] for p in predictions] == ["a great film", "a dull film"]


@pytest.mark.parametrize("method", ["classify", "kserve_infer"])
def test_pairs_in_an_array_are_classified(served_pairs, method):
    with Client(served_pairs.address) as client:
        predictions = getattr(client, method)(["a film", "a film"], pairs=np.array(["great", "awful"]))["predictions"]
    assert [p["label"] for p in predictions] == ["positive", "negative"]  # the pair decides the label


class _LargeInfo(classifier_pb2_grpc.ClassifierServicer):
    """A server whose model info is larger than gRPC's default receive limit (4 MiB), as a Classify reply of many
    texts is."""

    def GetModelInfo(self, request, context):
        return classifier_pb2.ModelInfo(name="big", labels=["x" * 1000] * 5000)


@pytest.fixture
def large_replies() -> str:
    server = grpc.server(ThreadPoolExecutor(1))
    classifier_pb2_grpc.add_ClassifierServicer_to_server(_LargeInfo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_a_reply_beyond_grpcs_default_receive_limit_is_received(large_replies):
    with Client(large_replies) as client:
        assert client.model_info()["name"] == "big"
