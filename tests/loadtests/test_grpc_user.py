"""The interceptor reports every call as a locust request event, failed calls with their exception.

locust monkey-patches the process with gevent on import, so the client side runs in a child process
against a real server on port 0 in this one.
"""

import json
import subprocess
import sys

import pytest
from edgedistill.bench.ports import free_port

from tests.serve.conftest import ROOT, RunningServer, settings_for, subprocess_env, write_bundle

CLIENT = """
import json, sys
import grpc
from locust.env import Environment
from locust.event import Events
from edgedistill.loadtests.grpc_user import EventInterceptor, GrpcUser
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc, kserve_pb2, kserve_pb2_grpc

address = sys.argv[1]
events = Events()
fired = []

def on_request(request_type, name, response_time, response_length, exception, **_):
    code = exception.code().name if exception is not None else None
    fired.append({"type": request_type, "name": name, "ms": response_time, "bytes": response_length, "error": code})

events.request.add_listener(on_request)
channel = grpc.intercept_channel(grpc.insecure_channel(address), EventInterceptor(events))
classifier = classifier_pb2_grpc.ClassifierStub(channel)
kserve = kserve_pb2_grpc.GRPCInferenceServiceStub(channel)
classifier.Classify(classifier_pb2.ClassifyRequest(texts=["a great movie"]))
replies = list(classifier.ClassifyStream(iter([classifier_pb2.ClassifyRequest(texts=["good"])] * 3)))
unknown = kserve_pb2.ModelInferRequest(model_name="no-such-model")
unknown.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"fun")
try:
    kserve.ModelInfer(unknown)
except grpc.RpcError:
    pass

class User(GrpcUser):
    host = address

user = User(Environment(events=events))
stub = kserve_pb2_grpc.GRPCInferenceServiceStub(user.channel)
failed = user.call(stub.ModelInfer, unknown, "unknown model")
empty = user.stream(classifier_pb2_grpc.ClassifierStub(user.channel).ClassifyStream, [classifier_pb2.ClassifyRequest()], "empty")
user.on_stop()
print(json.dumps({"events": fired, "replies": len(replies), "failed": failed, "empty": empty}))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = RunningServer(settings_for(write_bundle(tmp_path_factory.mktemp("lt") / "bundle-tiny")))
    yield running
    running.close()


def run_client(source: str, address: str, **env: str) -> dict:
    """Run `source` in a child process against `address`, with the further variables `env`; the JSON object of its last
    output line."""
    result = subprocess.run(
        [sys.executable, "-c", source, address],
        cwd=ROOT,
        env=subprocess_env() | env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_interceptor_fires_request_events(server):
    out = run_client(CLIENT, server.address)
    events = out["events"]
    assert [(e["name"], e["error"]) for e in events] == [
        ("Classify", None),
        ("ClassifyStream", None),
        ("ModelInfer", "NOT_FOUND"),
        ("unknown model", "NOT_FOUND"),
        ("empty", "INVALID_ARGUMENT"),
    ]
    assert all(e["type"] == "grpc" for e in events)
    assert all(e["ms"] > 0 for e in events)
    assert events[0]["bytes"] > 0
    assert events[1]["bytes"] > events[0]["bytes"]  # the stream's three replies
    assert events[2]["bytes"] == 0
    assert out["replies"] == 3
    assert out["failed"] is None
    assert out["empty"] is None


CONNECTS = """
import json, sys, time
import gevent
from locust.env import Environment
from edgedistill.loadtests.grpc_user import GrpcUser

class User(GrpcUser):
    host = sys.argv[1]

environment = Environment()
fired = []
environment.events.request.add_listener(lambda name, **_: fired.append(name))
user = User(environment)
user.on_start()
states = []
user.channel.subscribe(states.append)  # its state now: subscribing does not connect
deadline = time.monotonic() + 10
while not states and time.monotonic() < deadline:
    gevent.sleep(0.01)
user.on_stop()
print(json.dumps({"state": states[0].name if states else None, "events": fired}))
"""


def test_a_user_connects_on_start_without_reporting_a_call(server):
    out = run_client(CONNECTS, server.address)
    assert out["state"] == "READY"
    assert out["events"] == []


def test_a_user_connects_to_a_server_on_this_machine_past_a_proxy_of_the_environment(server):
    out = run_client(CONNECTS, server.address, http_proxy=f"http://127.0.0.1:{free_port()}")
    assert out["state"] == "READY"


CONNECTS_TO_NOTHING = """
import json, sys
from locust.env import Environment
from edgedistill.loadtests.grpc_user import GrpcUser

class User(GrpcUser):
    host = sys.argv[1]
    timeout = 0.5

environment = Environment()
fired = []
environment.events.request.add_listener(lambda name, exception, **_: fired.append([name, exception.code().name]))
user = User(environment)
user.on_start()
user.on_stop()
print(json.dumps({"events": fired}))
"""


def test_a_user_whose_server_never_answers_reports_its_connection_as_a_failed_call():
    out = run_client(CONNECTS_TO_NOTHING, f"127.0.0.1:{free_port()}")
    assert out["events"] == [["connect", "DEADLINE_EXCEEDED"]]


CONCURRENT = """
import json, sys, time
import gevent
from locust.env import Environment
from edgedistill.loadtests.grpc_user import GrpcUser
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc

class User(GrpcUser):
    host = sys.argv[1]

users = [User(Environment()) for _ in range(4)]
request = classifier_pb2.ClassifyRequest(texts=["a great movie"])
for user in users:  # connect first, so that only the calls are timed
    user.on_start()
started = time.perf_counter()
calls = [gevent.spawn(user.call, classifier_pb2_grpc.ClassifierStub(user.channel).Classify, request) for user in users]
gevent.joinall(calls, timeout=30)
print(json.dumps({"seconds": time.perf_counter() - started, "ok": [c.value is not None for c in calls]}))
"""
QUEUE_DELAY_S = 0.5


@pytest.mark.serial  # a bound on time
def test_users_call_concurrently_under_gevent(tmp_path):
    """Four users' calls wait out one queue delay together; one at a time they would take four."""
    bundle = write_bundle(tmp_path / "bundle-tiny")
    slow = RunningServer(settings_for(bundle, max_queue_delay_ms=QUEUE_DELAY_S * 1000, max_batch_size=64))
    try:
        out = run_client(CONCURRENT, slow.address)
    finally:
        slow.close()
    assert out["ok"] == [True] * 4
    # one at a time: at least 4 delays (2 s); together: one delay, plus connecting on a busy machine
    assert QUEUE_DELAY_S <= out["seconds"] < 3 * QUEUE_DELAY_S, out["seconds"]
