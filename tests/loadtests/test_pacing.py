"""Paced users spawned together make their first calls at their own phases, not in a burst at the start; a user held up
by a stalled call, or by a server slow to answer its connection, sends the calls due meanwhile, and their latency counts
from their due time; one still held up when locust stops it counts the calls it never sent as unsent.

locust monkey-patches the process with gevent on import, so the users run in a child process.
"""

import itertools
import json
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest
from edgedistill.common.config.measure import LoadtestConfig
from edgedistill.loadtests import result
from edgedistill.loadtests.analysis import Resources, Samples
from edgedistill.loadtests.plan import Plan
from grpc_health.v1 import health, health_pb2_grpc

from tests.serve.conftest import ROOT, subprocess_env

USERS = 20
INTERVAL_S = 1.0
RUN = f"""
import json, time
import gevent
from locust import task
from locust.env import Environment
from edgedistill.loadtests.pacing import PacedUser

first = {{}}  # user -> (when its first task started, when it was due, when it started)

class Recording(PacedUser):
    user_rate = {1 / INTERVAL_S}

    def on_start(self):
        self.drawn = time.perf_counter()  # the schedule starts with the user
        super().on_start()

    @task
    def call(self):
        first.setdefault(id(self), (time.perf_counter(), self.next_start, self.drawn))

runner = Environment(user_classes=[Recording]).create_local_runner()
started = time.perf_counter()
runner.start({USERS}, spawn_rate=1000)  # together
gevent.sleep({1.5 * INTERVAL_S})
runner.quit()
print(json.dumps(sorted((called - started, due - drawn, called - due) for called, due, drawn in first.values())))
"""


