"""Figures from samples: call statistics, CPU, RSS growth, and the notes on a run."""

import dataclasses
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from edgedistill.bench.ports import free_port
from edgedistill.common.config.measure import LoadtestConfig
from edgedistill.loadtests import analysis, result
from edgedistill.loadtests.analysis import Resources, Samples
from edgedistill.loadtests.plan import Plan, Stage
from edgedistill.loadtests.recorder import DUE_KEY, LATE_KEY, NotSent, Recorder
from edgedistill.loadtests.runner import Sampler
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import step


def samples(end_s, ms, ok=None, due_ms=None) -> Samples:
    """Calls of one name; each sent on time unless `due_ms` (latency from the due time) says otherwise."""
    end_s, ms = np.asarray(end_s, float), np.asarray(ms, float)
    due_ms = ms if due_ms is None else np.asarray(due_ms, float)
    ok = np.ones(len(ms), bool) if ok is None else np.asarray(ok, bool)
    codes = np.where(ok, 0, 1).astype(np.int16)
    name = np.zeros(len(ms), np.int16)
    return Samples(end_s, ms, due_ms, ok, name, ["Classify"], codes, ["OK", "UNAVAILABLE"], 0.0)


def failing_run() -> Samples:
    """200 calls returned over 2 s, of 0.01 to 2 ms each; the last (and slowest) 10 failed with UNAVAILABLE."""
    return samples(np.linspace(0, 1.99, 200), np.arange(1, 201) / 100, ok=[True] * 190 + [False] * 10)


def test_call_stats_of_samples_count_their_failed_calls():
    assert analysis.call_stats(failing_run(), 2.0)["failures"] == 10


def test_call_stats_of_samples_time_only_their_successful_calls():
    assert analysis.call_stats(failing_run(), 2.0)["max_ms"] == 1.9  # the slowest successful call


def test_call_stats_of_samples_count_their_failures_by_status_code():
    assert analysis.call_stats(failing_run(), 2.0)["error_codes"] == {"UNAVAILABLE": 10}


@pytest.mark.parametrize("second", [0, 1])
def test_samples_between_two_times_are_the_calls_that_returned_then(second):
    assert len(failing_run().between(second, second + 1).ms) == 100


def test_call_stats_of_no_samples_have_no_percentiles():
    assert analysis.call_stats(samples([], []), 1.0)["p99_ms"] is None


def test_rss_growth_per_10k_requests():
    done = np.arange(0, 100_001, 5_000)
    rss = 100 + 0.5 * done / 10_000
    rss[:4] += np.array([0, 20, 25, 28])  # warm-up growth, left out with the first half
    assert analysis.rss_growth_per_10k(done.tolist(), rss.tolist()) == pytest.approx(0.5)
    assert analysis.rss_growth_per_10k([0, 10, 20, 30], [1, 2, 3, 4]) is None  # too few requests to fit
    assert analysis.rss_growth_per_10k([0, 5000], [1, 2]) is None


def test_cpu_percent_from_cumulative_times():
    rows = [(10.0 + t, 2.0 * t * 0.5, 0.9 * t, 50 * 2**20) for t in np.arange(0, 10.5, 0.5)]
    resources = Resources.from_rows(rows, started=11.0)
    assert resources.cpu_pct("server", 0, 4) == pytest.approx(100.0)
    assert resources.cpu_pct("locust", 0, 9.5) == pytest.approx(90.0)  # clipped to the last sample at 9 s
    assert resources.cpu_pct("locust", 8, 20) is None
    series = resources.series(samples([0.5, 1.2, 3.0], [1, 1, 1]), until=2)
    assert series["t_s"] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert series["requests_done"] == [0, 1, 1, 2, 2]
    assert series["server_cpu_pct"] == [100.0] * 5
    assert series["server_rss_mb"] == [50.0] * 5


def test_recorder_round_trip(tmp_path):
    recorder = Recorder(tmp_path / "requests.npz")
    recorder.on_start()
    recorder.on_request(name="Classify", response_time=1.25, response_length=10, exception=None)
    recorder.on_request(name="ModelInfer", response_time=3.5, response_length=0, exception=RuntimeError("NOT_FOUND"))
    recorder.on_quitting()
    loaded = Samples.load(tmp_path / "requests.npz")
    assert loaded.ms.tolist() == [1.25, 3.5]
    assert loaded.ok.tolist() == [True, False]
    assert [loaded.names[i] for i in loaded.name] == ["Classify", "ModelInfer"]
    assert 0 <= loaded.end_s[0] <= loaded.end_s[1] < 5
    assert loaded.started > 0


