"""`python deploy/wait_serving.py ADDRESS SECONDS [PID]`: exit 0 once the gRPC health service at ADDRESS says
SERVING, 1 if it does not within SECONDS; with PID, 1 as soon as that process is gone."""

import sys
from functools import partial

from edgedistill.common.processes import alive
from edgedistill.serve.client import wait_ready

address, window = sys.argv[1], float(sys.argv[2])
running = partial(alive, int(sys.argv[3])) if len(sys.argv) > 3 else lambda: True
sys.exit(0 if wait_ready(address, window, running=running) else 1)
