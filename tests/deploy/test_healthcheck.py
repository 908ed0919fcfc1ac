"""The health check the images and the compose file run, against a real server on loopback: it asks the port the
server's settings give it, the gRPC port where EDGEDISTILL_HEALTH_PORT turns the health port off."""

import os
import subprocess
import sys

import pytest
from edgedistill.bench.ports import free_port

from tests.deploy.test_manifests import HEALTHCHECK, compose_service, health_command
from tests.serve.conftest import RunningServer, settings_for, write_bundle

COMMANDS = {
    "Dockerfile": health_command("Dockerfile"),
    "Dockerfile.gpu": health_command("Dockerfile.gpu"),
    "docker-compose.yml": compose_service()["healthcheck"]["test"][1:],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A warm server of the tiny bundle on a loopback port, without a health port."""
    running = RunningServer(settings_for(write_bundle(tmp_path_factory.mktemp("served") / "bundle-tiny")))
    yield running
    running.close()


def health_check(command: list[str], port: int, health_port: str) -> subprocess.CompletedProcess:
    """`command` (the image's Python here this one) with the server's settings as the container's variables."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("EDGEDISTILL_")}
    env |= {"EDGEDISTILL_HOST": "127.0.0.1", "EDGEDISTILL_PORT": str(port), "EDGEDISTILL_HEALTH_PORT": health_port}
    here = [sys.executable if word == HEALTHCHECK[0] else word for word in command]
    return subprocess.run(here, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("health_port", ["off", "none", "0"])
@pytest.mark.parametrize("source", COMMANDS)
def test_the_health_check_without_a_health_port_asks_the_grpc_port(server, source, health_port):
    assert health_check(COMMANDS[source], server.port, health_port).returncode == 0


def test_the_health_check_fails_where_no_server_answers():
    assert health_check(HEALTHCHECK, free_port(), "off").returncode == 1
