"""The result of a load-test run: its figures and SLO verdicts, as `summary.json`, `summary.md` and a console table.

summary.json (latencies in ms, of successful calls as locust saw them, from each call's send (`p99_ms`, ...) and from
its due time (`p99_from_due_ms`, ...: a call a paced user sent late, behind a slow one, waited that long more; the
SLO's latency checks read these); CPU % of one core; calls still in flight when the schedule ends, which return within
the stop timeout, count overall, by name and in the last stage, whose rates are over the scheduled seconds; calls due
within it that a user held up by a call before them never sent count as unsent, not as requests or failures (the
server never saw them), where the user stopped, under the name `not sent`; calls due after it count nowhere):
- `recipe`, `profile`, `settings` (the profile's), `scenarios` {name: weight}, `duration_s` (scheduled),
  `bundle` {path, name, version, arch, precision, runtime}, `server` (its settings; null for the echo server), `texts` {source,
  count, chars {min, median, max}}, `machine` {cpus, cores (those the run could use), load_avg_before, load_avg_after};
- `overall`: requests, failures, error_rate, requests_per_s (successful calls), offered_rate, offered_calls (over the
  scheduled seconds), rate_share (successful of offered calls), mean_ms,
  p50_ms, p95_ms, p99_ms, max_ms, p50_from_due_ms, p95_from_due_ms, p99_from_due_ms, max_from_due_ms (of the
  successful and the unsent calls, an unsent one timed to when its user stopped), late_calls (successful calls sent
  after their due time), unsent_calls (calls due never sent: not among the requests, failures or successful calls),
  error_codes {gRPC status: failed calls}, server_cpu_pct, locust_cpu_pct;
- `by_name`: the call figures per request name (`Classify`, `Classify x8`, `ClassifyStream x8`, `ModelInfer`);
- `stages`: per stage of the schedule: name, start_s, end_s, users, the call figures (a step's first
  `settle_s` left out), server_cpu_pct, locust_cpu_pct, generator_bound;
- `series`: per second: t_s, users, requests_per_s (every call sent, failed ones too), failures_per_s, p50_ms, p95_ms,
  p99_ms (from the send; null: no call);
- `resources`: per process sample (twice a second): t_s, server_cpu_pct, locust_cpu_pct,
  server_rss_mb, requests_done;
- `capacity` (step): the stage with the most successful requests/s within the SLO, else null;
- `rss_growth_mb_per_10k` (soak): server RSS slope over the second half of the run (null: too little data);
- `generator_bound`: locust, which runs on one core, used >= 90 % of it in some stage: there the load
  generator, not the server, limited the load; `notes`: such findings in words;
- `checks` [{name, measured, limit, passed}] and `passed`: the SLO gate.
"""

import json
import math
from pathlib import Path

from edgedistill.bench import slo
from edgedistill.bench.records import cores_phrase
from edgedistill.bench.tables import markdown_results, print_results
from edgedistill.common import tables
from edgedistill.common.cascade import describe
from edgedistill.common.config.measure import SloConfig
from edgedistill.common.console import Console
from edgedistill.loadtests import analysis
from edgedistill.loadtests.analysis import Resources, Samples
from edgedistill.loadtests.plan import Plan

RESULT_FILE = "summary.json"
TABLES_FILE = "summary.md"
GENERATOR_BOUND_CPU = 90.0  # % of one core: locust is one gevent process and cannot offer more


def stage_figures(plan: Plan, samples: Samples, resources: Resources) -> list[dict]:
    settle = getattr(plan.settings, "settle_s", 0.0)
    figures, stages = [], plan.stages
    for stage in stages:
        start = stage.start_s + settle
        returned = samples.between(start, math.inf if stage is stages[-1] else stage.end_s)
        stats = analysis.call_stats(returned, stage.end_s - start, stage.offered_rate)
        cpu = {f"{p}_cpu_pct": resources.cpu_pct(p, start, stage.end_s) for p in ("server", "locust")}
        bound = (cpu["locust_cpu_pct"] or 0) >= GENERATOR_BOUND_CPU
        figures.append(stage.model_dump() | stats | cpu | {"generator_bound": bound})
    return figures


