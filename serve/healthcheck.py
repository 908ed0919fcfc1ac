"""The container's health check, `python -m edgedistill.serve.healthcheck`: exit 0 while the server on this machine
reports SERVING, 1 otherwise, saying why. It reads the server's settings from the same `EDGEDISTILL_*` variables (flags
given to the server are not seen) and asks where the server answers health checks in plaintext: HEALTH_PORT, else
(unset, off or 0) the gRPC port.
"""

import sys

import grpc
from edgedistill.serve.settings import DIRECT, Settings, SettingsError, env_name, host_port, load_settings
from grpc_health.v1 import health_pb2, health_pb2_grpc

CHECK_TIMEOUT_S = 3.0  # within the HEALTHCHECK's own timeout (5 s), with the interpreter's start
ANY_ADDRESS = ("[::]", "::", "0.0.0.0")  # a host binding every interface, reached here on localhost


def health_address(settings: Settings) -> str:
    """`host:port` where the server of `settings` answers health checks in plaintext; `SettingsError` where it cannot
    be known (a port chosen at start) or spoken to (TLS on the gRPC port)."""
    host = "localhost" if settings.host in ANY_ADDRESS else settings.host
    if settings.health_port:
        return host_port(host, settings.health_port)
    own_port = f"set {env_name('health_port')} to a port of its own"
    if settings.port == 0:
        raise SettingsError(f"{chosen_at_start(settings)}: {own_port}")
    if settings.tls_cert is not None:
        chosen = f"{chosen_at_start(settings)}, and " if settings.health_port == 0 else ""
        raise SettingsError(
            f"{chosen}the gRPC port uses TLS ({env_name('tls_cert')}), and the health check speaks plaintext: "
            f"{own_port}"
        )
    return host_port(host, settings.port)


def chosen_at_start(settings: Settings) -> str:
    """That the ports of `settings` set to 0 (PORT, HEALTH_PORT, at least one) take any free port, unknown here."""
    zeros = [f"{env_name(name)}=0" for name in ("port", "health_port") if getattr(settings, name) == 0]
    takes = "take" if len(zeros) > 1 else "takes"
    return f"{' and '.join(zeros)} {takes} any free port, which the health check cannot know"


def main() -> int:
    try:
        address = health_address(load_settings([]))
    except SettingsError as err:
        print(f"healthcheck: {err}", file=sys.stderr)
        return 1
    with grpc.insecure_channel(address, options=DIRECT) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=CHECK_TIMEOUT_S)
        except grpc.RpcError as err:
            print(f"healthcheck: {address}: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(
            f"healthcheck: {address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
