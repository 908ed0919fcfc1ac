"""SLO verdicts on call figures (`bench.stats.call_stats`), and the capacity search over the steps of a stepped load.

A verdict is {name, measured, limit, passed}: the load tests' checks and the serving benchmark's targets alike.
"""

from edgedistill.bench.stats import from_due
from edgedistill.common import tables
from edgedistill.common.config.measure import SloConfig

LATENCIES = ("p50_ms", "p95_ms", "p99_ms")  # the latencies an SLO can bound


def verdict(name: str, measured: float | None, limit: str, passed: bool) -> dict:
    return {"name": name, "measured": measured, "limit": limit, "passed": passed}


def from_due_time(stats: dict) -> dict:
    """`stats` with the latencies an SLO on paced calls reads: those timed from each call's due time (a slow call
    delays the calls due behind it, which timing from the send leaves out), in place of those from its send."""
    return stats | {key: stats[from_due(key)] for key in LATENCIES}


def check(stats: dict, slo: SloConfig) -> list[dict]:
    """One verdict per threshold `slo` sets, on `stats` from `bench.stats.call_stats`."""
    verdicts = []
    for key in LATENCIES:
        limit = getattr(slo, key)
        if limit is not None:
            measured = stats[key]
            verdicts.append(verdict(key, measured, f"<= {limit:g}", measured is not None and measured <= limit))
    verdicts.append(
        verdict(
            "error_rate",
            stats["error_rate"] if stats["requests"] else None,  # no call: none, not a rate of 0 that seems to pass
            f"<= {slo.max_error_rate:g}",
            stats["requests"] > 0 and stats["error_rate"] <= slo.max_error_rate,
        )
    )
    if slo.min_rate_share is not None and stats["offered_rate"]:
        share = stats["rate_share"]
        verdicts.append(verdict("rate_share", share, f">= {slo.min_rate_share:g}", share >= slo.min_rate_share))
    return verdicts


def check_paced(stats: dict, slo: SloConfig) -> list[dict]:
    """`check` of paced calls' `stats` on their latencies from the due time (`from_due_time`), each such verdict named
    by the figure it read (`p99_from_due_ms`), as tables give the p99 from the send as `p99_ms`."""
    return [
        v | {"name": from_due(v["name"])} if v["name"] in LATENCIES else v for v in check(from_due_time(stats), slo)
    ]


def no_failed_calls(sides: list[str], failures: list[float]) -> dict:
    """The verdict beside a target on h2load's paced percentiles, which time failed calls as well (a server that fails
    calls fast would meet it): that no paced repeat of `sides` failed a call; `failures`, the most failed calls in
    one repeat of each side."""
    most = max(failures)
    return verdict(f"failed paced calls, {' or '.join(sides)}", most, "0", most == 0)


MIN_PACED_SHARE = SloConfig.model_fields["min_rate_share"].default  # the load tests' default


def paced_share(sides: list[str], shares: list[float]) -> dict:
    """The other verdict beside a target on h2load's paced percentiles, which time only the calls h2load sent (a server
    that never answers some calls holds the streams, and the calls due behind them are never sent, nor timed): that
    every paced repeat of `sides` answered at least MIN_PACED_SHARE of the calls due; `shares`, the least share of the
    calls due that succeeded in one repeat of each side."""
    least = min(shares)
    name = f"paced calls answered of those due, {' or '.join(sides)}"
    return verdict(name, least, f">= {MIN_PACED_SHARE:g}", least >= MIN_PACED_SHARE)


def capacity(steps: list[dict], slo: SloConfig) -> dict | None:
    """The step with the most requests/s among those that met every threshold of `slo`; None when none did."""
    within = [step for step in steps if all(v["passed"] for v in check(step, slo))]
    return max(within, key=lambda step: step["requests_per_s"], default=None)


def capacity_verdict(capacity: dict | None, least: float | None) -> dict:
    """Some step met the SLO, with at least `least` requests/s when given."""
    measured = capacity["requests_per_s"] if capacity else None
    limit = f">= {least:g}" if least else "a step within the SLO"
    return verdict("capacity_rps", measured, limit, measured is not None and (least is None or measured >= least))


def missed(verdicts: list[dict]) -> str:
    """'missed <name>, <name>' for the verdicts not passed; '' when every one passed."""
    names = [v["name"] for v in verdicts if not v["passed"]]
    return f"missed {', '.join(names)}" if names else ""


def describe(v: dict) -> str:
    """'p99_ms 4.12 (wanted <= 3)', the measured figure never written as its limit's number unless it is that number
    (`common.tables.measured`)."""
    measured = tables.measured(v, lambda value: "none" if value is None else f"{value:.4g}")
    return f"{v['name']} {measured} (wanted {v['limit']})"
