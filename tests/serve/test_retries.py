"""Retries: the client's gRPC retry policy, and the server telling it when sending again cannot help."""

import time

import grpc
import pytest
from edgedistill.serve.client import Client, build_parser, retry_options
from edgedistill.serve.transport import RETRY_PUSHBACK_KEY

from tests.serve.conftest import settings_for
from tests.serve.test_operations import metric, scrape

CLASSIFY = "/edgedistill.v1.Classifier/Classify"


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE])
def test_the_client_retries_an_overloaded_or_unavailable_server(refusing, code):
    servicer, address = refusing(2, code)
    with Client(address, retries=3) as client:
        assert client.classify(["a great movie"])["predictions"][0]["label"] == "positive"
    assert servicer.attempts == 3


def test_the_client_retries_a_call_larger_than_grpcs_default_retry_buffer(refusing):
    servicer, address = refusing(2)
    with Client(address, retries=3) as client:  # 300 kB: over the 256 KiB gRPC keeps of a call by default
        client.classify(["x" * 300_000])
    assert servicer.attempts == 3


def test_retries_stop_at_the_limit_and_can_be_turned_off(refusing):
    servicer, address = refusing(10)
    with Client(address, retries=2) as client, pytest.raises(grpc.RpcError) as caught:
        client.classify(["a great movie"])
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert servicer.attempts == 3
    servicer, address = refusing(10)
    with Client(address, retries=0) as client, pytest.raises(grpc.RpcError):
        client.classify(["a great movie"])
    assert servicer.attempts == 1


def test_a_client_error_is_not_retried(refusing):
    servicer, address = refusing(10, grpc.StatusCode.INVALID_ARGUMENT)
    with Client(address, retries=3) as client, pytest.raises(grpc.RpcError):
        client.classify(["a great movie"])
    assert servicer.attempts == 1


def test_a_request_over_a_limit_tells_retrying_clients_to_stop(start_server, bundle):
    server = start_server(settings_for(bundle, max_texts=2))
    before = metric(scrape(server), "edgedistill_requests_total", method=CLASSIFY, code="RESOURCE_EXHAUSTED")
    assert before == 0
    with Client(server.address, retries=3) as client, pytest.raises(grpc.RpcError) as caught:
        client.classify(["one", "two", "three"])
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "split the request" in caught.value.details()
    assert (RETRY_PUSHBACK_KEY, "-1") in tuple(caught.value.trailing_metadata())
    assert any(key == "x-request-id" for key, _ in caught.value.trailing_metadata()), "the request id stays"
    assert refused_calls(server) - before == 1, "one attempt: the server's pushback stopped the retries"


def refused_calls(server) -> float:
    """RESOURCE_EXHAUSTED Classify calls counted, once the count has settled: the server records a call after
    its reply has left, so a client can hold the status a moment before the metric moves."""

    def count() -> float:
        return metric(scrape(server), "edgedistill_requests_total", method=CLASSIFY, code="RESOURCE_EXHAUSTED")

    deadline, seen = time.monotonic() + 5, count()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = count()
        if now == seen and now > 0:
            return now
        seen = now
    return seen


def test_retry_options_refuse_more_retries_than_grpc_allows():
    with pytest.raises(ValueError, match="between 0 and 4"):
        retry_options(5)


def test_the_client_cli_refuses_more_retries_than_grpc_allows(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--retries", "9", "text"])
    assert "argument --retries: invalid choice: 9" in capsys.readouterr().err


def test_the_client_cli_retries_three_times_by_default():
    assert build_parser().parse_args(["text"]).retries == 3
