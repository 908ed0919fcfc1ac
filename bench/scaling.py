"""The server's scaling with its worker processes: one bundle served with 1, 2, ... workers, driven by h2load.

A server starts for each count of `bench.scaling.workers` with `--workers N`, all of them at once (0: the
server's default, one per core as memory allows, here the memory the other counts' workers leave), each probed (its
reply must carry the bundle's logits) and loaded for `warmup_s`; then, `repeats` times with the counts in a rotating
order, h2load runs two phases on each while the others stand idle, so that a machine whose speed drifts drifts under
every count alike: capacity (`connections_per_worker` x N connections with `streams` calls in flight each) and paced
at `rate` calls/s over `paced_connections`, the same for every count, each from its own h2load process so that their
calls interleave. Every call is the KServe v2 `ModelInfer` of the peer comparison (`bench.calls`). The
result is the artifact `runs/<recipe>/serve-scaling-<bundle>/`, one per bundle folder (`common.measured`):
bench.json (a `bench.records.ServingResult`), bench.md, every server's log.
"""

import functools
import os
from contextlib import ExitStack
from pathlib import Path

from edgedistill.bench import BenchError, h2load, slo
from edgedistill.bench.environ import served_settings
from edgedistill.bench.peers import launch
from edgedistill.bench.records import ServingResult, bundle_record, cores_phrase, machine
from edgedistill.bench.stats import require_answered, summarize
from edgedistill.bench.tables import (
    H2LOAD_COLUMNS,
    H2LOAD_LEGEND,
    h2load_failures_line,
    h2load_rows,
    markdown_results,
    print_results,
    target_rows,
    threads_phrase,
)
from edgedistill.bench.targets import CAPACITY, PACED, Example, phases, started
from edgedistill.common import manifest as mf
from edgedistill.common import measured
from edgedistill.common.cascade import is_cascade
from edgedistill.common.config.measure import ScalingBenchConfig
from edgedistill.common.console import Console
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.stage import Artifact, Built, Inputs, Stage

STAGE = measured.SCALING


def stage(recipe: Recipe, bundle_folder: Path, console: Console | None = None) -> Stage:
    """`runs/<recipe>/serve-scaling-<bundle>/`: `bundle_folder` served with every worker count; current while the
    settings, the dev split, the bundle and the server's settings are unchanged."""
    return Stage(
        measured.of_bundle(STAGE, bundle_folder, run_dir(recipe)),
        recipe,
        ("bench.scaling", "data"),
        functools.partial(_build, console=console or Console(width=200)),
        (Artifact(measured.BUNDLE, bundle_folder),),
        extra={"server": served_settings(bundle_folder, recipe.bench.scaling.threads)},
    )


def _build(inputs: Inputs, console: Console) -> Built:
    cfg = inputs.recipe.bench.scaling
    bundle_folder = inputs.parent(measured.BUNDLE)
    if is_cascade(bundle_folder):
        raise BenchError(f"{bundle_folder} is a cascade: measure one of its members")
    example = Example.of(inputs.recipe.data, bundle_folder, cfg.threads)
    work = inputs.fresh_work()
    load_before = os.getloadavg()
    runs, counts = measure(cfg, bundle_folder, example, work)
    summary = {key: summarize(records) for key, records in runs.items()}
    ratios, targets = evaluate(summary, cfg, counts)
    result = ServingResult(
        bundle=bundle_record(bundle_folder, example.spec),
        settings={"workers": {"asked": cfg.workers, "measured": counts}},
        options=cfg.model_dump(mode="json"),
        texts={"text": example.text, "pair": example.pair, "source": inputs.recipe.data.dev},
        machine=machine(load_before, versions=mf.package_versions() | {"h2load": h2load.version()}),
        runs=runs,
        summary=summary,
        ratios=ratios,
        targets=targets,
        passed=all(t["passed"] for t in targets),
    )
    result.save(work, markdown(result))
    print_results(console, heading(result), HEADER, table_rows(result), ("targets", "target", target_rows(targets)))
    most = most_compared(counts)
    return Built(
        metrics=ratios | {"passed": result.passed},
        info={"bench": cfg.model_dump(mode="json"), "workers": result.settings["workers"], "targets": targets},
        line=(
            f"{most} workers: {ratios[f'capacity_{most}_vs_first']:.2f}x the calls/s of {counts[0]}"
            + (f"; {missed}" if (missed := slo.missed(targets)) else "")
        ),
    )


