"""deploy/container-test.sh's own Python, read from the script: the host's read of the container's /metrics."""

import http.server
import os
import subprocess
import sys
import threading

import pytest
from edgedistill.bench.ports import free_port

from tests.conftest import ROOT

COUNTED = b'edgedistill_requests_total{method="Classify",code="OK"} 1.0\n'


def metrics_check() -> str:
    """The Python the script runs on the host to see the Classify call counted in /metrics."""
    script = (ROOT / "deploy" / "container-test.sh").read_text()
    after = script.split("<<'EOF' || fail \"/metrics does not count the Classify call\"\n", 1)[1]
    return after.split("\nEOF\n", 1)[0]


@pytest.fixture
def metrics_url():
    """A /metrics page on loopback that counts one Classify call."""

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(COUNTED)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


def test_the_hosts_read_of_the_metrics_goes_past_a_proxy_of_the_environment(metrics_url):
    env = {**os.environ, "http_proxy": f"http://127.0.0.1:{free_port()}"}
    result = subprocess.run(
        [sys.executable, "-c", metrics_check(), metrics_url], env=env, capture_output=True, timeout=30
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
