"""`python deploy/wait_serving.py ADDRESS SECONDS [PID]`: exit 0 once the gRPC health service at ADDRESS says
SERVING, 1 if it does not within SECONDS; with PID, stop with an error as soon as that process is gone."""

import os
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

address, window = sys.argv[1], float(sys.argv[2])
pid = int(sys.argv[3]) if len(sys.argv) > 3 else None
deadline = time.monotonic() + window
with grpc.insecure_channel(address) as channel:
    stub = health_pb2_grpc.HealthStub(channel)
    while time.monotonic() < deadline:
        if pid is not None:
            os.kill(pid, 0)  # the server still runs
        try:
            if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                sys.exit(0)
        except grpc.RpcError:
            pass
        time.sleep(0.2)
sys.exit(1)
