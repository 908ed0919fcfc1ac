"""Paced users spawned together make their first calls at their own phases, not in a burst at the start.

locust monkey-patches the process with gevent on import, so the users run in a child process.
"""

import json
import subprocess
import sys

import pytest

from tests.serve.conftest import ROOT, subprocess_env

USERS = 20
INTERVAL_S = 1.0
SPAWN_SLACK_S = 0.2  # for starting the users and for gevent's scheduling, well under the half interval the run adds
RUN = f"""
import json, time
import gevent
from locust import task
from locust.env import Environment
from edgedistill.loadtests.pacing import PacedUser

first = {{}}  # user -> when its first task started

class Recording(PacedUser):
    user_rate = {1 / INTERVAL_S}

    @task
    def call(self):
        first.setdefault(id(self), time.perf_counter())

runner = Environment(user_classes=[Recording]).create_local_runner()
started = time.perf_counter()
runner.start({USERS}, spawn_rate=1000)  # together
gevent.sleep({1.5 * INTERVAL_S})
runner.quit()
print(json.dumps(sorted(t - started for t in first.values())))
"""


@pytest.fixture(scope="module")
def first_calls() -> list[float]:
    """Seconds from the spawn to each user's first call, in order."""
    result = subprocess.run(
        [sys.executable, "-c", RUN], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_user_makes_its_first_call_within_one_interval(first_calls):
    assert len(first_calls) == USERS
    assert first_calls[-1] <= INTERVAL_S + SPAWN_SLACK_S, first_calls


def test_first_calls_of_users_spawned_together_spread_over_the_interval(first_calls):
    # 20 phases drawn uniformly span less than half the interval about once in 25,000 runs
    assert first_calls[-1] - first_calls[0] >= INTERVAL_S / 2, first_calls
