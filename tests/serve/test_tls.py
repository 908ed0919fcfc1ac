"""TLS files read again when they change: a rotated certificate serves new connections without a restart, and a
chain without its key yet leaves the old pair serving; a client certificate's name in the log."""

import logging
import shutil
import signal
import time

import grpc
import pytest
from edgedistill.serve import tls
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc
from edgedistill.serve.settings import SettingsError
from edgedistill.serve.tls import CertificateFiles, check_pem, server_credentials
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serve.conftest import run_openssl, settings_for

SERVING = health_pb2.HealthCheckResponse.SERVING


def status_trusting(server, ca):
    """The health status over a new connection (its own subchannel: a new handshake) that trusts `ca`, else the
    failed call's code."""
    credentials = grpc.ssl_channel_credentials(ca.read_bytes())
    options = [("grpc.use_local_subchannel_pool", 1)]
    with grpc.secure_channel(server.address, credentials, options=options) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        except grpc.RpcError as err:
            return err.code()


@pytest.fixture
def tls_server(start_server, bundle, certs, tmp_path):
    """A server whose certificate and key are copies in `tmp_path`, to be replaced."""
    for suffix in ("pem", "key"):
        shutil.copy(certs / f"server.{suffix}", tmp_path / f"served.{suffix}")
    server = start_server(settings_for(bundle, tls_cert=tmp_path / "served.pem", tls_key=tmp_path / "served.key"))
    assert status_trusting(server, certs / "ca.pem") == SERVING
    return server


def rotate(certs, folder, *suffixes):
    for suffix in suffixes:
        shutil.copy(certs / f"rotated.{suffix}", folder / f"served.{suffix}")


def test_a_rotated_certificate_serves_new_connections(tls_server, certs, tmp_path):
    rotate(certs, tmp_path, "pem", "key")
    assert status_trusting(tls_server, certs / "other-ca.pem") == SERVING


def test_the_replaced_certificate_serves_no_more(tls_server, certs, tmp_path):
    rotate(certs, tmp_path, "pem", "key")
    assert status_trusting(tls_server, certs / "ca.pem") == grpc.StatusCode.UNAVAILABLE


def test_a_rotation_is_logged(tls_server, certs, tmp_path, caplog):
    rotate(certs, tmp_path, "pem", "key")
    with caplog.at_level(logging.INFO, logger="serve"):
        status_trusting(tls_server, certs / "other-ca.pem")
    assert [r for r in caplog.records if getattr(r, "event", None) == "tls_reloaded"]


def test_a_new_chain_without_its_key_leaves_the_old_pair_serving(tls_server, certs, tmp_path):
    rotate(certs, tmp_path, "pem")
    assert status_trusting(tls_server, certs / "ca.pem") == SERVING


def test_the_new_pair_serves_once_its_key_follows(tls_server, certs, tmp_path):
    rotate(certs, tmp_path, "pem")
    status_trusting(tls_server, certs / "ca.pem")
    rotate(certs, tmp_path, "key")
    assert status_trusting(tls_server, certs / "other-ca.pem") == SERVING


def test_a_key_that_is_not_the_certificates_is_refused_at_start(bundle, certs):
    settings = settings_for(bundle, tls_cert=certs / "server.pem", tls_key=certs / "rotated.key")
    with pytest.raises(SettingsError, match="cannot use the TLS files"):
        server_credentials(settings)


def test_an_encrypted_key_is_refused_at_start_naming_what_grpc_takes(bundle, certs, tmp_path):
    run_openssl(
        "rsa", "-in", str(certs / "server.key"), "-aes256", "-passout", "pass:x", "-out", "locked.key", cwd=tmp_path
    )
    settings = settings_for(bundle, tls_cert=certs / "server.pem", tls_key=tmp_path / "locked.key")
    with pytest.raises(SettingsError, match="its key, unencrypted"):
        server_credentials(settings)


def test_a_client_ca_file_without_a_certificate_is_refused_at_start(bundle, certs):
    settings = settings_for(
        bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key", tls_ca=certs / "ca.key"
    )
    with pytest.raises(SettingsError, match="cannot use the TLS files"):
        server_credentials(settings)


def test_a_client_ca_file_without_a_certificate_is_named_at_start(bundle, certs):
    settings = settings_for(
        bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key", tls_ca=certs / "ca.key"
    )
    with pytest.raises(SettingsError, match=f"the CA certificates {certs / 'ca.key'}: "):
        server_credentials(settings)


def test_a_client_ca_file_without_a_certificate_is_named_in_plain_words(bundle, certs):
    settings = settings_for(
        bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key", tls_ca=certs / "ca.key"
    )
    with pytest.raises(SettingsError, match=rf"\): the CA certificates {certs / 'ca.key'}: \[X509"):
        server_credentials(settings)