def notes_for(stages: list[dict], capacity: dict | None, profile: str) -> list[str]:
    notes = []
    bound = [s["name"] for s in stages if s["generator_bound"]]
    if bound:
        notes.append(
            f"locust used >= {GENERATOR_BOUND_CPU:g} % of its core in {', '.join(bound)}: "
            "there the load generator, not the server, limited the load"
        )
    timed = [s for s in stages if s["p99_from_due_ms"] is not None]
    if profile == "step" and capacity is None and timed:
        best = min(timed, key=lambda s: s["p99_from_due_ms"])
        notes.append(
            f"no step met the SLO; the lowest p99 from the due time was {best['p99_from_due_ms']:.2f} ms, "
            f"in {best['name']} at {best['requests_per_s']:.0f} requests/s"
        )
    if profile == "step" and capacity is not None:
        after = stages.index(capacity) + 1
        if after == len(stages):
            notes.append("the last step met the SLO: capacity is a lower bound (add steps)")
        elif stages[after]["generator_bound"]:
            notes.append("the step past capacity was generator-bound: capacity is a lower bound")
    return notes


def capacity_of(stages: list[dict], slo_config: SloConfig) -> dict | None:
    """The step (its figures) with the most requests/s within the SLO, its latencies from the due time."""
    best = slo.capacity([slo.from_due_time(stage) for stage in stages], slo_config)
    return None if best is None else next(stage for stage in stages if stage["name"] == best["name"])


def build(plan: Plan, samples: Samples, resources: Resources, task_errors: int, context: dict) -> dict:
    """Every figure and the SLO verdicts; `context` adds recipe, bundle, server, texts and machine."""
    settings = plan.settings
    duration = plan.duration_s
    # Only calls due within the schedule count: a paced user sends no other, but locust lets a user call until its
    # shape's first tick past the end, up to a second late.
    samples = samples.due_before(duration)
    returned = samples.between(0, math.inf)  # those in flight at the end too, which return within the stop timeout
    overall = analysis.call_stats(returned, duration, analysis.offered_rate(plan.stages))
    overall |= {f"{p}_cpu_pct": resources.cpu_pct(p, 0, duration) for p in ("server", "locust")}
    stages = stage_figures(plan, samples, resources)
    series = resources.series(samples, duration)
    capacity = capacity_of(stages, settings.slo) if plan.profile == "step" else None
    soak = plan.profile == "soak"
    growth = analysis.rss_growth_per_10k(series["requests_done"], series["server_rss_mb"]) if soak else None
    if plan.profile == "step":
        checks = [slo.capacity_verdict(capacity, settings.min_capacity_rps)]
    else:
        checks = slo.check_paced(overall, settings.slo)
    if soak and settings.max_rss_growth_mb_per_10k is not None:
        limit = settings.max_rss_growth_mb_per_10k
        checks.append(
            slo.verdict("rss_growth_mb_per_10k", growth, f"<= {limit:g}", growth is not None and growth <= limit)
        )
    checks.append(slo.verdict("locust_task_errors", task_errors, "0", task_errors == 0))
    return context | {
        "profile": plan.profile,
        "settings": settings.model_dump(mode="json"),
        "scenarios": plan.scenarios,
        "duration_s": duration,
        "overall": overall,
        "by_name": analysis.by_name(returned, duration),
        "stages": stages,
        "series": analysis.per_second(samples, plan.stages),
        "resources": series,
        "capacity": capacity,
        "rss_growth_mb_per_10k": growth,
        "generator_bound": any(s["generator_bound"] for s in stages),
        "notes": notes_for(stages, capacity, plan.profile),
        "checks": checks,
        "passed": all(c["passed"] for c in checks),
    }


