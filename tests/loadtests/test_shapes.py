"""A shape brings each stage's users up or down at once, as the plan counts their calls offered from the stage's
start, and locust's warning about so fast a ramp stays out of its log.

locust monkey-patches the process with gevent on import, so the shape runs in a child process.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from edgedistill.common.config.measure import LoadtestConfig
from edgedistill.loadtests.plan import PLAN_VAR, Plan

from tests.serve.conftest import ROOT, subprocess_env

USERS, SPIKE_USERS = 20, 250  # a spike of more users than locust starts a second at its usual rates
RUN = """
import json, logging
import gevent
from locust import User, constant, task
from locust.dispatch import UsersDispatcher
from locust.env import Environment
from locust.runners import WorkerNode
from edgedistill.loadtests import plan
from edgedistill.loadtests.shapes import SHAPES

class Idle(User):
    wait_time = constant(60)

    @task
    def idle(self):
        pass

shape = SHAPES[plan.current().profile]()
ticks = []
for stage in shape.stages:
    shape.get_run_time = lambda: stage.start_s
    ticks.append(shape.tick())

batches = []  # per stage, the users after each batch locust's dispatcher starts or stops
dispatcher = UsersDispatcher(worker_nodes=[WorkerNode("local")], user_classes=[Idle])
for users, rate in ticks:
    dispatcher.new_dispatch(users, rate)
    batches.append([dispatched["local"]["Idle"] for dispatched in dispatcher])

warnings = []  # what locust logs at WARNING or above while its runner takes the shape's ticks
handler = logging.Handler(logging.WARNING)
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger().addHandler(handler)
runner = Environment(user_classes=[Idle]).create_local_runner()
for users, rate in ticks:
    runner.start(users, rate)
    runner.spawning_greenlet.join()
runner.quit()
print(json.dumps({"batches": batches, "warnings": warnings}))
"""


@pytest.fixture(scope="module")
def spike(tmp_path_factory) -> dict:
    """The batches of each stage of a spike profile, and locust's warnings while its runner runs them."""
    load = {"users": USERS, "spike_users": SPIKE_USERS, "before_s": 1, "spike_s": 1, "after_s": 1}
    plan = Plan(
        profile="spike",
        loadtest=LoadtestConfig(spike=load),
        scenarios={"single": 1},
        model="m",
        texts=Path("texts.txt"),
        samples=Path("requests.npz"),
    )
    path = tmp_path_factory.mktemp("spike") / "plan.json"
    path.write_text(plan.model_dump_json(), encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-c", RUN],
        cwd=ROOT,
        env=subprocess_env(**{PLAN_VAR: str(path)}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_each_stage_of_a_spike_starts_or_stops_its_users_in_one_batch(spike):
    assert spike["batches"] == [[USERS], [SPIKE_USERS], [USERS]]


def test_a_spike_of_hundreds_of_users_at_once_logs_no_warning(spike):
    assert spike["warnings"] == []
