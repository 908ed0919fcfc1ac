"""Locust's live figures: the newest complete aggregate row of its growing stats history, as progress lines."""

import subprocess
import sys

from edgedistill.common import settings
from edgedistill.loadtests import live

HEADER = (
    '"Timestamp","User Count","Type","Name","Requests/s","Failures/s","50%","66%","75%","80%","90%","95%","98%",'
    '"99%","99.9%","99.99%","100%","Total Request Count","Total Failure Count","Total Median Response Time",'
    '"Total Average Response Time","Total Min Response Time","Total Max Response Time","Total Average Content Size"\n'
)


def row(second: int, name: str, rps: float, p99: int) -> str:
    return f'{second},4,grpc,"{name}",{rps},0.0,3,3,4,4,5,6,7,{p99},20,20,20,{second * 100},1,3,3.5,1,20,0\n'


def test_no_history_yet_has_no_row(tmp_path):
    assert live.latest(tmp_path / "absent.csv") is None


def test_the_newest_aggregate_row_is_read(tmp_path):
    history = tmp_path / "h.csv"
    history.write_text(
        HEADER + row(1, "Aggregated", 90.0, 9) + row(2, "Classify", 80.0, 8) + row(2, "Aggregated", 100.0, 10)
    )
    assert live.latest(history)["Requests/s"] == "100.0"


def test_a_row_cut_by_a_partial_flush_is_left_out(tmp_path):
    history = tmp_path / "h.csv"
    history.write_text(HEADER + row(1, "Aggregated", 90.0, 9) + row(2, "Aggregated", 100.0, 10)[:40])
    assert live.latest(history)["Requests/s"] == "90.0"


def test_a_long_history_is_read_from_its_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(live, "TAIL_BYTES", 300)
    history = tmp_path / "h.csv"
    history.write_text(HEADER + "".join(row(s, "Aggregated", float(s), 9) for s in range(1, 200)))
    assert live.latest(history)["Requests/s"] == "199.0"


def test_a_running_load_test_reports_its_live_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(settings.PROGRESS_VAR, "lines")
    monkeypatch.setenv(settings.PROGRESS_INTERVAL_VAR, "0.1")
    monkeypatch.setattr(live, "POLL_S", 0.2)
    history = tmp_path / "h.csv"
    history.write_text(HEADER + row(1, "Aggregated", 250.0, 12))
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    assert live.follow(process, history, seconds=1, timeout=30) == 0
    assert "req_s=250.0, failures=1, p50_ms=3, p99_ms=12" in capsys.readouterr().err


def test_a_hung_load_generator_is_killed_at_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(live, "POLL_S", 0.1)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert live.follow(process, tmp_path / "h.csv", seconds=0.5, timeout=0.5) is None
