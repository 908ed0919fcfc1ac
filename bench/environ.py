"""The environment of the servers a measurement starts: this process's, less the variables the measurement sets itself.

Light on imports: a peer's server reads it (`bench.peers.model`) in an environment of `make peers-setup`, which has
KServe's or MLServer's packages and ONNX Runtime, not the serving extra's gRPC health and reflection.
"""

import os
from collections.abc import Mapping

from edgedistill.common.settings import service_link
from edgedistill.serve.settings import env_name

# The deployed server's metrics address and port and its probes' port, which an operator may export: a measurement
# runs its servers' metrics itself (off, or on a loopback port of its own) and checks their health on the gRPC port, so
# these variables are left out of the servers' environment, where METRICS_HOST with the metrics port off would stop the
# server, and where two servers (a cascade and its last member) would bind one health port
PORT_VARIABLES = (env_name("metrics_host"), env_name("metrics_port"), env_name("health_port"))
# A deployed cascade's overload policy, which a server of a single bundle refuses as doing nothing: left out of the
# environment of a measured single bundle (a cascade's last member alone, a student measured beside it)
CASCADE_VARIABLES = (env_name("cascade_overload"),)


def server_environ(environ: Mapping[str, str] | None = None, left_out: tuple[str, ...] = PORT_VARIABLES) -> dict:
    """The environment of a server a measurement starts: `environ` (default this process's) less `left_out` and less
    Kubernetes service links (`service_link`), which the server would refuse where one lands on a setting's name
    (`EDGEDISTILL_PORT=tcp://...`), though the measurement's flags set those settings."""
    environ = os.environ if environ is None else environ
    return {
        name: value for name, value in environ.items() if name not in left_out and service_link(name, value) is None
    }
