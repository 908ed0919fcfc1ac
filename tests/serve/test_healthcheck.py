"""Where the container's health check asks: the server's health port, else its gRPC port, on the host it binds."""

import pytest
from edgedistill.serve.healthcheck import health_address
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


def test_tls_on_the_grpc_port_without_a_health_port_names_the_health_port_setting(tmp_path):
    with pytest.raises(SettingsError, match="set EDGEDISTILL_HEALTH_PORT"):
        health_address(Settings(tls_cert=tmp_path / "cert.pem", tls_key=tmp_path / "key.pem"))
