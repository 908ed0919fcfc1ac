"""The servers a measurement starts (bench.environ): their flags, the settings those give, their environment."""

import pytest
from edgedistill.bench import BenchError, environ
from edgedistill.bench.environ import measured_server, served_settings
from edgedistill.bench.peers.model import session_settings
from edgedistill.bench.ports import free_port
from edgedistill.bench.processes import running
from edgedistill.serve.settings import SettingsError

from tests.serve.conftest import write_engine
from tests.serve.test_cascade import make_cascade


def test_a_measured_servers_environment_leaves_out_a_kubernetes_service_link_that_sets_a_setting(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_PORT", "tcp://10.0.0.5:50051")
    assert "EDGEDISTILL_PORT" not in environ.server_environ()


def test_a_measured_servers_environment_leaves_out_the_operators_metrics_and_health_ports(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_HEALTH_PORT", "50052")
    assert "EDGEDISTILL_HEALTH_PORT" not in environ.server_environ()


def test_a_measured_server_is_one_process_on_loopback(bundle):
    _, settings = measured_server(bundle, 2)
    assert settings.host == "127.0.0.1"
    assert settings.workers == 1
    assert settings.threads == 2


def test_a_measured_server_of_a_tensorrt_engine_is_given_no_threads(tmp_path):
    _, settings = measured_server(write_engine(tmp_path / "engine"), 2)
    assert settings.threads == 0


def test_a_measured_server_given_tls_is_refused_at_once(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_TLS_CERT", "cert.pem")
    monkeypatch.setenv("EDGEDISTILL_TLS_KEY", "key.pem")
    with pytest.raises(BenchError, match="measurements call the server over plaintext"):
        measured_server(bundle, 1)


@pytest.mark.parametrize("variable", ["EDGEDISTILL_THREADS", "EDGEDISTILL_WORKERS", "EDGEDISTILL_PORT"])
def test_a_variable_a_measured_servers_flag_would_override_is_refused_naming_it(bundle, monkeypatch, variable):
    monkeypatch.setenv(variable, "4")
    with pytest.raises(BenchError, match=f"{variable} would do nothing: a measurement sets the server's"):
        measured_server(bundle, 1)


def test_a_measured_server_takes_its_port_over_a_kubernetes_service_link_that_sets_the_ports_variable(
    bundle, monkeypatch
):
    monkeypatch.setenv("EDGEDISTILL_PORT", "tcp://10.0.0.5:50051")  # the link of a Service named `edgedistill`
    flags, settings = measured_server(bundle, 1)
    assert settings.port == int(flags[flags.index("--port") + 1])


def test_a_bundles_session_settings_are_read_past_a_kubernetes_service_link_that_sets_the_port(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_PORT", "tcp://10.0.0.5:50051")  # the benchmark's bare and peer models read these
    assert session_settings(3).threads == 3


# Where an operator exports them for the server they deploy (the Kubernetes manifests' METRICS_HOST)
OPERATORS_METRICS = {"EDGEDISTILL_METRICS_HOST": "0.0.0.0", "EDGEDISTILL_METRICS_PORT": "8002"}


@pytest.fixture
def operators_metrics(monkeypatch):
    """This environment with the operator's metrics variables, whose note is not said yet in this process."""
    for name, value in OPERATORS_METRICS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(environ, "_said", set())


def test_a_measured_server_runs_with_its_metrics_off_where_the_operator_exports_them(bundle, operators_metrics):
    _, settings = measured_server(bundle, 1)
    assert settings.metrics_port is None


def test_a_measured_server_binds_its_metrics_to_loopback_where_the_operator_exports_them(bundle, operators_metrics):
    _, settings = measured_server(bundle, 1)
    assert settings.metrics_host == "127.0.0.1"


def test_the_operators_metrics_variables_change_no_measured_setting(bundle, monkeypatch):
    measured = served_settings(bundle, 1)
    for name, value in OPERATORS_METRICS.items():
        monkeypatch.setenv(name, value)
    assert served_settings(bundle, 1) == measured


def test_the_metrics_variables_left_out_of_the_servers_are_named_once(operators_metrics, tmp_path, capsys):
    for attempt in range(2):
        port = free_port()
        with running("edgedistill.bench.servers", ["--port", str(port)], port, tmp_path / f"echo-{attempt}.log"):
            pass
    err = capsys.readouterr().err
    assert err.count("EDGEDISTILL_METRICS_HOST, EDGEDISTILL_METRICS_PORT left out") == 1


def test_a_variable_left_out_is_named_once_where_another_server_leaves_out_more(operators_metrics, capsys):
    # bench cascade: its last member alone runs without CASCADE_OVERLOAD as well, the cascade with it
    environ.say_left_out(("EDGEDISTILL_METRICS_HOST",))
    environ.say_left_out(("EDGEDISTILL_METRICS_HOST", "EDGEDISTILL_CASCADE_OVERLOAD"))
    assert capsys.readouterr().err.count("EDGEDISTILL_METRICS_HOST") == 1


def test_a_cascades_overload_is_said_to_be_left_out_of_the_single_bundles_alone(operators_metrics, capsys):
    environ.say_left_out(("EDGEDISTILL_CASCADE_OVERLOAD",))
    assert "EDGEDISTILL_CASCADE_OVERLOAD left out of the environment of the single bundles measured here" in (
        capsys.readouterr().err
    )


def test_the_metrics_variables_left_out_are_said_without_the_cascades_reason(operators_metrics, capsys):
    environ.say_left_out(("EDGEDISTILL_METRICS_HOST",))
    assert "cascade" not in capsys.readouterr().err


def test_a_measured_single_bundle_runs_without_a_cascades_overload(bundle):
    assert environ.CASCADE_VARIABLES[0] in environ.left_out_of(environ.serve_flags(bundle, 0, 1))


def test_a_measured_cascade_runs_with_its_overload_setting(tmp_path):
    flags = environ.serve_flags(make_cascade(tmp_path), 0, 1)
    assert environ.CASCADE_VARIABLES[0] not in environ.left_out_of(flags)


def test_a_measured_server_of_one_process_runs_without_a_supervisors_start_timeout(bundle):
    assert "EDGEDISTILL_START_TIMEOUT_S" in environ.left_out_of(environ.serve_flags(bundle, 0, 1, workers=1))


def test_a_measured_server_of_several_workers_runs_with_its_supervisors_start_timeout(bundle):
    assert "EDGEDISTILL_START_TIMEOUT_S" not in environ.left_out_of(environ.serve_flags(bundle, 0, 1, workers=2))


def test_a_start_timeout_is_said_to_be_left_out_of_the_servers_of_one_process(operators_metrics, capsys):
    environ.say_left_out(("EDGEDISTILL_START_TIMEOUT_S",))
    assert "EDGEDISTILL_START_TIMEOUT_S left out of the environment of the one-process servers measured here" in (
        capsys.readouterr().err
    )


def test_a_measured_server_runs_with_the_operators_other_settings(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_MAX_QUEUED", "64")
    left_out = environ.left_out_of(environ.serve_flags(bundle, 0, 1))
    assert environ.server_environ(left_out=left_out)["EDGEDISTILL_MAX_QUEUED"] == "64"


def test_a_blank_token_for_a_measured_server_is_refused_naming_the_variable_alone(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_TOKEN", "")
    with pytest.raises(
        SettingsError,
        match=r"invalid settings: EDGEDISTILL_TOKEN: must not be empty, .*: unset the "
        r"variable to serve without a token$",
    ):
        environ.measured_settings(environ.serve_flags(bundle, 0, 1))
