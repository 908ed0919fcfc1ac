"""The environment of the servers a measurement starts (bench.environ)."""

from edgedistill.bench import environ


def test_a_measured_servers_environment_leaves_out_a_kubernetes_service_link_that_sets_a_setting(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_PORT", "tcp://10.0.0.5:50051")
    assert "EDGEDISTILL_PORT" not in environ.server_environ()


def test_a_measured_servers_environment_leaves_out_the_operators_metrics_and_health_ports(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_HEALTH_PORT", "50052")
    assert "EDGEDISTILL_HEALTH_PORT" not in environ.server_environ()
