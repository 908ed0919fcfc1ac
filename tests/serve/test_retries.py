"""Retries: the client's gRPC retry policy, and the server telling it when sending again cannot help."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from edgedistill.serve import call as cli
from edgedistill.serve.call import build_parser
from edgedistill.serve.client import Client, NotSent, retry_options
from edgedistill.serve.proto import classifier_pb2_grpc
from edgedistill.serve.settings import MIN_MESSAGE_BYTES
from edgedistill.serve.transport import RETRY_PUSHBACK_KEY

from tests.serve.conftest import settings_for
from tests.serve.test_client import unused_address
from tests.serve.test_operations import metric, scrape

CLASSIFY = "/edgedistill.v1.Classifier/Classify"
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
GET_MODEL_INFO = "/edgedistill.v1.Classifier/GetModelInfo"
LIMIT = 64 * 1024  # the server's MAX_MESSAGE_BYTES in the tests of requests over it
OVER_LIMIT = "x" * (LIMIT + 1)


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


class CutReloads(classifier_pb2_grpc.ClassifierServicer):
    """Cuts each Reload with UNAVAILABLE, as a server closing the connection (its max age, a drain) while it loads the
    bundle all the same; counts the attempts."""

    def __init__(self):
        self.attempts = 0

    def Reload(self, request, context):
        self.attempts += 1
        context.abort(grpc.StatusCode.UNAVAILABLE, "max connection age")


@pytest.fixture
def cut_reloads():
    """`(servicer, address)`: a gRPC server on loopback running `CutReloads`."""
    servicer, server = CutReloads(), grpc.server(ThreadPoolExecutor(1))
    classifier_pb2_grpc.add_ClassifierServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_a_reload_cut_with_unavailable_is_not_sent_again(cut_reloads):
    servicer, address = cut_reloads
    with Client(address, retries=3) as client, pytest.raises(grpc.RpcError):
        client.reload()
    assert servicer.attempts == 1, "each attempt would load the bundle again"


def test_the_client_cli_hints_that_the_server_may_go_on_with_a_cut_reload(cut_reloads, capsys):
    cli.main(["--address", cut_reloads[1], "--reload"])
    assert json.loads(capsys.readouterr().err)["error"]["hint"].startswith("the call was cut, and is not sent again")


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


def test_a_server_still_warming_up_is_sent_the_call_again_by_a_retrying_client(start_server, bundle):
    server = start_server(settings_for(bundle), warm=False)  # UNAVAILABLE: the model is still loading or warming up
    with Client(server.address, retries=3) as client, pytest.raises(grpc.RpcError) as caught:
        client.classify(["a great movie"])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused_calls(server, "UNAVAILABLE") == 4, "the first attempt and three retries"


def test_a_server_still_warming_up_behind_a_token_is_sent_the_call_again_by_a_retrying_client(start_server, bundle):
    server = start_server(settings_for(bundle, token="secret"), warm=False)  # the request read after the token check
    with Client(server.address, retries=3, token="secret") as client, pytest.raises(grpc.RpcError) as caught:
        client.classify(["a great movie"])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refused_calls(server, "UNAVAILABLE") == 4, "the first attempt and three retries"


def refused_calls(server, code: str = "RESOURCE_EXHAUSTED") -> float:
    """Classify calls counted with `code`, once the count has settled: the server records a call after its reply has
    left, so a client can hold the status a moment before the metric moves."""

    def count() -> float:
        return metric(scrape(server), "edgedistill_requests_total", method=CLASSIFY, code=code)

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


@pytest.fixture
def limited(start_server, bundle, gateway):
    """A gateway counting the calls it forwards, of both APIs, to a server whose MAX_MESSAGE_BYTES is `LIMIT`; the
    gateway itself takes gRPC's default 4 MiB, so a request over the limit reaches it when sent."""
    server = start_server(settings_for(bundle, max_message_bytes=LIMIT))
    return gateway(server.address, ("/edgedistill.v1.Classifier/", "/inference.GRPCInferenceService/"))


def classify_over_the_limit(address: str, kserve: bool) -> grpc.RpcError:
    with Client(address, retries=3) as client, pytest.raises(grpc.RpcError) as caught:
        (client.kserve_infer if kserve else client.classify)([OVER_LIMIT])
    return caught.value


@pytest.mark.parametrize("kserve", [False, True])
def test_a_request_over_the_servers_message_limit_is_refused_as_resource_exhausted(limited, kserve):
    assert classify_over_the_limit(limited.address, kserve).code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("kserve", [False, True])
def test_a_request_over_the_servers_message_limit_is_refused_naming_the_limit(limited, kserve):
    assert (
        f"over the {LIMIT} the server takes in a message" in classify_over_the_limit(limited.address, kserve).details()
    )


@pytest.mark.parametrize("kserve", [False, True])
def test_a_request_over_the_servers_message_limit_is_neither_sent_nor_retried(limited, kserve):
    classify_over_the_limit(limited.address, kserve)
    assert limited.calls[MODEL_INFER if kserve else CLASSIFY] == 0


