"""The scaling benchmark: the worker counts it measures, the ratios to the first count, and a whole run."""

import os
from pathlib import Path

import pytest
from edgedistill.bench import BenchError, scaling
from edgedistill.bench.__main__ import checked_targets, main
from edgedistill.bench.records import ServingResult, Spread
from edgedistill.common.config.measure import ScalingBenchConfig
from edgedistill.serve import workers
from edgedistill.serve.settings import Settings

from tests.bench.conftest import hold_workers
from tests.bench.test_h2load import needs_h2load
from tests.serve.conftest import ROOT

SMOKE = ROOT / "recipes" / "smoke.yaml"


def test_zero_workers_resolves_as_the_server_does_and_repeats_are_dropped(bundle, monkeypatch):
    monkeypatch.setattr(workers, "usable_cores", lambda: 4)
    assert scaling.worker_counts([1, 4, 0, 2], bundle) == [1, 4, 2]


def test_zero_workers_resolves_in_the_memory_the_other_counts_leave(bundle, monkeypatch):
    monkeypatch.setattr(workers, "usable_cores", lambda: 4)
    hold_workers(monkeypatch, bundle, 6)
    assert scaling.worker_counts([1, 2, 0], bundle) == [1, 2, 3]


def test_zero_workers_resolves_as_the_measured_server_counts_its_memory(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_MAX_CONCURRENT_RPCS", "8192")
    monkeypatch.setattr(workers, "usable_cores", lambda: 4)
    hold_workers(monkeypatch, bundle, 3, Settings(max_concurrent_rpcs=8192))
    assert scaling.worker_counts([1, 0], bundle) == [1, 2]


def test_counts_whose_workers_memory_cannot_hold_together_are_a_bench_error(bundle, monkeypatch):
    hold_workers(monkeypatch, bundle, 5)
    with pytest.raises(BenchError, match=r"6 workers in all, and the usable memory .* holds 5"):
        scaling.worker_counts([2, 4], bundle)


def test_fewer_than_two_counts_is_a_bench_error(bundle, monkeypatch):
    monkeypatch.setattr(workers, "usable_cores", lambda: 1)
    with pytest.raises(BenchError, match="two counts"):
        scaling.worker_counts([1, 0], bundle)


def summary(
    capacity: dict[int, float],
    p99: dict[int, float],
    failed: dict[int, int] | None = None,
    share: dict[int, float] | None = None,
) -> dict:
    """Each count's medians, its paced phase with the `failed` calls and the `share` of the calls due answered of a
    repeat (default none failed, all answered)."""
    figures = {}
    for count in capacity:
        figures[f"{count} capacity"] = {"requests_per_s": Spread.of([capacity[count]])}
        figures[f"{count} paced"] = {
            "p99_ms": Spread.of([p99[count]]),
            "failures": Spread.of([0, (failed or {}).get(count, 0)]),
            "rate_share": Spread.of([1.0, (share or {}).get(count, 1.0)]),
        }
    return figures


CAPACITY = {1: 1000.0, 2: 1900.0, 16: 9000.0}
P99 = {1: 4.0, 2: 3.0, 16: 5.0}


def test_a_count_whose_every_call_failed_is_refused_naming_it():
    with pytest.raises(BenchError, match=r"no call succeeded in the median repeat of 1 capacity: nothing to compare"):
        scaling.evaluate(summary(CAPACITY | {1: 0.0}, P99), ScalingBenchConfig(), [1, 2, 16])


def test_capacity_is_compared_with_the_first_count():
    ratios, _ = scaling.evaluate(summary(CAPACITY, P99), ScalingBenchConfig(), [1, 2, 16])
    assert ratios["capacity_16_vs_first"] == pytest.approx(9.0)


def test_p99_is_compared_with_the_first_count():
    ratios, _ = scaling.evaluate(summary(CAPACITY, P99), ScalingBenchConfig(), [1, 2, 16])
    assert ratios["p99_2_vs_first"] == pytest.approx(0.75)


def test_the_capacity_target_is_checked_on_the_most_workers():
    cfg = ScalingBenchConfig(min_capacity_vs_first=10.0)
    _, targets = scaling.evaluate(summary(CAPACITY, P99), cfg, [1, 2, 16])
    assert [(t["name"], t["passed"]) for t in targets] == [("calls/s at saturation, 16 workers / 1", False)]


def test_a_first_count_with_the_most_workers_is_compared_with_the_most_of_the_others():
    cfg = ScalingBenchConfig(min_capacity_vs_first=0.1)
    _, targets = scaling.evaluate(summary(CAPACITY, P99), cfg, [16, 1, 2])
    assert [t["name"] for t in targets] == ["calls/s at saturation, 2 workers / 16"]


def test_the_p99_target_is_checked_on_every_other_count():
    cfg = ScalingBenchConfig(max_p99_vs_first=1.0)
    _, targets = scaling.evaluate(summary(CAPACITY, P99), cfg, [1, 2, 16])
    assert [t["passed"] for t in targets if t["name"].startswith("p99")] == [True, False]


def test_failed_paced_calls_of_a_count_with_a_low_p99_miss_its_target():
    cfg = ScalingBenchConfig(max_p99_vs_first=1.0)
    _, targets = scaling.evaluate(summary(CAPACITY, P99, failed={2: 5}), cfg, [1, 2, 16])
    assert {t["name"]: t["passed"] for t in targets}["failed paced calls, 2 workers or 1"] is False


def test_failed_paced_calls_are_counted_in_their_verdict():
    cfg = ScalingBenchConfig(max_p99_vs_first=1.0)
    _, targets = scaling.evaluate(summary(CAPACITY, P99, failed={2: 5}), cfg, [1, 2, 16])
    assert {t["name"]: t["measured"] for t in targets}["failed paced calls, 2 workers or 1"] == 5


def test_paced_calls_a_count_left_unanswered_miss_its_p99_target():
    # 2 workers answered 71 of the 800 calls due in a repeat: h2load sent no more once its streams all waited
    cfg = ScalingBenchConfig(max_p99_vs_first=1.0)
    _, targets = scaling.evaluate(summary(CAPACITY, P99, share={2: 71 / 800}), cfg, [1, 2, 16])
    assert {t["name"]: t["passed"] for t in targets}["paced calls answered of those due, 2 workers or 1"] is False


def test_the_least_share_of_paced_calls_answered_is_its_verdicts_figure():
    cfg = ScalingBenchConfig(max_p99_vs_first=1.0)
    _, targets = scaling.evaluate(summary(CAPACITY, P99, share={1: 0.5}), cfg, [1, 2, 16])
    assert {t["name"]: t["measured"] for t in targets}["paced calls answered of those due, 2 workers or 1"] == 0.5


def test_no_target_is_checked_by_default():
    _, targets = scaling.evaluate(summary(CAPACITY, P99), ScalingBenchConfig(), [1, 2, 16])
    assert targets == []


def test_one_worker_count_in_the_recipe_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        ScalingBenchConfig(workers=[1])


def bench_scaling(bundle, runs: Path, *extra: str) -> int:
    with pytest.MonkeyPatch.context() as env:
        for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
            env.delenv(name)
        env.setenv("EDGEDISTILL_RUNS_DIR", str(runs))
        return main(["scaling", str(SMOKE), "--bundle", str(bundle), *extra])


@needs_h2load
def test_a_short_run_measures_one_and_two_workers(tmp_path, bundle):
    code = bench_scaling(
        bundle,
        tmp_path,
        "--bench.scaling.workers=[1,2]",
        "--bench.scaling.duration_s=0.5",
        "--bench.scaling.warmup_s=0.2",
        "--bench.scaling.repeats=1",
    )
    folder = tmp_path / "smoke" / "serve-scaling-tiny"
    result = ServingResult.load(folder)
    assert code == 0
    assert sorted(result.runs) == ["1 capacity", "1 paced", "2 capacity", "2 paced"]
    assert all(records[0]["failures"] == 0 for records in result.runs.values())
    assert result.settings["workers"]["measured"] == [1, 2]
    assert (folder / "bench.md").is_file()
    assert not list(folder.glob("h2load.log*"))


@needs_h2load
def test_a_missed_target_exits_1_with_check(tmp_path, bundle):
    code = bench_scaling(
        bundle,
        tmp_path,
        "--check",
        "--bench.scaling.workers=[1,2]",
        "--bench.scaling.duration_s=0.3",
        "--bench.scaling.warmup_s=0",
        "--bench.scaling.repeats=1",
        "--bench.scaling.min_capacity_vs_first=100",
    )
    assert code == 1


@pytest.mark.parametrize("passed", [True, False])
def test_check_of_a_result_the_recipe_set_no_target_for_is_refused_naming_the_section(tmp_path, capsys, passed):
    empty = {"bundle": {}, "settings": {}, "options": {}, "texts": {}, "machine": {}, "runs": {}, "summary": {}}
    ServingResult(**empty, ratios={}, targets=[], passed=passed).save(tmp_path, "")
    stage = type("Stage", (), {"name": "serve-scaling-tiny", "folder": tmp_path})()
    assert checked_targets(stage, True, "scaling") == 2
    assert "bench.scaling of the recipe sets no target, so nothing was checked" in capsys.readouterr().err


def test_the_targets_are_written_with_every_digit_the_recipe_gave():
    cfg = ScalingBenchConfig(min_capacity_vs_first=8.995, max_p99_vs_first=0.805)
    _, targets = scaling.evaluate(summary(CAPACITY, P99), cfg, [1, 2, 16])
    assert [t["limit"] for t in targets[:2]] == [">= 8.995", "<= 0.805"]
