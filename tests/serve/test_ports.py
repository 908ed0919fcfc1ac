import asyncio
import errno
import socket

import grpc
import pytest
from edgedistill.common.cascade import ServedModels
from edgedistill.serve import ports
from edgedistill.serve.app import _bind, create_server
from edgedistill.serve.ports import reserve_port
from edgedistill.serve.settings import SettingsError
from edgedistill.serve.workers import Supervisor

from tests.serve.conftest import settings_for


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


ipv6_loopback = pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")


def addresses(reservation: ports.Reservation) -> list[str]:
    return sorted(holder.getsockname()[0] for holder in reservation.holders)


@pytest.fixture
def no_ipv6(monkeypatch):
    """Sockets as on a kernel booted with ipv6.disable=1."""
    real = socket.socket

    def socket_without_ipv6(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args, **kwargs)

    monkeypatch.setattr(ports.socket, "socket", socket_without_ipv6)


def test_every_address_on_a_kernel_without_ipv6_binds_every_ipv4_address(no_ipv6):
    with reserve_port("[::]", 0) as held:
        assert addresses(held) == ["0.0.0.0"]


@ipv6_loopback
def test_localhost_is_reserved_on_both_loopback_addresses_as_grpc_binds_it():
    with reserve_port("localhost", 0) as held:
        assert addresses(held) == ["127.0.0.1", "::1"]


@ipv6_loopback
def test_localhost_is_reserved_on_one_port_for_both_addresses():
    with reserve_port("localhost", 0) as held:
        assert len({holder.getsockname()[1] for holder in held.holders}) == 1


def test_localhost_on_a_kernel_without_ipv6_is_reserved_on_ipv4_alone(no_ipv6):
    with reserve_port("localhost", 0) as held:
        assert addresses(held) == ["127.0.0.1"]


@ipv6_loopback
def test_a_port_another_server_holds_on_ipv6_loopback_alone_is_refused_for_localhost():
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as listener:
        listener.bind(("::1", 0))
        listener.listen()
        with pytest.raises(SettingsError, match="cannot bind localhost"):
            reserve_port("localhost", listener.getsockname()[1])


def test_an_address_this_machine_lacks_is_refused():
    with pytest.raises(SettingsError, match="cannot bind 192.0.2.1:0: Cannot assign requested address"):
        reserve_port("192.0.2.1", 0)  # TEST-NET-1: never a local address


def test_a_name_that_does_not_resolve_is_refused():
    with pytest.raises(SettingsError, match="cannot bind nowhere.invalid"):
        reserve_port("nowhere.invalid", 0)


def cut_connection_port(reuseport: bool) -> int:
    """A loopback port that nothing holds, left with a connection in TIME_WAIT on the server's side, as a drain that
    cut its calls leaves one: the listener bound as gRPC binds it (SO_REUSEADDR; SO_REUSEPORT as a worker)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, int(reuseport))
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server closes first: its side waits in TIME_WAIT
            client.recv(1)
    return port


@pytest.mark.parametrize("reuseport", [False, True], ids=["after one process", "after workers"])
def test_a_port_left_with_cut_connections_is_reserved_for_a_restart(reuseport):
    port = cut_connection_port(reuseport)
    with reserve_port("127.0.0.1", port) as held:
        assert held.port == port


def test_a_port_a_listener_holds_as_grpc_binds_it_is_refused():
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with pytest.raises(SettingsError, match="cannot bind"):
            reserve_port("127.0.0.1", listener.getsockname()[1])


def test_a_port_another_supervisor_reserved_is_refused():
    with reserve_port("127.0.0.1", 0) as held, pytest.raises(SettingsError, match="cannot bind"):
        reserve_port("127.0.0.1", held.port)


def test_a_socket_on_every_ipv6_address_takes_ipv4_too_whatever_the_machine_s_default():
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as net.ipv6.bindv6only=1 leaves it
        ports.dual_stack(sock, "::")
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0


@pytest.fixture
def taken_port():
    """A loopback port another server listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


NAMED = {
    "port": "EDGEDISTILL_HOST and EDGEDISTILL_PORT, flags --host and --port",
    "health_port": "EDGEDISTILL_HOST and EDGEDISTILL_HEALTH_PORT, flags --host and --health-port",
}


@pytest.mark.parametrize("field", NAMED)
def test_a_taken_port_is_refused_at_start_naming_its_settings(bundle, taken_port, field):
    async def create():
        return create_server(settings_for(bundle, **{field: taken_port}))

    with pytest.raises(SettingsError, match=NAMED[field]):
        asyncio.run(create())


@pytest.mark.parametrize("field", NAMED)
def test_a_taken_port_is_refused_to_a_supervisor_naming_its_settings(bundle, taken_port, field):
    settings = settings_for(bundle, **{field: taken_port})
    with pytest.raises(SettingsError, match=NAMED[field]):
        Supervisor(settings, [], 2, ServedModels.read(bundle))


@pytest.mark.parametrize("field", NAMED)
def test_a_port_grpc_cannot_bind_is_refused_naming_its_settings(bundle, taken_port, field):
    async def bind():
        return _bind(grpc.aio.server(), settings_for(bundle, **{field: taken_port}), field)

    with pytest.raises(SettingsError, match=NAMED[field]):
        asyncio.run(bind())


def test_a_host_that_does_not_resolve_is_refused_naming_its_settings():
    with pytest.raises(SettingsError, match=NAMED["port"]):
        reserve_port("nowhere.invalid", 0, "port")


def bind_beside(port: int, reuseport: bool) -> None:
    """Bind a listener to loopback `port` as a server of this user would, with SO_REUSEADDR (and SO_REUSEPORT)."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, int(reuseport))
        other.bind(("127.0.0.1", port))


def test_a_reserved_port_is_refused_to_a_server_bound_without_so_reuseport():
    with reserve_port("127.0.0.1", 0) as held, pytest.raises(OSError) as refused:
        bind_beside(held.port, reuseport=False)
    assert refused.value.errno == errno.EADDRINUSE


def test_a_reserved_port_is_shared_with_a_server_of_the_same_user_bound_with_so_reuseport():
    with reserve_port("127.0.0.1", 0) as held:
        bind_beside(held.port, reuseport=True)  # raises where the reservation refuses it
        assert held.port