def test_a_folder_given_as_the_client_ca_file_is_named_at_start(bundle, certs):
    settings = settings_for(bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key", tls_ca=certs)
    with pytest.raises(SettingsError, match=f"the CA certificates {certs}: "):
        server_credentials(settings)


def test_a_key_that_is_not_the_certificates_is_named_with_its_chain_at_start(bundle, certs):
    settings = settings_for(bundle, tls_cert=certs / "server.pem", tls_key=certs / "rotated.key")
    with pytest.raises(SettingsError, match=f"the certificate chain {certs / 'server.pem'} and its key "):
        server_credentials(settings)


def test_a_client_ca_file_rotated_to_no_certificate_is_not_taken(start_server, bundle, certs, tmp_path, caplog):
    shutil.copy(certs / "ca.pem", tmp_path / "clients.pem")
    settings = settings_for(
        bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key", tls_ca=tmp_path / "clients.pem"
    )
    server = start_server(settings)
    shutil.copy(certs / "ca.key", tmp_path / "clients.pem")
    credentials = grpc.ssl_channel_credentials(
        (certs / "ca.pem").read_bytes(), (certs / "client.key").read_bytes(), (certs / "client.pem").read_bytes()
    )
    with caplog.at_level(logging.INFO, logger="serve"), grpc.secure_channel(server.address, credentials) as channel:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert [r.event for r in caplog.records if getattr(r, "event", "").startswith("tls_")] == ["tls_reload_failed"]


def test_a_failed_calls_log_line_names_the_client_certificate(start_server, bundle, certs, caplog):
    settings = settings_for(
        bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key", tls_ca=certs / "ca.pem"
    )
    server = start_server(settings)
    credentials = grpc.ssl_channel_credentials(
        (certs / "ca.pem").read_bytes(), (certs / "client.key").read_bytes(), (certs / "client.pem").read_bytes()
    )
    with (
        caplog.at_level(logging.INFO, logger="serve.access"),
        grpc.secure_channel(server.address, credentials) as channel,
        pytest.raises(grpc.RpcError),
    ):
        classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(), timeout=5)
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == "rpc"]
    assert line.peer.endswith("(client)")


def test_a_key_openssl_s_default_level_finds_too_small_passes_the_files_check(tmp_path):
    run_openssl("req", "-x509", "-newkey", "rsa:1024", "-nodes", "-days", "2", "-subj", "/CN=small",
                "-keyout", "small.key", "-out", "small.pem", cwd=tmp_path)  # fmt: skip
    assert check_pem(tmp_path / "small.pem", tmp_path / "small.key", None) is None


def test_a_failed_handshake_is_logged_by_the_server_in_json_lines_alone(spawn, bundle, certs):
    server = spawn(
        bundle,
        EDGEDISTILL_TLS_CERT=str(certs / "server.pem"),
        EDGEDISTILL_TLS_KEY=str(certs / "server.key"),
        EDGEDISTILL_TLS_CA=str(certs / "ca.pem"),
    )
    port = server.wait_for("serving")["port"]
    credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())  # and no client certificate
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel, pytest.raises(grpc.RpcError):
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    server.proc.send_signal(signal.SIGTERM)
    server.wait(60)
    assert [line["msg"] for line in server.lines if line.get("event") == "unstructured"] == []


@pytest.fixture
def started_without_its_certificate(spawn, bundle, certs, tmp_path):
    """A server process started with a TLS_CERT that does not exist, once it exited."""
    server = spawn(
        bundle, EDGEDISTILL_TLS_CERT=str(tmp_path / "missing.pem"), EDGEDISTILL_TLS_KEY=str(certs / "server.key")
    )
    server.wait(60)
    return server


def test_a_missing_certificate_stops_the_start_with_status_2(started_without_its_certificate):
    assert started_without_its_certificate.proc.returncode == 2


def test_a_missing_certificate_stops_the_start_before_the_model_loads(started_without_its_certificate):
    events = [line.get("event") for line in started_without_its_certificate.lines]
    assert "backend_ready" not in events


@pytest.fixture
def served_files(bundle, certs, tmp_path):
    """The `CertificateFiles` of copies in `tmp_path` of the server's certificate and key, to be replaced."""
    for suffix in ("pem", "key"):
        shutil.copy(certs / f"server.{suffix}", tmp_path / f"served.{suffix}")
    return CertificateFiles(settings_for(bundle, tls_cert=tmp_path / "served.pem", tls_key=tmp_path / "served.key"))


@pytest.fixture
def reads(monkeypatch) -> list:
    """The TLS files' checks from now on, one entry each: a check reads and parses them."""
    made = []
    real = tls.check_pem

    def check_pem(*files):
        made.append(files)
        return real(*files)

    monkeypatch.setattr(tls, "check_pem", check_pem)
    return made


def test_a_rotation_that_cannot_be_used_is_read_once_however_many_handshakes_ask(served_files, reads, certs, tmp_path):
    rotate(certs, tmp_path, "pem")
    for _ in range(100):
        served_files.fetch()
    assert len(reads) == 1


def test_a_rotation_that_could_not_be_used_is_taken_once_its_key_follows(served_files, certs, tmp_path):
    rotate(certs, tmp_path, "pem")
    served_files.fetch()
    rotate(certs, tmp_path, "key")
    assert served_files.fetch() is not None


def test_a_rotation_that_could_not_be_used_is_read_again_once_its_permissions_change(
    served_files, reads, certs, tmp_path
):
    rotate(certs, tmp_path, "pem")
    served_files.fetch()
    time.sleep(0.05)  # a file's change time moves in the kernel's clock ticks, a few ms each
    (tmp_path / "served.key").chmod(0o600)
    served_files.fetch()
    assert len(reads) == 2
