"""Progress: a tqdm bar on a terminal, a plain status line at the configured interval in a log, silence when off."""

import io
import os
import pty
import sys
import time

import pytest
from edgedistill.common import progress, settings
from edgedistill.common.progress import StatusLines
from edgedistill.serve.settings import load_settings
from tqdm import tqdm


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


def lines_of(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_a_log_gets_no_line_before_the_interval(clock, capsys):
    counter = StatusLines(100, "train", "step", 0, every=30, clock=clock)
    clock.now = 29
    counter.update()
    assert lines_of(capsys) == []


def test_a_log_gets_one_line_per_interval(clock, capsys):
    counter = StatusLines(100, "train", "step", 0, every=30, clock=clock)
    for _ in range(90):
        clock.now += 1
        counter.update()
    assert len(lines_of(capsys)) == 3


def test_the_status_line_holds_done_total_rate_and_postfix(clock, capsys):
    counter = StatusLines(100, "train", "step", 0, every=30, clock=clock)
    clock.now = 30
    counter.set_postfix(loss="0.4000", refresh=False)
    counter.update(60)
    assert lines_of(capsys) == ["[train] 60/100 step (60%), 2 step/s, 0:30 elapsed, 0:20 left, loss=0.4000"]


def test_the_rate_counts_only_this_runs_work(clock, capsys):
    counter = StatusLines(100, "train", "step", 40, every=10, clock=clock)
    clock.now = 10
    counter.update(20)
    assert "2 step/s" in capsys.readouterr().err


def test_an_open_ended_count_has_no_share_or_time_left(clock, capsys):
    counter = StatusLines(None, "label", "sent", 0, every=10, clock=clock)
    clock.now = 10
    counter.update(50)
    assert lines_of(capsys) == ["[label] 50 sent, 5 sent/s, 0:10 elapsed"]


@pytest.fixture
def million_lines_read(clock, capsys) -> str:
    """The status line of 1,234,567 of 2,000,000 lines read in 40 s."""
    counter = StatusLines(2_000_000, "read", "line", 0, every=40, clock=clock)
    clock.now = 40
    counter.update(1_234_567)
    return capsys.readouterr().err


def test_a_count_past_a_million_is_whole_with_thousands_separators(million_lines_read):
    assert million_lines_read.startswith("[read] 1,234,567/2,000,000 line (62%), ")


def test_a_rate_past_a_thousand_per_second_is_whole_with_thousands_separators(million_lines_read):
    assert ", 30,864 line/s, " in million_lines_read


def test_a_rate_below_a_hundred_per_second_keeps_three_figures(clock, capsys):
    counter = StatusLines(None, "train", "step", 0, every=30, clock=clock)
    clock.now = 30
    counter.update(100)
    assert ", 3.33 step/s, " in capsys.readouterr().err


@pytest.fixture
def logged(monkeypatch, capsys) -> str:
    """What a counter of three steps, 20 ms apart, writes where stderr is not a terminal, with lines every 10 ms."""
    monkeypatch.delenv(settings.PROGRESS_VAR, raising=False)
    monkeypatch.setenv(settings.PROGRESS_INTERVAL_VAR, "0.01")
    counter = progress.bar(3, desc="train", unit="step")
    for _ in range(3):
        time.sleep(0.02)
        counter.set_postfix(loss="0.1", refresh=False)
        counter.update()
    counter.close()
    return capsys.readouterr().err


def test_a_log_gets_a_status_line_at_each_interval(logged):
    assert [line.split(",")[0] for line in logged.splitlines()] == [
        "[train] 1/3 step (33%)",
        "[train] 2/3 step (67%)",
        "[train] 3/3 step (100%)",
    ]


def test_a_log_gets_no_carriage_return_frames(logged):
    assert "\r" not in logged


def test_off_silences_the_status_lines(monkeypatch, capsys):
    monkeypatch.setenv(settings.PROGRESS_VAR, "off")
    monkeypatch.setenv(settings.PROGRESS_INTERVAL_VAR, "0.000001")
    counter = progress.bar(3, desc="train")
    counter.update(3)
    counter.close()
    assert capsys.readouterr().err == ""


def test_a_disabled_counter_is_silent_whatever_the_mode(monkeypatch, capsys):
    monkeypatch.setenv(settings.PROGRESS_VAR, "lines")
    monkeypatch.setenv(settings.PROGRESS_INTERVAL_VAR, "0.000001")
    counter = progress.bar(3, desc="train", enabled=False)
    counter.update(3)
    assert capsys.readouterr().err == ""


def test_a_terminal_gets_a_tqdm_bar(monkeypatch):
    monkeypatch.delenv(settings.PROGRESS_VAR, raising=False)
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        counter = progress.bar(3, desc="train")
        counter.close()
    os.close(leader)
    assert isinstance(counter, tqdm)


def test_the_bar_mode_draws_frames_with_carriage_returns(monkeypatch):
    monkeypatch.setenv(settings.PROGRESS_VAR, "bar")
    drawn = io.StringIO()
    monkeypatch.setattr(sys, "stderr", drawn)
    with progress.bar(3, desc="train") as counter:
        counter.update(3)
    assert "\r" in drawn.getvalue()


def test_messages_print_in_every_mode(monkeypatch, capsys):
    monkeypatch.setenv(settings.PROGRESS_VAR, "off")
    progress.write("[train] step 10: score=0.5")
    assert capsys.readouterr().out == "[train] step 10: score=0.5\n"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (settings.PROGRESS_VAR, "loud"),
        (settings.PROGRESS_INTERVAL_VAR, "-1"),
        (settings.PROGRESS_INTERVAL_VAR, "nan"),
        (settings.PROGRESS_INTERVAL_VAR, "inf"),
        (settings.PROGRESS_INTERVAL_VAR, "1e400"),
    ],
)
def test_a_bad_setting_names_the_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        progress.bar(3)


def test_an_empty_progress_setting_is_its_default(monkeypatch):
    monkeypatch.setenv(settings.PROGRESS_VAR, "")
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False)
    assert progress.mode() == "lines"


def test_an_empty_progress_interval_is_its_default(monkeypatch):
    monkeypatch.setenv(settings.PROGRESS_INTERVAL_VAR, "")
    assert progress.interval() == progress.DEFAULT_INTERVAL_S


def test_the_server_leaves_the_progress_settings_to_the_pipeline():
    environ = {settings.PROGRESS_VAR: "off", settings.PROGRESS_INTERVAL_VAR: "5"}
    assert load_settings([], environ=environ).port > 0
