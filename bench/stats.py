"""Statistics of timed calls, in ms: the figures of one stretch of calls, and their spread over repeats.

`call_stats` gives the figures of one stretch of calls, from the serving benchmark's drivers and the load tests'
samples alike; `summarize` their spread (`bench.records.Spread`) over repeats, `pooled` their requests and failures
over repeats.
"""

import numpy as np
from edgedistill.bench import BenchError
from edgedistill.bench.records import Spread

PERCENTILES = {"p50_ms": 50, "p95_ms": 95, "p99_ms": 99, "max_ms": 100}


def from_due(key: str) -> str:
    """The name of latency figure `key` (`p99_ms`) timed from each call's due time (`p99_from_due_ms`)."""
    return key.removesuffix("_ms") + "_from_due_ms"


def percentiles(ms: np.ndarray) -> dict[str, float | None]:
    """p50, p95, p99 and max of `ms` by nearest rank; each None when `ms` is empty.

    A pXX is a latency some call had, with at most (100 - XX) % of the calls above it, so a target on it holds for
    the calls; numpy's default interpolates between two calls, and over 60 calls one of 300 ms among 1 ms ones would
    give a p99 of 124 ms. The inverted CDF (the least latency with XX % of the calls at or below it) rather than
    "higher", which takes the call above numpy's interpolated rank and so reads a p99 of 100 calls as their max.
    """
    if not ms.size:
        return dict.fromkeys(PERCENTILES)
    ranked = np.percentile(ms, list(PERCENTILES.values()), method="inverted_cdf")
    return dict(zip(PERCENTILES, ranked.tolist(), strict=True))


def call_stats(
    ok_ms: np.ndarray,
    failures: int,
    seconds: float,
    offered_rate: float | None = None,
    offered_calls: float | None = None,
) -> dict:
    """Requests, failures, error rate, successful requests/s over `seconds`, the calls offered (`offered_calls`, else
    `offered_rate` over `seconds`) and the share of them that succeeded, and the mean and percentiles of the
    successful calls' latencies `ok_ms`. The rates count successful calls alone, as h2load's (`bench.h2load.run`) do: a
    server that refuses calls (RESOURCE_EXHAUSTED) as fast as they come neither serves them nor keeps up with the
    offered rate. A paced run gives its scheduled calls as `offered_calls`: its `seconds` run on until the last call
    returns, and one slow last call would otherwise lower the share of calls that all succeeded."""
    requests = len(ok_ms) + failures
    if offered_calls is None and offered_rate:
        offered_calls = offered_rate * seconds
    stats = {
        "requests": requests,
        "failures": failures,
        "error_rate": failures / requests if requests else 0.0,
        "requests_per_s": len(ok_ms) / seconds,
        "offered_rate": offered_rate,
        "offered_calls": offered_calls,
        "rate_share": len(ok_ms) / offered_calls if offered_calls else None,
        "mean_ms": float(ok_ms.mean()) if ok_ms.size else None,
    }
    return stats | percentiles(ok_ms)


def pooled(records: list[dict]) -> dict:
    """The requests, failures and error rate of `records` (`call_stats` of repeats of one phase) taken together: a
    target on them is met by every repeat's calls, where the median of three repeats would pass one that failed
    calls."""
    requests = sum(record["requests"] for record in records)
    failures = sum(record["failures"] for record in records)
    return {"requests": requests, "failures": failures, "error_rate": failures / requests if requests else 0.0}


def summarize(records: list[dict]) -> dict[str, Spread]:
    """The spread over `records` (one per repeat) of every field that is a number in the first."""
    numeric = [
        key for key, value in records[0].items() if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    return {key: Spread.of([record[key] for record in records]) for key in numeric}


def require_answered(summary: dict[str, dict[str, Spread]]) -> None:
    """`BenchError` naming each side of a comparison (`summary`'s "<server> <phase>") whose median repeat had no call
    succeed: a ratio to its calls/s, or its p99, would be no figure."""
    rates = {side: figures.get("requests_per_s") for side, figures in summary.items()}
    if silent := [side for side, rate in rates.items() if rate is not None and rate.median == 0]:
        raise BenchError(
            f"no call succeeded in the median repeat of {', '.join(silent)}: nothing to compare (h2load sees a "
            "failed gRPC call as HTTP 200, without its status: the server's log gives it)"
        )