@pytest.fixture(scope="module")
def first_calls() -> list[list[float]]:
    """Each user's first call, in order: (seconds from the spawn to it, from the user's start to its due time, from its due
    time to it)."""
    result = subprocess.run(
        [sys.executable, "-c", RUN], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_user_makes_a_first_call(first_calls):
    assert len(first_calls) == USERS


def test_every_user_s_first_call_is_due_within_one_interval_of_its_start(first_calls):
    # its schedule, not the wall clock: a stall of the machine delays a call past its due time but moves no due time
    # (timed from the spawn, a 0.25 s stall failed it)
    assert [phase for _, phase, _ in first_calls if not 0 <= phase < INTERVAL_S] == []


def test_every_user_makes_its_first_call_at_its_due_time(first_calls):
    # not before it, and not an interval later: a stall of the machine of less than a second delays it less
    assert [late for _, _, late in first_calls if not 0 <= late < INTERVAL_S] == []


def test_first_calls_of_users_spawned_together_spread_over_the_interval(first_calls):
    # 20 phases drawn uniformly span less than half the interval about once in 25,000 runs; the due times, which a
    # stall of the machine at the start (bunching the calls it delays) leaves as they were
    phases = sorted(phase for _, phase, _ in first_calls)
    assert phases[-1] - phases[0] >= INTERVAL_S / 2, phases


STALL_RATE = 20.0  # calls/s
STALL_RUN_S = 9.5  # 190 calls, the stalled one alone under 1 % of them; locust's shape stops the user at 10 s
STALL_S = 2.5
STALL_AT = 40  # the server holds its 40th health check, about two seconds in
END_RATE = 50.0  # calls/s
END_RUN_S = 4.0  # 200 calls; locust's shape stops the user at 4 or 5 s, while the stalled call still runs
END_STALL_AT = 175  # about 3.5 s in, the stalled call alone under 1 % of those sent before it
CONNECT_RUN_S = 5.0  # 100 calls, the 50 due while the server holds the connection among them
STOPPED_CONNECTING_RUN_S = 2.0  # 40 calls, all due before the server answers the connection, at STALL_S
STOP_TIMEOUT_S = 10  # as the runner's --stop-timeout: a user stopped in a call finishes it
SLOW_P99_MS = 1000.0  # far over loopback calls on a busy machine, far under the calls held behind the stall
STALLED = """
import sys
import gevent
from grpc_health.v1 import health_pb2, health_pb2_grpc
from locust import LoadTestShape, task
from locust.env import Environment
from edgedistill.loadtests.grpc_user import GrpcUser
from edgedistill.loadtests.pacing import PacedUser
from edgedistill.loadtests.recorder import Recorder

rate, run_s = float(sys.argv[3]), float(sys.argv[4])

class Shape(LoadTestShape):
    def tick(self):
        return (1, 1) if self.get_run_time() < run_s else None

class Checking(PacedUser, GrpcUser):
    host = sys.argv[1]
    user_rate = rate
    schedule_s = run_s

    @task
    def check(self):
        self.call(health_pb2_grpc.HealthStub(self.channel).Check, health_pb2.HealthCheckRequest())

environment = Environment(user_classes=[Checking], shape_class=Shape(), stop_timeout=float(sys.argv[5]) or None)
recorder = Recorder(sys.argv[2])
recorder.attach(environment.events)
runner = environment.create_local_runner()
runner.start_shape()
while runner.shape_greenlet is not None:
    gevent.sleep(0.1)
runner.quit()
recorder.save()
"""


class StallsOnce(health.HealthServicer):
    """A health service that holds its `at`-th check for STALL_S, as a server that stalls once."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at
        self.calls = itertools.count(1)

    def Check(self, request, context):
        if next(self.calls) == self.at:
            time.sleep(STALL_S)
        return super().Check(request, context)


def run_stalled(folder: Path, rate: float, run_s: float, stall_at: int, stop_timeout: float) -> tuple[Samples, dict]:
    """The samples and result of a paced user at `rate` for `run_s` calling a server that holds its `stall_at`-th call
    for STALL_S, against a p99 of SLOW_P99_MS; locust waits `stop_timeout` s (0: none) for a user it stops."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    health_pb2_grpc.add_HealthServicer_to_server(StallsOnce(stall_at), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    path = folder / "requests.npz"
    try:
        run = subprocess.run(
            [sys.executable, "-c", STALLED, f"127.0.0.1:{port}", str(path), str(rate), str(run_s), str(stop_timeout)],
            cwd=ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop(None)
    assert run.returncode == 0, run.stderr[-3000:]
    load = {"users": 1, "rate": rate, "duration_s": run_s, "slo": {"p99_ms": SLOW_P99_MS}}
    plan = Plan(
        profile="steady",
        loadtest=LoadtestConfig(steady=load),
        scenarios={"single": 1},
        model="m",
        texts=Path("texts.txt"),
        samples=Path("requests.npz"),
    )
    samples = Samples.load(path)
    resources = Resources.from_rows([(samples.started + t, 0.0, 0.0, 0.0) for t in range(12)], samples.started)
    return samples, result.build(plan, samples, resources, task_errors=0, context={})


@pytest.fixture(scope="module")
def stalled(tmp_path_factory) -> tuple[Samples, dict]:
    """A paced user calling a server that stalls once, early in the run; locust kills the user at the end."""
    return run_stalled(tmp_path_factory.mktemp("stalled"), STALL_RATE, STALL_RUN_S, STALL_AT, stop_timeout=0)


@pytest.fixture(scope="module")
def stalled_at_the_end(tmp_path_factory) -> dict:
    """The result of a paced user calling a server that stalls once, still held up when locust stops the user."""
    folder = tmp_path_factory.mktemp("stalled-at-the-end")
    return run_stalled(folder, END_RATE, END_RUN_S, END_STALL_AT, STOP_TIMEOUT_S)[1]


@pytest.fixture(scope="module")
def slow_to_connect(tmp_path_factory) -> dict:
    """The result of a paced user whose connection the server answers STALL_S late, then calls on time."""
    return run_stalled(tmp_path_factory.mktemp("slow-to-connect"), STALL_RATE, CONNECT_RUN_S, 1, stop_timeout=0)[1]


@pytest.fixture(scope="module")
def stopped_connecting(tmp_path_factory) -> dict:
    """The result of a paced user still waiting for the server to answer its connection when locust stops it."""
    folder = tmp_path_factory.mktemp("stopped-connecting")
    return run_stalled(folder, STALL_RATE, STOPPED_CONNECTING_RUN_S, 1, stop_timeout=0)[1]


def test_a_server_that_stalls_once_misses_the_p99_timed_from_the_due_time(stalled):
    _, built = stalled
    assert next(c for c in built["checks"] if c["name"] == "p99_from_due_ms")["passed"] is False


@pytest.mark.serial  # a bound on time: a loaded machine sends fewer calls in the run
def test_a_user_held_up_by_a_stalled_call_sends_the_calls_due_meanwhile(stalled):
    _, built = stalled
    # less the first phase; skipping the 50 calls due during the stall would leave about 140
    assert built["overall"]["requests"] >= 0.9 * STALL_RATE * STALL_RUN_S, built["overall"]


def test_the_calls_held_up_by_the_stall_are_counted_late(stalled):
    _, built = stalled
    assert built["overall"]["late_calls"] >= STALL_S * STALL_RATE / 2, built["overall"]


def test_the_p99_from_the_send_leaves_the_stall_out(stalled):
    _, built = stalled
    assert built["overall"]["p99_ms"] < SLOW_P99_MS, built["overall"]


def test_no_call_due_after_the_schedule_is_sent(stalled):
    samples, _ = stalled
    # the recorder's start and the shape's, which the schedule counts from, are microseconds apart
    assert np.nanmax(samples.due_s) < STALL_RUN_S + 0.001, np.nanmax(samples.due_s)


def test_calls_due_but_unsent_when_locust_stops_a_user_held_up_count_as_unsent(stalled_at_the_end):
    # those due from the stall, about 3.5 s in, to the end of the schedule: about 25
    assert stalled_at_the_end["overall"]["unsent_calls"] >= 10, stalled_at_the_end["overall"]


def test_a_server_that_stalls_at_the_end_keeps_an_error_rate_of_zero(stalled_at_the_end):
    assert stalled_at_the_end["overall"]["error_rate"] == 0, stalled_at_the_end["overall"]


def test_a_server_that_stalls_at_the_end_misses_the_p99_timed_from_the_due_time(stalled_at_the_end):
    # the calls unsent waited 2 s and more from their due time to the user's stop, over 10 % of the calls
    assert next(c for c in stalled_at_the_end["checks"] if c["name"] == "p99_from_due_ms")["passed"] is False


def test_calls_due_while_the_user_connects_are_sent_late(slow_to_connect):
    # about STALL_S * STALL_RATE = 50, less the phase; the schedule starting once connected would leave none late
    assert slow_to_connect["overall"]["late_calls"] >= STALL_S * STALL_RATE / 2, slow_to_connect["overall"]


def test_calls_due_while_the_user_connects_count_as_unsent_when_locust_stops_it_first(stopped_connecting):
    # about STOPPED_CONNECTING_RUN_S * STALL_RATE = 40, less the phase
    assert stopped_connecting["overall"]["unsent_calls"] >= STOPPED_CONNECTING_RUN_S * STALL_RATE / 2, (
        stopped_connecting["overall"]
    )