def test_recorder_keeps_each_calls_latency_from_its_due_time(tmp_path):
    recorder = Recorder(tmp_path / "requests.npz")
    recorder.on_start()
    recorder.on_request(name="Classify", response_time=1.25, exception=None, context={LATE_KEY: 40.0})
    recorder.on_request(name="Classify", response_time=2.0, exception=None, context={})
    recorder.on_quitting()
    assert Samples.load(tmp_path / "requests.npz").due_ms.tolist() == [41.25, 2.0]


def test_recorder_keeps_when_each_paced_call_was_due(tmp_path):
    recorder = Recorder(tmp_path / "requests.npz")
    recorder.on_start()
    recorder.on_request(name="Classify", response_time=1.0, exception=None, context={DUE_KEY: time.perf_counter() + 2})
    recorder.on_quitting()
    assert Samples.load(tmp_path / "requests.npz").due_s[0] == pytest.approx(2.0, abs=0.01)


def test_recorder_keeps_no_due_time_for_a_call_of_no_schedule(tmp_path):
    recorder = Recorder(tmp_path / "requests.npz")
    recorder.on_start()
    recorder.on_request(name="Classify", response_time=1.0, exception=None, context={})
    recorder.on_quitting()
    assert np.isnan(Samples.load(tmp_path / "requests.npz").due_s[0])


def test_calls_due_before_an_end_are_taken_by_their_recorded_due_time():
    # returned 2 ms after the end less their latency from the due time (1 ms): due 1 ms after the end by that
    # reckoning, but recorded as due just before it; the second call has no recorded due time
    run = dataclasses.replace(samples([1.002, 1.002], [1.0, 1.0]), due_s=np.array([0.9999, np.nan]))
    assert run.due_before(1.0).end_s.size == 1


def test_call_stats_time_calls_sent_late_from_their_due_time():
    stats = analysis.call_stats(samples([0.1, 0.2, 0.3, 0.4], [1.0] * 4, due_ms=[1.0, 1.0, 31.0, 11.0]), 1.0)
    assert (stats["max_ms"], stats["max_from_due_ms"], stats["late_calls"]) == (1.0, 31.0, 2)


STEPPED_BACK = 1.0e9 - 3600.0  # the wall clock an hour behind where it stood at the start: an NTP step


def test_a_wall_clock_stepped_during_the_load_moves_no_call(tmp_path, monkeypatch):
    recorder = Recorder(tmp_path / "requests.npz")
    monkeypatch.setattr(time, "time", lambda: 1.0e9)
    recorder.on_start()
    monkeypatch.setattr(time, "time", lambda: STEPPED_BACK)
    recorder.on_request(name="Classify", response_time=1.0, exception=None)
    recorder.on_quitting()
    assert 0 <= Samples.load(tmp_path / "requests.npz").end_s[0] < 5


def test_process_samples_are_on_the_recorders_clock_whatever_the_wall_clock(monkeypatch):
    recorder = Recorder("unused.npz")
    monkeypatch.setattr(time, "time", lambda: 1.0e9)
    recorder.on_start()
    monkeypatch.setattr(time, "time", lambda: STEPPED_BACK)
    sampler = Sampler(psutil.Process(), psutil.Process())
    sampler.start()
    rows = sampler.stop()
    assert 0 <= Resources.from_rows(rows, recorder.started).t_s[0] < 5


def test_failures_are_counted_by_grpc_status(tmp_path):
    with grpc.insecure_channel(f"127.0.0.1:{free_port()}") as channel:  # nothing listens there
        refused = health_pb2_grpc.HealthStub(channel).Check.future(health_pb2.HealthCheckRequest(), timeout=5)
        unavailable = refused.exception()
    recorder = Recorder(tmp_path / "requests.npz")
    recorder.on_start()
    recorder.on_request(name="Classify", response_time=1.0, exception=None)
    recorder.on_request(name="Classify", response_time=1.0, exception=unavailable)
    recorder.on_request(name="Classify", response_time=1.0, exception=unavailable)
    recorder.on_request(name="Classify", response_time=1.0, exception=RuntimeError("a task's bug"))
    recorder.on_quitting()
    stats = analysis.call_stats(Samples.load(tmp_path / "requests.npz"), 1.0)
    assert stats["error_codes"] == {"UNAVAILABLE": 2, "RuntimeError": 1}
    assert result.failures_line(stats) == "failed calls by status: UNAVAILABLE 2, RuntimeError 1"


