"""gRPC's C core writes lines of its own on stderr, not JSON, and at INFO by default: one per failed TLS handshake, a
client's or the server's. Every command keeps it to its errors, unless GRPC_VERBOSITY says otherwise."""

import os
import sys


def quiet_grpc_core() -> None:
    """Only gRPC's errors, unless GRPC_VERBOSITY is set: before gRPC is imported, which reads it, and handed down to
    the server's workers."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def quiet_when_run_as_module() -> None:
    """`quiet_grpc_core` in a `python -m` command: Python imports the module's packages with argv[0] "-m", before
    the module itself imports gRPC."""
    if sys.argv[:1] == ["-m"]:
        quiet_grpc_core()
