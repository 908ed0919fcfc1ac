"""deploy/container-test.sh: its own Python, read from the script (the host's read of the container's /metrics), and
its checks of its settings, which it makes before it needs podman."""

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


def test_a_pip_cert_naming_no_file_fails_naming_it(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")  # a bundle folder, as far as the script looks before it builds
    env = {**os.environ, "PIP_CERT": str(tmp_path / "ca-certificate.crt")}  # a typo: no such file
    script = ROOT / "deploy" / "container-test.sh"
    result = subprocess.run(["bash", script, tmp_path], env=env, capture_output=True, text=True, timeout=60)
    assert f"FAIL: PIP_CERT={tmp_path / 'ca-certificate.crt'} is not a file" in result.stderr