@pytest.fixture
def unsent_at_the_end(tmp_path) -> Samples:
    """97 calls answered in 1 ms, one refused, then 3 calls due that their user never sent, due 500, 400 and 300 ms
    before it stopped (as `loadtests.pacing` reports them)."""
    recorder = Recorder(tmp_path / "requests.npz")
    recorder.on_start()
    for _ in range(97):
        recorder.on_request(name="Classify", response_time=1.0, exception=None)
    recorder.on_request(name="Classify", response_time=1.0, exception=RuntimeError("refused"))
    for late in (500.0, 400.0, 300.0):
        recorder.on_request(name="not sent", response_time=0.0, exception=NotSent(), context={LATE_KEY: late})
    recorder.on_quitting()
    return Samples.load(tmp_path / "requests.npz")


def test_calls_due_but_unsent_are_counted_as_unsent(unsent_at_the_end):
    assert analysis.call_stats(unsent_at_the_end, 1.0)["unsent_calls"] == 3


def test_calls_due_but_unsent_are_not_requests(unsent_at_the_end):
    assert analysis.call_stats(unsent_at_the_end, 1.0)["requests"] == 98


def test_calls_due_but_unsent_are_not_failures(unsent_at_the_end):
    stats = analysis.call_stats(unsent_at_the_end, 1.0)
    assert (stats["failures"], stats["error_codes"]) == (1, {"RuntimeError": 1})


def test_calls_due_but_unsent_lower_the_rate_share(unsent_at_the_end):
    assert analysis.call_stats(unsent_at_the_end, 1.0, offered_rate=101)["rate_share"] == 97 / 101


def test_calls_due_but_unsent_count_in_the_latencies_from_the_due_time_until_their_user_stopped(unsent_at_the_end):
    # 97 calls of 1 ms and the unsent ones, 300, 400 and 500 ms: the 99th percentile is the 99th of the 100 calls
    assert analysis.call_stats(unsent_at_the_end, 1.0)["p99_from_due_ms"] == 400


def test_calls_due_but_unsent_are_not_failures_in_the_series(unsent_at_the_end):
    stages = [Stage(name="constant", start_s=0.0, end_s=1.0, users=1, offered_rate=101.0)]
    assert analysis.per_second(unsent_at_the_end, stages)["failures_per_s"] == [1]


def test_calls_due_but_unsent_are_not_requests_done(unsent_at_the_end):
    resources = Resources.from_rows([(t, 0.0, 0.0, 0.0) for t in (-1.0, 5.0)], started=0.0)
    assert resources.series(unsent_at_the_end, until=5)["requests_done"] == [98]


def test_samples_saved_without_statuses_still_load(tmp_path):
    columns = {"end_s": [0.1, 0.2], "ms": [1.0, 2.0], "ok": [True, False], "name": np.zeros(2, np.int16)}
    np.savez(tmp_path / "requests.npz", started=1.0, names=["Classify"], **columns)
    loaded = Samples.load(tmp_path / "requests.npz")
    assert loaded.error_codes() == {"unknown": 1}


def test_samples_saved_without_due_times_time_every_call_from_its_send(tmp_path):
    columns = {"end_s": [0.1, 0.2], "ms": [1.0, 2.0], "ok": [True, True], "name": np.zeros(2, np.int16)}
    np.savez(tmp_path / "requests.npz", started=1.0, names=["Classify"], **columns)
    assert Samples.load(tmp_path / "requests.npz").due_ms.tolist() == [1.0, 2.0]


def test_notes_say_when_the_load_generator_is_the_limit():
    stages = [
        step(200, 1.0) | {"name": "step 1", "generator_bound": False, "p99_from_due_ms": 1.0},
        step(400, 2.0) | {"name": "step 2", "generator_bound": False, "p99_from_due_ms": 2.0},
        step(500, 9.0) | {"name": "step 3", "generator_bound": True, "p99_from_due_ms": 9.5},
    ]
    notes = result.notes_for(stages, stages[1], "step")
    assert notes[0].startswith("locust used >= 90 % of its core in step 3")
    assert notes[1] == "the step past capacity was generator-bound: capacity is a lower bound"
    assert result.notes_for(stages[:2], stages[1], "step") == [
        "the last step met the SLO: capacity is a lower bound (add steps)"
    ]
    assert result.notes_for(stages[2:], None, "step")[1].startswith(
        "no step met the SLO; the lowest p99 from the due time was 9.50 ms"
    )


def test_latencies_by_name_keep_the_successful_calls_of_each_name(tmp_path):
    recorder = Recorder(tmp_path / "requests.npz")
    recorder.on_start()
    recorder.on_request(name="Classify", response_time=1.25, exception=None)
    recorder.on_request(name="Classify", response_time=9.0, exception=RuntimeError("UNAVAILABLE"))
    recorder.on_request(name="ModelInfer", response_time=3.5, exception=RuntimeError("NOT_FOUND"))
    recorder.on_quitting()
    by_name = Samples.load(tmp_path / "requests.npz").latencies_by_name()
    assert {name: ms.tolist() for name, ms in by_name.items()} == {"Classify": [1.25]}


