"""How each server of the peer comparison is started and found ready: commands, MLServer's settings, the peers'
environments, readiness by the server's log."""

import functools
import json
import sys

import pytest
from edgedistill.bench import BenchError
from edgedistill.bench.peers import launch
from edgedistill.common.cascade import ServedModels
from edgedistill.common.config.measure import PeersBenchConfig
from edgedistill.serve import workers
from edgedistill.serve.settings import Settings

from tests.bench.conftest import hold_workers


def test_the_server_runs_the_workers_asked_for(bundle):
    command = launch.edgedistill(bundle, "tiny-sentiment", 1, 3).command
    assert command[command.index("--workers") + 1] == "3"


@pytest.mark.parametrize("variables", [("TOKEN",), ("TLS_CERT", "TLS_KEY")])
def test_the_server_with_a_token_or_tls_is_refused_at_once(bundle, monkeypatch, variables):
    for variable in variables:
        monkeypatch.setenv(f"EDGEDISTILL_{variable}", "x")
    with pytest.raises(BenchError, match="over plaintext"):  # the measurements' refusal of TLS, or h2load's own
        launch.edgedistill(bundle, "tiny-sentiment", 1, 1)


def test_kserve_runs_without_its_per_request_log(bundle):
    command = launch.kserve(launch.Path(sys.executable), bundle, 1).command
    assert command[command.index("--enable_latency_logging") + 1] == "false"


def test_kserve_serves_the_bundle_under_the_peers_model_name(bundle):
    command = launch.kserve(launch.Path(sys.executable), bundle, 1).command
    assert command[command.index("--model_name") + 1] == launch.MODEL


@pytest.mark.parametrize("peer", ["kserve", "mlserver"])
def test_a_peer_records_the_servers_session_settings_from_the_environment(tmp_path, bundle, monkeypatch, peer):
    monkeypatch.setenv("EDGEDISTILL_SPIN", "true")
    start = {"kserve": launch.kserve, "mlserver": functools.partial(launch.mlserver, workers=1, folder=tmp_path)}
    session = start[peer](launch.Path(sys.executable), bundle, 1).session
    assert session == launch.edgedistill(bundle, "tiny-sentiment", 1, 1).session


def test_the_echo_server_records_no_session():
    assert launch.echo().session is None


def test_mlserver_model_settings_name_the_runtime_and_the_bundle(tmp_path, bundle):
    launch.mlserver(launch.Path(sys.executable), bundle, 2, 1, tmp_path)
    settings = json.loads((tmp_path / launch.MODEL / "model-settings.json").read_text())
    assert settings["implementation"] == "edgedistill.bench.peers.mlserver_runtime.BundleRuntime"
    assert settings["parameters"] == {"uri": str(bundle.absolute()), "extra": {"threads": 2}}


def test_mlserver_listens_on_loopback_with_debug_off(tmp_path, bundle):
    server = launch.mlserver(launch.Path(sys.executable), bundle, 1, 1, tmp_path)
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["host"] == "127.0.0.1"
    assert settings["debug"] is False
    assert settings["grpc_port"] == server.port


def test_mlserver_starts_with_the_environments_mlserver_command(tmp_path, bundle):
    server = launch.mlserver(launch.Path("/envs/mlserver/bin/python"), bundle, 1, 1, tmp_path)
    assert server.command[:2] == ["/envs/mlserver/bin/mlserver", "start"]


def test_a_peer_listed_twice_is_refused_naming_it():
    with pytest.raises(ValueError, match="peers lists kserve more than once"):
        PeersBenchConfig(peers=["kserve", "mlserver", "kserve"])


def test_a_missing_peer_environment_names_the_set_up_command(tmp_path):
    with pytest.raises(BenchError, match="make peers-setup"):
        launch.peer_python("kserve", tmp_path / "python")


def test_the_default_peer_environment_is_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BenchError, match=r"\.venv-peers/mlserver/bin/python"):
        launch.peer_python("mlserver")


def test_mlserver_runs_the_inference_workers_asked_for(tmp_path, bundle):
    launch.mlserver(launch.Path(sys.executable), bundle, 1, 3, tmp_path)
    assert json.loads((tmp_path / "settings.json").read_text())["parallel_workers"] == 3


def test_zero_workers_resolve_to_one_per_usable_core_where_memory_holds_them(bundle, monkeypatch):
    monkeypatch.setattr(workers, "usable_cores", lambda: 3)  # affinity within the cgroup quota, as the server counts
    monkeypatch.setattr(workers, "usable_memory", lambda: 1 << 40)
    assert launch.resolved_workers(0, bundle) == 3


def test_zero_workers_resolve_to_as_many_as_memory_holds(bundle, monkeypatch):
    monkeypatch.setattr(workers, "usable_cores", lambda: 4)
    monkeypatch.setattr(workers, "usable_memory", lambda: 2 * workers.WORKER_BASE_BYTES)
    assert launch.resolved_workers(0, bundle) == 1


def test_zero_workers_resolves_in_the_memory_the_servers_compared_share(bundle, monkeypatch):
    monkeypatch.setattr(workers, "usable_cores", lambda: 4)
    hold_workers(monkeypatch, bundle, 4)
    assert launch.resolved_workers(0, bundle, servers=2) == 2


def test_the_memory_per_worker_is_counted_with_the_measured_servers_variables(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_MAX_CONCURRENT_RPCS", "8192")
    measured = workers.worker_bytes(ServedModels.read(bundle).model_bytes, Settings(max_concurrent_rpcs=8192))
    assert launch.memory_per_worker(bundle)[1] == measured


def test_zero_workers_resolve_as_the_measured_server_counts_its_memory(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_MAX_CONCURRENT_RPCS", "8192")
    monkeypatch.setattr(workers, "usable_cores", lambda: 4)
    hold_workers(monkeypatch, bundle, 2, Settings(max_concurrent_rpcs=8192))
    assert launch.resolved_workers(0, bundle) == 2


def log_line(event: str, msg: str) -> str:
    return json.dumps({"level": "INFO", "msg": msg, "event": event}) + "\n"


@pytest.fixture
def readiness(tmp_path, monkeypatch):
    """`all_serving` on a server log in `tmp_path` whose model is ready: (the log, its readiness)."""
    monkeypatch.setattr(launch, "model_ready", lambda model: lambda channel: True)
    log = tmp_path / "server.log"
    log.write_text("")
    return log, launch.all_serving(log, "tiny")


def test_a_supervisor_is_ready_at_its_workers_serving_event_whatever_its_message_says(readiness):
    log, ready = readiness
    log.write_text(log_line(workers.SUPERVISING, "3 workers") + log_line(workers.WORKERS_SERVING, "all 3 up"))
    assert ready(None)


def test_a_supervisor_is_not_ready_before_its_workers_serving_event_whatever_its_lines_say(readiness):
    log, ready = readiness
    log.write_text(log_line(workers.SUPERVISING, "3 workers") + log_line("worker_started", "workers serving on port"))
    assert not ready(None)


def test_a_line_that_is_not_json_is_skipped_even_where_it_says_supervising(readiness):
    log, ready = readiness
    log.write_text("warnings.warn('supervising is deprecated')\n" + log_line("serving", "serving on port 1"))
    assert ready(None)


def test_a_line_written_across_two_polls_is_read_whole(readiness):
    log, ready = readiness
    line = log_line(workers.WORKERS_SERVING, "all 3 up")
    log.write_text(log_line(workers.SUPERVISING, "3 workers") + line[:20])
    ready(None)
    with log.open("a") as file:
        file.write(line[20:])
    assert ready(None)
