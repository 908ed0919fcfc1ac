"""The locustfile under locust: a token set but blank stops it before any load, as the server and the client refuse
such a token, naming the variable."""

import subprocess

import pytest
from edgedistill.common.config.measure import LoadtestConfig
from edgedistill.common.processes import python_module
from edgedistill.loadtests.plan import PLAN_VAR, Plan
from edgedistill.loadtests.runner import LOCUSTFILE
from edgedistill.serve.call import TOKEN_VAR

from tests.serve.conftest import subprocess_env

BLANK_TOKENS = ["", " ", "none", "off"]


def locust(tmp_path, token: str) -> subprocess.CompletedProcess:
    """Headless locust on a one-second smoke plan in `tmp_path` against a port no server listens on, with
    EDGEDISTILL_TOKEN set to `token`."""
    plan = Plan(
        profile="smoke",
        loadtest=LoadtestConfig.model_validate({"smoke": {"duration_s": 1}}),
        scenarios={"single": 1},
        model="tiny",
        texts="texts.txt",
        samples="samples.npz",
    )
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    (tmp_path / "texts.txt").write_text("a gripping film\n")
    command = python_module("locust", "-f", str(LOCUSTFILE), "--headless", "--host", "127.0.0.1:1", "--only-summary")
    env = subprocess_env(**{PLAN_VAR: str(tmp_path / "plan.json"), TOKEN_VAR: token})
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("token", BLANK_TOKENS, ids=repr)
def test_a_blank_token_stops_locust_naming_the_variable(tmp_path, token):
    assert f"locustfile: {TOKEN_VAR} is empty, 'none' or 'off'" in locust(tmp_path, token).stderr


def test_a_blank_token_stops_locust_with_an_error_status(tmp_path):
    assert locust(tmp_path, " ").returncode == 1
