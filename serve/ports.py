"""A port kept for worker processes: bound with SO_REUSEPORT on every address the workers' gRPC will bind, never
listening, so that a port some other server holds is refused first and, meanwhile, a server bound without SO_REUSEPORT
or run by another user cannot take it (one of this user bound with SO_REUSEPORT, as gRPC binds by default, can)."""

import errno
import socket
from dataclasses import dataclass

from edgedistill.serve.settings import SettingsError, env_name, flag_name, host_port

# gRPC binds `localhost` as both loopback addresses, whatever /etc/hosts maps it to
LOCALHOST = [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
MISSING = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL)  # an address or family this machine lacks, which gRPC passes over
PICK_TRIES = 20  # port 0 on several addresses: a port free on the first may be taken on another
# each port setting: what it is, and the setting of the address it binds to
PORT_SETTINGS = {
    "port": ("the gRPC port", "host"),
    "health_port": ("the health port", "host"),
    "metrics_port": ("the metrics port", "metrics_host"),
}


def unbindable(field: str, host: str, port: int, reason: str) -> SettingsError:
    """The error for the port setting `field`, `port` on `host`, that cannot be bound: named with the variables and
    flags that set both."""
    what, host_field = PORT_SETTINGS[field]
    return SettingsError(
        f"cannot bind {what} {host_port(host, port)} ({env_name(host_field)} and {env_name(field)}, flags "
        f"{flag_name(host_field)} and {flag_name(field)}): {reason}"
    )


def bind_addresses(host: str) -> list[tuple[socket.AddressFamily, str]]:
    """The family and address of each socket gRPC binds for `host`: both loopback addresses for `localhost`, every
    address another name resolves to, one for an address. Every address (`::`, the default host) of a kernel booted
    with ipv6.disable=1 is every IPv4 one, as gRPC binds it."""
    bare = host.strip("[]")
    if bare == "::":
        try:
            socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
        except OSError as err:
            if err.errno == errno.EAFNOSUPPORT:
                return [(socket.AF_INET, "0.0.0.0")]
            raise
        return [(socket.AF_INET6, "::")]
    if bare == "localhost":
        return LOCALHOST
    found = socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return list(dict.fromkeys((family, sockaddr[0]) for family, _, _, _, sockaddr in found))


def dual_stack(sock: socket.socket, address: str) -> None:
    """IPv4 too on IPv6's every address (`::`), as gRPC binds it whatever the machine's `net.ipv6.bindv6only`."""
    if address == "::":
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)


def hold(family: socket.AddressFamily, address: str, port: int) -> socket.socket:
    """A socket bound to `address:port` with SO_REUSEPORT and not listening (a connection only ever goes to a
    listening socket). The port must be free first: with SO_REUSEPORT alone, the workers would share a port some
    other server holds. Port 0 picks a free one.

    Both sockets bind with SO_REUSEADDR, as gRPC binds its listeners: connections a drain cut stay on the port in
    TIME_WAIT for a minute, and without it they would refuse a restart on a port that nothing holds. A listener or
    another supervisor's reservation still refuses them."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:  # refused where anything holds the port
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        dual_stack(probe, address)
        probe.bind((address, port))
        port = probe.getsockname()[1]
    holder = socket.socket(family, socket.SOCK_STREAM)
    try:
        dual_stack(holder, address)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        # TIME_WAIT of a single server's connections (bound without SO_REUSEPORT) lets only SO_REUSEADDR bind
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((address, port))
        # cleared once bound: another supervisor's probe, with SO_REUSEADDR, would bind beside a holder that kept it
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    except OSError:
        holder.close()
        raise
    return holder


@dataclass
class Reservation:
    """One port held on each of a host's addresses."""

    holders: list[socket.socket]

    @property
    def port(self) -> int:
        return self.holders[0].getsockname()[1]

    def close(self) -> None:
        for holder in self.holders:
            holder.close()

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def reserve_port(host: str, port: int, field: str | None = None) -> Reservation:
    """`port` (0: a free one) held on every address of `host` that this machine has; `SettingsError` where another
    server holds it on any of them, where the machine has none of them or where `host` does not resolve, naming the
    port setting `field` (`unbindable`) where given."""

    def refused(reason: str) -> SettingsError:
        if field is None:
            return SettingsError(f"cannot bind {host_port(host, port)}: {reason}")
        return unbindable(field, host, port, reason)

    try:
        addresses = bind_addresses(host)
    except socket.gaierror as err:
        raise refused(err.strerror) from err
    for _ in range(PICK_TRIES if port == 0 else 1):
        holders: list[socket.socket] = []
        missing: OSError | None = None
        try:
            for family, address in addresses:
                try:
                    holders.append(hold(family, address, holders[0].getsockname()[1] if holders else port))
                except OSError as err:
                    if err.errno not in MISSING:
                        raise
                    missing = err
        except OSError as err:
            for holder in holders:
                holder.close()
            if port == 0 and holders and err.errno == errno.EADDRINUSE:
                continue  # the port picked on the first address is taken on another: pick again
            raise refused(err.strerror or str(err)) from err
        if not holders:
            raise refused(missing.strerror or str(missing))
        return Reservation(holders)
    raise refused(f"no port was free on all of {[a for _, a in addresses]}")
