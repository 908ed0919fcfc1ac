"""Call statistics and their spreads over repeats."""

import numpy as np
import pytest
from edgedistill.bench import BenchError
from edgedistill.bench.records import Spread
from edgedistill.bench.stats import call_stats, percentiles, pooled, require_answered, summarize


def test_call_stats_count_failures_but_time_only_successes():
    stats = call_stats(np.arange(1, 191) / 100, failures=10, seconds=2.0, offered_rate=125)
    assert stats["requests"] == 200
    assert stats["failures"] == 10
    assert stats["error_rate"] == 0.05
    assert stats["requests_per_s"] == 95
    assert stats["rate_share"] == 0.76
    assert stats["max_ms"] == 1.9
    assert stats["mean_ms"] == pytest.approx(0.955)


def test_failed_calls_add_nothing_to_the_requests_per_second():
    stats = call_stats(np.ones(50), failures=50, seconds=1.0)
    assert stats["requests_per_s"] == 50


def test_refused_calls_achieve_none_of_the_offered_rate():
    stats = call_stats(np.array([]), failures=100, seconds=1.0, offered_rate=100)
    assert stats["rate_share"] == 0


def test_call_stats_without_an_offered_rate_have_no_rate_share():
    stats = call_stats(np.ones(5), failures=0, seconds=1.0)
    assert stats["offered_rate"] is None
    assert stats["rate_share"] is None


def test_percentiles_of_no_calls_are_none():
    assert percentiles(np.array([])) == {"p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}


def test_a_p99_over_60_calls_is_the_one_call_slower_than_1_percent_allows():
    assert percentiles(np.array([1.0] * 59 + [300.0]))["p99_ms"] == 300


def test_a_p99_over_100_calls_leaves_one_call_above_it():
    assert percentiles(np.arange(1.0, 101.0))["p99_ms"] == 99


def test_summarize_spreads_every_number_over_repeats():
    repeats = [
        {"p99_ms": 2.0, "requests": 10, "offered_rate": None, "error_codes": {}},
        {"p99_ms": 1.0, "requests": 30, "offered_rate": None, "error_codes": {"UNAVAILABLE": 1}},
        {"p99_ms": 3.0, "requests": 20, "offered_rate": None, "error_codes": {}},
    ]
    assert summarize(repeats) == {
        "p99_ms": Spread(median=2.0, min=1.0, max=3.0),
        "requests": Spread(median=20, min=10, max=30),
    }


def test_rate_share_is_of_the_calls_offered_not_of_the_seconds_run():
    # 200 calls due in 2 s at 100/s, all served, the last returning at 2.49 s
    stats = call_stats(np.ones(200), failures=0, seconds=2.49, offered_rate=100, offered_calls=200)
    assert stats["rate_share"] == 1.0


def test_pooled_error_rate_is_of_the_calls_of_every_repeat():
    repeats = [{"requests": 100, "failures": 0}, {"requests": 100, "failures": 10}]
    assert pooled(repeats)["error_rate"] == 0.05


def test_a_side_whose_every_call_failed_is_refused_saying_the_servers_log_gives_the_status():
    silent = {"server capacity": {"requests_per_s": Spread.of([0.0])}}
    with pytest.raises(
        BenchError, match=r"h2load sees a failed gRPC call as HTTP 200, without its status: the server's"
    ):
        require_answered(silent)
