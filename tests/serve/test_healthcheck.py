"""Where the container's health check asks: the server's health port, else its gRPC port, on the host it binds, and
straight there, past any proxy of the environment."""

import pytest
from edgedistill.bench.ports import free_port
from edgedistill.serve.healthcheck import health_address, main
from edgedistill.serve.settings import Settings, SettingsError


def test_the_health_port_is_asked_where_set():
    assert health_address(Settings(health_port=50052)) == "localhost:50052"


def test_the_grpc_port_is_asked_without_a_health_port():
    assert health_address(Settings(port=6000)) == "localhost:6000"


def test_a_server_on_one_address_is_asked_there():
    assert health_address(Settings(host="127.0.0.1", port=6000)) == "127.0.0.1:6000"


def test_a_server_on_an_ipv6_address_written_without_brackets_is_asked_there():
    assert health_address(Settings(host="::1", port=6000)) == "[::1]:6000"


def test_a_grpc_port_chosen_at_start_without_a_health_port_names_the_health_port_setting():
    with pytest.raises(SettingsError, match="set EDGEDISTILL_HEALTH_PORT"):
        health_address(Settings(port=0))


def test_both_ports_chosen_at_start_are_named_as_ones_the_check_cannot_know():
    with pytest.raises(SettingsError, match="EDGEDISTILL_PORT=0 and EDGEDISTILL_HEALTH_PORT=0 take any free port"):
        health_address(Settings(port=0, health_port=0))


def test_a_health_port_chosen_at_start_beside_tls_is_refused_as_one_the_check_cannot_know(tmp_path):
    with pytest.raises(SettingsError, match="EDGEDISTILL_HEALTH_PORT=0 takes any free port, which the health check"):
        health_address(Settings(health_port=0, tls_cert=tmp_path / "cert.pem", tls_key=tmp_path / "key.pem"))


def test_tls_on_the_grpc_port_without_a_health_port_names_the_health_port_setting(tmp_path):
    with pytest.raises(SettingsError, match="set EDGEDISTILL_HEALTH_PORT"):
        health_address(Settings(tls_cert=tmp_path / "cert.pem", tls_key=tmp_path / "key.pem"))


def test_a_proxy_in_the_containers_environment_is_not_asked(served, monkeypatch):
    # Docker copies its client's proxy settings into each container as http_proxy, which gRPC would take for this
    # call to the server's own port: the check would fail on a server that serves.
    monkeypatch.setenv("EDGEDISTILL_HOST", "127.0.0.1")
    monkeypatch.setenv("EDGEDISTILL_PORT", str(served.port))
    monkeypatch.setenv("EDGEDISTILL_HEALTH_PORT", "off")
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    assert main() == 0


def test_an_empty_host_is_refused_naming_its_variable_not_asked_on_every_interface(monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_HOST", "")
    main()
    assert "EDGEDISTILL_HOST: must not be empty" in capsys.readouterr().err