SPIKE_PLAN = Plan(
    profile="spike",
    loadtest=LoadtestConfig(spike={"users": 1, "spike_users": 2, "user_rate": 1, "before_s": 2, "spike_s": 2}),
    scenarios={"single": 1},
    model="m",
    texts=Path("texts.txt"),
    samples=Path("requests.npz"),
)


def build_spike(run: Samples) -> dict:
    """The result of `run` under SPIKE_PLAN, its processes sampled until 3 s past the end."""
    end = SPIKE_PLAN.duration_s
    resources = Resources.from_rows([(t, 0.0, 0.0, 0.0) for t in np.arange(0, end + 3, 0.5)], started=0.0)
    return result.build(SPIKE_PLAN, run, resources, task_errors=0, context={})


def test_calls_that_return_after_the_schedule_ends_count_overall_by_name_and_in_the_last_stage():
    end = SPIKE_PLAN.duration_s
    # the last two started 0.1 s and 0.5 s before the end
    built = build_spike(samples([1.0, end + 0.5, end + 2], [1.0, 600.0, 2500.0], ok=[True, True, False]))
    assert built["overall"]["requests"] == 3
    assert built["overall"]["failures"] == 1
    assert built["by_name"]["Classify"]["failures"] == 1
    assert built["stages"][-1]["requests"] == 2
    assert built["overall"]["requests_per_s"] == 2 / end  # over the schedule's seconds


def test_calls_started_after_the_schedule_ends_count_nowhere():
    end = SPIKE_PLAN.duration_s
    built = build_spike(samples([1.0, end + 0.5, end + 0.9], [1.0, 600.0, 5.0]))  # the last started 0.895 s after
    assert built["overall"]["requests"] == 2
    assert built["by_name"]["Classify"]["requests"] == 2
    assert built["stages"][-1]["requests"] == 1
    assert built["series"]["requests_per_s"][-1] == 1


def test_a_missed_latency_check_is_named_by_the_figure_from_the_due_time_it_read():
    steady = {"users": 1, "rate": 10, "duration_s": 2, "slo": {"p99_ms": 3}}
    plan = SPIKE_PLAN.model_copy(update={"profile": "steady", "loadtest": LoadtestConfig(steady=steady)})
    # 20 calls answered in 1 ms, the last two sent 19 ms late behind a slow one: a p99 of 1 ms from the send
    run = samples(np.linspace(0.1, 1.9, 20), [1.0] * 20, due_ms=[1.0] * 18 + [20.0] * 2)
    resources = Resources.from_rows([(t, 0.0, 0.0, 0.0) for t in np.arange(0, 5, 0.5)], started=0.0)
    built = result.build(plan, run, resources, task_errors=0, context={})
    assert [c["name"] for c in built["checks"] if not c["passed"]] == ["p99_from_due_ms"]


def test_a_last_second_the_schedule_ends_inside_gives_its_rates_over_the_part_scheduled():
    stages = [Stage(name="constant", start_s=0.0, end_s=2.5, users=1, offered_rate=2.0)]
    series = analysis.per_second(samples([0.2, 0.7, 1.2, 1.7, 2.2], [1.0] * 5), stages)
    assert series["requests_per_s"] == [2, 2, 2.0]


def test_a_second_in_which_the_users_change_gives_their_mean_over_it():
    stages = [
        Stage(name="base", start_s=0.0, end_s=2.5, users=10, offered_rate=1.0),
        Stage(name="spike", start_s=2.5, end_s=4.0, users=50, offered_rate=5.0),
    ]
    assert analysis.per_second(samples([0.5, 1.5, 2.5, 3.5], [1.0] * 4), stages)["users"] == [10, 10, 30, 50]


def test_a_mean_of_users_that_rounds_to_a_whole_number_is_a_whole_number():
    stages = [
        Stage(name="base", start_s=0.0, end_s=2 + 1 / 3, users=10, offered_rate=1.0),
        Stage(name="spike", start_s=2 + 1 / 3, end_s=3.0, users=40, offered_rate=4.0),
    ]
    users = analysis.per_second(samples([0.5, 1.5, 2.5], [1.0] * 3), stages)["users"]
    assert [(count, type(count)) for count in users] == [(10, int), (10, int), (30, int)]


def test_calls_that_return_after_the_schedule_ends_count_in_the_last_second_of_the_series():
    stages = [Stage(name="constant", start_s=0.0, end_s=3.0, users=1, offered_rate=1.0)]
    series = analysis.per_second(samples([0.5, 1.5, 2.5, 3.5, 5.0], [1.0] * 5), stages)
    assert series["requests_per_s"] == [1, 1, 3]