def measure(
    cfg: ScalingBenchConfig, bundle: Path, example: Example, work: Path
) -> tuple[dict[str, list[dict]], list[int]]:
    """Start a server for every worker count at once, probe and warm each once all its workers serve
    (`bench.targets.started`), then run both phases on each while the others idle, `cfg.repeats` times in a rotating
    order (`h2load.interleaved`). The runs by '<workers> <phase>', and the counts measured."""
    name = example.spec.name
    counts = worker_counts(cfg.workers, bundle)
    with ExitStack() as stack:
        targets = {}
        for count in counts:
            server = launch.edgedistill(bundle, name, cfg.threads, count)
            log = work / f"workers-{count}.log"
            saturated = cfg.connections_per_worker * count
            loads = phases(cfg, h2load.Load(saturated, cfg.streams, cfg.duration_s, None, cfg.client_threads))
            warm = h2load.Load(saturated, cfg.streams, cfg.warmup_s, None, cfg.client_threads)
            files = (log, work / "request")
            targets[str(count)] = started(stack, server, f"{count} workers", files, example, loads, warm, work)
        return h2load.interleaved(targets, cfg.repeats, work, STAGE), counts


def worker_counts(asked: list[int], bundle: Path) -> list[int]:
    """`asked` with 0 resolved as the measured server resolves it (`launch.resolved_workers`), in the memory the
    other counts' servers leave (`measure` runs them all at once), repeats dropped; `BenchError` when fewer than two
    counts are left, or when memory cannot hold every count's workers together."""
    memory, per_worker = launch.memory_per_worker(bundle)
    held = memory // per_worker  # workers, each counted as the server counts it
    others = sum({count for count in asked if count})
    default = max(1, min(launch.resolved_workers(0, bundle), held - others))
    counts = list(dict.fromkeys(count or default for count in asked))
    if len(counts) < 2:
        raise BenchError(f"workers {asked}: {counts} on this machine; scaling needs two counts or more")
    if sum(counts) > held:
        raise BenchError(
            f"workers {asked}: the servers of {counts} run at once, {sum(counts)} workers in all, and the usable "
            f"memory ({memory >> 20} MiB) holds {held} of {per_worker >> 20} MiB each (`serve.workers`); measure "
            "fewer or smaller counts (--bench.scaling.workers=[...])"
        )
    return counts


def most_compared(counts: list[int]) -> int:
    """The count whose calls/s at saturation the capacity target and the stage's line compare with the first's: the
    most workers among the others (the first may be the most, as in workers [0, 1])."""
    return max(counts[1:])


def evaluate(summary: dict, cfg: ScalingBenchConfig, counts: list[int]) -> tuple[dict[str, float], list[dict]]:
    """Each count's calls/s at saturation and paced p99 over the first count's, and a verdict per target set."""

    def median(count: int, phase: str, figure: str) -> float:
        return summary[f"{count} {phase}"][figure].median

    require_answered(summary)
    first = counts[0]
    ratios = {}
    for count in counts[1:]:
        ratios[f"capacity_{count}_vs_first"] = median(count, CAPACITY, "requests_per_s") / median(
            first, CAPACITY, "requests_per_s"
        )
        ratios[f"p99_{count}_vs_first"] = median(count, PACED, "p99_ms") / median(first, PACED, "p99_ms")
    targets = []
    if (least := cfg.min_capacity_vs_first) is not None:
        most = most_compared(counts)
        measured = ratios[f"capacity_{most}_vs_first"]
        name = f"calls/s at saturation, {most} workers / {first}"
        targets.append(slo.verdict(name, measured, f">= {least:g}", measured >= least))
    if (limit := cfg.max_p99_vs_first) is not None:
        for count in counts[1:]:
            measured = ratios[f"p99_{count}_vs_first"]
            name = f"p99 at {cfg.rate:g} calls/s, {count} workers / {first}"
            targets.append(slo.verdict(name, measured, f"<= {limit:g}", measured <= limit))
            sides, paced = [f"{count} workers", str(first)], [summary[f"{n} {PACED}"] for n in (count, first)]
            targets.append(slo.no_failed_calls(sides, [figures["failures"].max for figures in paced]))
            targets.append(slo.paced_share(sides, [figures["rate_share"].min for figures in paced]))
    return ratios, targets


HEADER = ["workers", "phase", *H2LOAD_COLUMNS.values()]


def table_rows(result: ServingResult) -> list[list[str]]:
    return h2load_rows(result.summary, result.options["rate"])


def heading(result: ServingResult) -> str:
    o, b = result.options, result.bundle
    return (
        f"{b['name']} ({b['arch']}, {b['precision']}, {b['runtime']}) behind the server, "
        f"{threads_phrase(b, o['threads'], ' per worker')}, {cores_phrase(result.machine)}; h2load with "
        f"{o['client_threads']} thread(s), "
        f"saturated over {o['connections_per_worker']} connection(s) per worker x {o['streams']} streams, paced over "
        f"{o['paced_connections']}; median (min-max) of {o['repeats']} repeats of {o['duration_s']:g} s"
    )


def markdown(result: ServingResult) -> str:
    lines = [f"Scaling with worker processes: {heading(result)}.", ""]
    lines += markdown_results(HEADER, table_rows(result), ("target", target_rows(result.targets)))
    if failures := h2load_failures_line(result.runs, result.options["rate"]):
        lines += ["", failures]
    lines += [
        "",
        *H2LOAD_LEGEND,
        f"includes its worker processes. h2load {result.machine['versions']['h2load']}.",
    ]
    return "\n".join(lines) + "\n"