def headline(result: dict) -> dict:
    """The manifest's metrics: overall call figures, capacity and RSS growth where measured, the verdict."""
    keys = ("requests", "error_rate", "requests_per_s", "p50_ms", "p95_ms", "p99_ms", "p99_from_due_ms")
    metrics = {key: result["overall"][key] for key in keys}
    if result["capacity"] is not None:
        metrics["capacity_rps"] = result["capacity"]["requests_per_s"]
    if result["rss_growth_mb_per_10k"] is not None:
        metrics["rss_growth_mb_per_10k"] = result["rss_growth_mb_per_10k"]
    return metrics | {"passed": result["passed"]}


COLUMNS = {  # figure -> column
    "users": "users",
    "offered_rate": "offered/s",
    "requests_per_s": "requests/s",
    "p50_ms": "p50 ms",
    "p95_ms": "p95 ms",
    "p99_ms": "p99 ms",
    "max_ms": "max ms",
    "p50_from_due_ms": "p50 ms due",
    "p95_from_due_ms": "p95 ms due",
    "p99_from_due_ms": "p99 ms due",
    "late_calls": "late",
    "failures": "failures",
    "unsent_calls": "unsent",
    "locust_cpu_pct": "locust CPU %",
    "server_cpu_pct": "server CPU %",
}


READING = (  # how to read the tables of COLUMNS
    "Latency of successful calls as locust saw them, from the send and (due) from the due time, which the SLO "
    "reads; late: calls sent after their due time; unsent: calls due that a user held up never sent, timed from "
    "the due time to its stop; CPU %: 100 = one core."
)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 100 else f"{value:.0f}"
    return str(value)


def rows(result: dict) -> list[list[str]]:
    stages = result["stages"] if len(result["stages"]) > 1 else []
    overall = result["overall"] | {"users": "", "name": "overall"}
    return [[s["name"]] + [_cell(s.get(key)) for key in COLUMNS] for s in [*stages, overall]]


def heading(result: dict) -> str:
    b = result["bundle"]
    return (
        f"load test {result['profile']} of {describe(b)}, "
        f"{result['duration_s']:g} s, scenarios {result['scenarios']}, {cores_phrase(result['machine'])}"
    )


def verdict_rows(result: dict) -> list[list[str]]:
    return tables.verdict_rows(result["checks"], _cell)


def failures_line(stats: dict) -> str | None:
    """'failed calls by status: RESOURCE_EXHAUSTED 12, UNAVAILABLE 1' for call figures with failures, else None."""
    if not stats["failures"]:
        return None
    return "failed calls by status: " + ", ".join(f"{code} {count}" for code, count in stats["error_codes"].items())


def extras(result: dict) -> list[str]:
    lines = list(result["notes"])
    if failures := failures_line(result["overall"]):
        lines.append(failures)
    if result["capacity"] is not None:
        lines.append(f"capacity within the SLO: {result['capacity']['requests_per_s']:.0f} requests/s")
    if result["rss_growth_mb_per_10k"] is not None:
        lines.append(f"server RSS growth: {result['rss_growth_mb_per_10k']:.3f} MB per 10,000 requests")
    return lines


def markdown(result: dict) -> str:
    lines = [f"{heading(result)}.", ""]
    lines += markdown_results(["stage", *COLUMNS.values()], rows(result), ("check", verdict_rows(result)))
    if notes := extras(result):
        lines += ["", *(f"- {line}" for line in notes)]
    lines += ["", READING]
    return "\n".join(lines) + "\n"


def save(folder: Path, result: dict) -> None:
    """`result` as RESULT_FILE and its tables as TABLES_FILE in `folder`."""
    (folder / RESULT_FILE).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (folder / TABLES_FILE).write_text(markdown(result), encoding="utf-8")


def load(folder: Path) -> dict:
    """The result a load-test run wrote in `folder`."""
    return json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))


def show(result: dict, console: Console) -> None:
    header = ["stage", *COLUMNS.values()]
    print_results(console, heading(result), header, rows(result), ("SLO", "check", verdict_rows(result)))
    for line in extras(result):
        console.print(f"- {line}")
