"""SLO verdicts on call figures and the capacity search over steps."""

from edgedistill.bench import slo
from edgedistill.common.config.measure import SloConfig

from tests.conftest import step


def test_capacity_is_the_busiest_step_within_the_slo():
    steps = [step(100, 1.0), step(200, 2.0), step(290, 2.9), step(300, 4.0), step(310, 2.5, errors=0.01)]
    assert slo.capacity(steps, SloConfig(p99_ms=3)) is steps[2]
    slow = [step(100, 1.0), step(180, 1.5, offered=200), step(200, 1.8, offered=300)]
    assert slo.capacity(slow, SloConfig(p99_ms=3)) is slow[0]  # the others fell below 0.95 of the offered rate
    assert slo.capacity(slow, SloConfig(p99_ms=3, min_rate_share=0.9)) is slow[1]
    assert slo.capacity(slow, SloConfig(p99_ms=3, min_rate_share=None)) is slow[2]
    assert slo.capacity([step(100, 5.0)], SloConfig(p99_ms=3)) is None


def test_slo_verdicts_name_the_threshold():
    verdicts = slo.check(step(200, 2.4) | {"p50_ms": 0.9}, SloConfig(p50_ms=1, p99_ms=0.001))
    assert [(v["name"], v["passed"]) for v in verdicts] == [
        ("p50_ms", True),
        ("p99_ms", False),
        ("error_rate", True),
        ("rate_share", True),
    ]
    assert slo.describe(verdicts[1]) == "p99_ms 2.4 (wanted <= 0.001)"
    assert not slo.check(step(200, 1.0) | {"requests": 0}, SloConfig())[0]["passed"]  # no call: no pass


PACED = step(200, 1.0) | {"p50_from_due_ms": 0.5, "p95_from_due_ms": 1.0, "p99_from_due_ms": 20.0}  # a stall


def test_paced_latency_verdicts_are_named_by_the_figure_from_the_due_time_they_read():
    verdicts = slo.check_paced(PACED, SloConfig(p99_ms=3))
    assert [v["name"] for v in verdicts] == ["p99_from_due_ms", "error_rate", "rate_share"]


def test_paced_latency_verdicts_read_the_latencies_from_the_due_time():
    assert slo.check_paced(PACED, SloConfig(p99_ms=3))[0]["measured"] == 20.0


def test_a_run_without_calls_measures_no_error_rate():
    verdicts = slo.check(step(200, 1.0) | {"requests": 0, "error_rate": 0.0}, SloConfig())
    error_rate = next(v for v in verdicts if v["name"] == "error_rate")
    assert slo.describe(error_rate) == "error_rate none (wanted <= 0)"


def test_capacity_verdict_needs_a_measured_step_above_any_wanted_rate():
    assert slo.capacity_verdict(step(250, 1.0), 200)["passed"]
    assert not slo.capacity_verdict(step(150, 1.0), 200)["passed"]
    assert not slo.capacity_verdict(None, None)["passed"]
    assert slo.capacity_verdict(step(1, 1.0), None)["passed"]


def test_missed_names_each_verdict_not_passed():
    verdicts = [
        slo.verdict("p99_ms", 5.0, "<= 3", False),
        slo.verdict("error_rate", 0.0, "<= 0", True),
        slo.verdict("rate_share", 0.5, ">= 0.95", False),
    ]
    assert slo.missed(verdicts) == "missed p99_ms, rate_share"


def test_missed_is_empty_when_every_verdict_passed():
    assert slo.missed([slo.verdict("error_rate", 0.0, "<= 0", True)]) == ""


def test_a_missed_figure_is_not_described_as_its_limits_number():
    verdict = slo.verdict("p99_ms", 3.00004, "<= 3", False)
    assert slo.describe(verdict) == "p99_ms 3.00004 (wanted <= 3)"