def test_the_servers_message_limit_is_asked_once_for_requests_within_it(limited):
    with Client(limited.address, retries=0) as client:
        for _ in range(3):
            client.classify(["x" * (LIMIT // 2)])
    assert limited.calls[GET_MODEL_INFO] == 1


def test_the_servers_message_limit_is_asked_again_before_each_refusal(limited):
    with Client(limited.address, retries=0) as client:
        for _ in range(3):
            with pytest.raises(grpc.RpcError):
                client.classify([OVER_LIMIT])
    assert limited.calls[GET_MODEL_INFO] == 3


def restart_with_limit(limited, start_server, bundle, client: Client, limit: int) -> None:
    """Once `client` has learnt the limit of the server behind `limited`, put a server whose MAX_MESSAGE_BYTES is
    `limit` behind the same address, as a restart with another limit would, and clear the gateway's counts."""
    client.classify(["x" * (LIMIT // 2)])
    limited.point_to(start_server(settings_for(bundle, max_message_bytes=limit)).address)
    limited.calls.clear()


def test_a_request_within_a_limit_raised_since_the_client_asked_is_sent(limited, start_server, bundle):
    with Client(limited.address, retries=0) as client:
        restart_with_limit(limited, start_server, bundle, client, 4 * LIMIT)
        client.classify(["x" * (2 * LIMIT)])
    assert limited.calls[CLASSIFY] == 1


def test_a_request_over_a_limit_lowered_since_the_client_asked_is_sent_once_then_refused_unsent(
    limited, start_server, bundle
):
    with Client(limited.address, retries=0) as client:
        restart_with_limit(limited, start_server, bundle, client, LIMIT // 4)
        for _ in range(2):
            with pytest.raises(grpc.RpcError):
                client.classify(["x" * (LIMIT // 2)])
    assert limited.calls[CLASSIFY] == 1


def test_a_request_over_a_kept_limit_is_refused_unsent_where_the_server_cannot_be_asked_again(limited):
    with Client(limited.address, retries=0) as client:
        client.classify(["x" * (LIMIT // 2)])
        limited.point_to(unused_address())  # GetModelInfo through the gateway: UNAVAILABLE
        limited.calls.clear()
        with pytest.raises(NotSent):
            client.classify([OVER_LIMIT])
    assert limited.calls[CLASSIFY] == 0


def test_the_labels_of_a_large_request_s_reply_come_with_the_servers_limit(limited):
    with Client(limited.address, retries=0) as client:
        client.classify(["x" * (LIMIT // 2)])
    assert limited.calls[GET_MODEL_INFO] == 1


def test_a_request_within_the_servers_message_limit_is_sent(limited):
    with Client(limited.address, retries=0) as client:
        client.classify(["x" * (LIMIT // 2)])
    assert limited.calls[CLASSIFY] == 1


def test_a_request_that_fits_every_server_is_sent_without_asking_the_limit(monkeypatch):
    with Client(unused_address(), retries=0) as client, pytest.raises(grpc.RpcError) as caught:
        monkeypatch.setattr(client, "limits", lambda *args: pytest.fail("the limit was asked"))
        client.classify(["x" * (MIN_MESSAGE_BYTES // 2)])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, "sent, to no server"


def test_a_request_to_a_server_that_does_not_say_its_limit_is_sent(start_server, bundle, gateway):
    server = start_server(settings_for(bundle, max_message_bytes=LIMIT))
    only_classify = gateway(server.address, (CLASSIFY,))  # GetModelInfo is UNIMPLEMENTED through it
    with Client(only_classify.address, retries=0) as client, pytest.raises(grpc.RpcError) as caught:
        client.classify([OVER_LIMIT])
    assert "larger than max" in caught.value.details(), "gRPC's own refusal, as before"


@pytest.fixture
def cli_over_the_limit(limited, capsys) -> tuple[int, dict]:
    """The CLI's exit status and JSON error for a short text and one over the server's message limit."""
    status = cli.main(["--address", limited.address, "short", OVER_LIMIT])
    return status, json.loads(capsys.readouterr().err)["error"]


def test_the_client_cli_exits_1_for_a_text_over_the_servers_message_limit(cli_over_the_limit):
    assert cli_over_the_limit[0] == 1


def test_the_client_cli_names_the_argument_over_the_servers_message_limit(cli_over_the_limit):
    assert cli_over_the_limit[1]["where"] == "argument 2"


def test_the_client_cli_sends_the_text_before_the_one_over_the_limit_alone(limited, cli_over_the_limit):
    assert limited.calls[CLASSIFY] == 1


def test_a_client_stops_retrying_a_server_that_keeps_refusing(refusing):
    servicer, address = refusing(100)
    with Client(address, retries=3) as client:
        for _ in range(2):
            with pytest.raises(grpc.RpcError):
                client.classify(["a great movie"])
    assert servicer.attempts == 5, "the first call tried four times, the second once: half the tokens were spent"
