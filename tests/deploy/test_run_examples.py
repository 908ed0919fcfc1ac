"""The `docker run` / `podman run` examples of the server (README.md, docs/deploy.md, the Dockerfiles' usage lines)
give it its whole drain before the engine's SIGKILL."""

import re

import pytest
from edgedistill.serve.settings import Settings
from edgedistill.serve.workers import STOP_MARGIN_S

from tests.conftest import ROOT

RUN = re.compile(r"(?:docker|podman) run [^`]*")
DRAIN_S = Settings().shutdown_grace_s + STOP_MARGIN_S  # the supervisor's budget from SIGTERM to its exit


def markdown_code(text: str) -> list[str]:
    """The lines of fenced code blocks and the inline code spans (one line each) of a markdown page."""
    fenced, prose, inside = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        else:
            (fenced if inside else prose).append(line)
    spans = re.findall(r"`([^`]+)`", "\n".join(prose))
    return fenced + [" ".join(span.split()) for span in spans]


def server_runs() -> list[str]:
    """The examples that run the server: those that publish its gRPC port."""
    code = [
        line
        for page in ("README.md", "docs/deploy.md")
        for line in markdown_code((ROOT / page).read_text(encoding="utf-8"))
    ]
    code += [
        line.lstrip("# ")
        for name in ("Dockerfile", "Dockerfile.gpu")
        for line in (ROOT / name).read_text().splitlines()
    ]
    return [run for line in code for run in RUN.findall(line) if "50051" in run]


def test_the_deploy_page_and_the_dockerfiles_have_server_run_examples():
    assert len(server_runs()) >= 5


@pytest.mark.parametrize("example", server_runs())
def test_a_server_run_example_waits_for_the_drain_before_killing_it(example):
    timeout = re.search(r"--stop-timeout[= ](\d+)", example)
    assert timeout and int(timeout[1]) > DRAIN_S, f"add --stop-timeout above {DRAIN_S:g}: {example}"
