"""A cascade behind the server against its last member served alone, same client, same texts.

`python -m bench cascade RECIPE [--cascade NAME]` starts the server twice (one process each, the same
settings as `bench serving`): on the cascade folder and on its last member's bundle. Interleaved, for
`bench.serving.repeats` rounds, the two in an order rotated each round (`bench.drivers.rotated`): capacity
(single-text `Classify` calls from `concurrency` callers for `duration_s`) and the paced phase (one call at a time
at `rate` calls/s). The texts are the recipe's dev split (pairs for a pair task), shuffled; one that a member reads
as nothing is refused before the servers start (`bench.serving.check_readable`). Writes
`runs/<recipe>/serve-cascade-<name>/cascade.json` and `cascade.md`; capacity is texts/s, medians with min/max over
the rounds, and the share of the cascade's answers (after warm-up) that its first member escalated, beside the share
the cascade's own routing escalates of the same texts, each counted as often as it was sent (the first member run
in this process on each text alone, as the calls sent it), and the whole dev split's share its manifest records.
A last member's bundle rebuilt since the cascade copied it is refused: the two would serve different models.
"""

import asyncio
import functools
import os
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from edgedistill.bench import BenchError, drivers
from edgedistill.bench.environ import call_metadata, measured_server, served_settings
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.bench.processes import running
from edgedistill.bench.records import Result, Spread, cores_phrase, machine
from edgedistill.bench.serving import WARMUP_S, check_readable, classify_requests
from edgedistill.bench.stats import pooled, summarize
from edgedistill.bench.tables import record_line, spread_cell
from edgedistill.bench.texts import load_texts
from edgedistill.common import manifest as mf
from edgedistill.common import measured, progress
from edgedistill.common.cascade import Cascade, keeps, load_cascade
from edgedistill.common.console import Console
from edgedistill.common.names import not_among
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.stage import Artifact, Built, Inputs, Stage

PHASES = ("capacity", "paced")


class CascadeResult(Result):
    """`cascade.json`: the bundles' names, each model's records and their spreads per phase ("cascade" and "last"),
    the cascade's capacity over its last member's, its answers as [answering member, escalation refused, count], the
    machine it ran on (`bench.records.machine`) and the run's settings (`options`)."""

    FILE: ClassVar[str] = "cascade.json"
    TABLES: ClassVar[str] = "cascade.md"

    names: dict[str, str]
    runs: dict[str, dict[str, list[dict[str, Any]]]]
    summary: dict[str, dict[str, dict[str, Spread]]]
    capacity_ratio: float
    answered: list[tuple[str, bool, int]]
    machine: dict[str, Any]
    options: dict[str, Any]


def default_name(recipe: Recipe, name: str | None) -> str:
    cascades = recipe.export.cascades if recipe.export else {}
    if name is None:
        if not cascades:
            raise BenchError(f"recipe {recipe.name} has no export.cascades")
        name = recipe.export.default_cascade
    if unknown := not_among("--cascade", [name], list(cascades), f"export.cascades of {recipe.name}"):
        raise BenchError(unknown)
    return name


def stage(recipe: Recipe, name: str, console: Console | None = None) -> Stage:
    """`runs/<recipe>/serve-cascade-<name>/`: the cascade and its last member measured side by side."""
    folder = run_dir(recipe) / f"bundle-{name}"
    last = run_dir(recipe) / f"bundle-{recipe.export.cascades[name].members[-1]}"
    return Stage(
        measured.folder_name(measured.CASCADE, name),
        recipe,
        ("bench.serving", "data"),
        functools.partial(_build, console=console or Console(width=200)),
        (Artifact("cascade", folder), Artifact("last", last)),
        extra={"server": served_settings(folder, recipe.bench.serving.threads)},
    )


def counting(classify: Callable, answers: Counter) -> Callable:
    """`classify` that counts, in `answers`, each text's (text, its pair or None, answering member, escalation
    refused)."""

    async def call(request):
        reply = await classify(request)
        pairs = request.text_pairs or [None] * len(request.texts)
        answers.update(
            (text, pair, p.answered_by, p.escalation_refused)
            for text, pair, p in zip(request.texts, pairs, reply.predictions, strict=True)
        )
        return reply

    return call


def routed_escalated(folder: Path, answers: Counter) -> float:
    """The share of the texts in `answers` (`counting`'s, each text as often as it was answered) that the cascade in
    `folder` passes on past its first member by its own routing (`common.cascade.keeps`), the first member run in this
    process on each text alone, as the single-text calls sent it."""
    cascade = load_cascade(folder)
    sent: Counter = Counter()
    for (text, pair, _, _), count in answers.items():
        sent[text, pair] += count
    first = BundleClassifier(cascade.members[0].folder)
    try:
        logits = np.concatenate([first.logits([text], None if pair is None else [pair]) for text, pair in sent])
    finally:
        first.close()
    escalated = ~keeps(logits, cascade.spec, 0)
    return float(np.dot(escalated, list(sent.values())) / sum(sent.values()))


def refuse_another_recipe(recipe: Recipe, name: str, recipe_file: str) -> None:
    """`BenchError` where the cascade built in `bundle-<name>/` was built from other settings than the recipe's
    `export.cascades.<name>` (other members, rule or target), which the benchmark would measure under its name."""
    folder = run_dir(recipe) / f"bundle-{name}"
    if not (folder / mf.MANIFEST).is_file():
        return  # not built: the stage's parent check says so, naming the command
    key = f"export.cascades.{name}"
    built = (mf.load(folder, verify=False).hashed or {}).get("settings", {})
    now = recipe.settings(key)
    if key in built and built[key] != now[key]:
        why = mf.changes({"settings": {key: built[key]}}, {"settings": now})
        raise BenchError(
            f"{folder} is not the cascade the recipe has ({why}): build it first "
            f"(edgedistill bundles {recipe_file} --only {name})"
        )


def refuse_another_last(cascade: Cascade, last: Path) -> None:
    """`BenchError` unless `last` is the bundle the cascade's last member was copied from (their manifests' sha256):
    a bundle rebuilt since would be another model than the one the cascade serves."""
    member = cascade.spec.members[-1]
    if mf.sha256_file(last / mf.MANIFEST) != member.manifest_sha256:
        name = cascade.folder.name.removeprefix("bundle-")
        raise BenchError(
            f"{last} is not the bundle {cascade.folder} copied as its last member {member.bundle} (its manifest's "
            f"sha256 differs: rebuilt since), so the two would serve different models: rebuild the cascade "
            f"(`edgedistill bundles RECIPE --only {name}`)"
        )


async def _measure(recipe: Recipe, folders: dict[str, Path], work: Path, answers: Counter) -> dict[str, dict]:
    """Both servers' phases; `answers` counts the cascade's answers after warm-up (`counting`)."""
    cfg = recipe.bench.serving
    cascade = load_cascade(folders["cascade"])
    refuse_another_last(cascade, folders["last"])
    examples = load_texts(recipe.data, cascade.spec.pairs, None, None)
    check_readable(cascade.members, examples)
    singles = classify_requests(examples, 1)
    runs: dict[str, dict[str, list]] = {model: {phase: [] for phase in PHASES} for model in folders}
    async with AsyncExitStack() as stack:
        calls, servers = {}, {}
        for model, folder in folders.items():
            flags, settings = measured_server(folder, cfg.threads)
            servers[model] = stack.enter_context(
                running("edgedistill.serve", flags, settings.port, work / f"{model}.log")
            )
            calls[model] = await drivers.classify_call(stack, settings.port, call_metadata(settings))
            await drivers.saturate(calls[model], singles, cfg.concurrency, WARMUP_S)
        calls["cascade"] = counting(calls["cascade"], answers)
        rounds = progress.bar(cfg.repeats * len(folders) * len(PHASES), desc=measured.CASCADE, unit="phase")
        for repeat in range(1, cfg.repeats + 1):
            for model in drivers.rotated(list(folders), repeat - 1):
                loads = {
                    "capacity": functools.partial(
                        drivers.saturate, calls[model], singles, cfg.concurrency, cfg.duration_s
                    ),
                    "paced": functools.partial(drivers.paced, calls[model], singles, cfg.rate, cfg.duration_s),
                }
                for phase, load in loads.items():
                    offered = cfg.rate if phase == "paced" else None
                    what = f"repeat {repeat}/{cfg.repeats} {model} {phase}"
                    record = await drivers.measure(load, 1, servers[model], offered, what)
                    runs[model][phase].append(record)
                    rounds.set_postfix_str(f"{what}: {record_line(record)}", refresh=False)
                    rounds.update()
        rounds.close()
    return runs


def _build(inputs: Inputs, console: Console) -> Built:
    recipe = inputs.recipe
    folders = {"cascade": inputs.parent("cascade"), "last": inputs.parent("last")}
    work = inputs.fresh_work()
    load_before = os.getloadavg()
    answers: Counter = Counter()
    runs = asyncio.run(_measure(recipe, folders, work, answers))
    ran_on = machine(load_before, versions=mf.package_versions())
    summary = {
        model: {phase: summarize(records) for phase, records in phases.items()} for model, phases in runs.items()
    }
    capacity = {model: summary[model]["capacity"]["texts_per_s"].median for model in folders}
    ratio = capacity["cascade"] / capacity["last"]
    cfg = recipe.bench.serving
    names = {model: mf.load(folder, verify=False).stage.removeprefix("bundle-") for model, folder in folders.items()}
    lines = [
        f"# Cascade {names['cascade']} against {names['last']} served alone",
        "",
        f"Single-text Classify calls, {cfg.concurrency} callers for capacity, one call at a time at {cfg.rate:g} "
        f"calls/s for the paced phase; {cfg.repeats} interleaved rounds of {cfg.duration_s:g} s, median (min-max), "
        "failed calls over every round; "
        f"{cores_phrase(ran_on)}, load average {load_before[0]:.1f} before.",
        "",
        "| model | capacity texts/s | paced p50 ms | paced p99 ms | paced p99 ms from the due time | paced calls sent "
        "late / never sent | failed calls |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model in folders:
        s, paced = summary[model], runs[model]["paced"]
        late, unsent = (sum(record[key] for record in paced) for key in ("late_calls", "unsent_calls"))
        failed = pooled([record for records in runs[model].values() for record in records])["failures"]
        cells = [spread_cell(s["capacity"]["texts_per_s"], 0)]
        cells += [spread_cell(s["paced"][figure], 2) for figure in ("p50_ms", "p99_ms", "p99_from_due_ms")]
        lines.append(f"| {names[model]} | {' | '.join(cells)} | {late} / {unsent} | {failed} |")
    cascade = mf.load(folders["cascade"], verify=False)
    first = cascade.info["cascade"]["members"][0]["bundle"]
    answered_by: Counter = Counter()
    for (_, _, member, flagged), n in answers.items():
        answered_by[member, flagged] += n
    total = sum(answered_by.values())
    escalated = 1 - sum(n for (member, _), n in answered_by.items() if member == first) / total
    routed = routed_escalated(folders["cascade"], answers)
    refused = sum(n for (_, flagged), n in answered_by.items() if flagged)
    lines += [
        "",
        f"Capacity of the cascade: {ratio:.2f}x its last member's.",
        "",
        f"The cascade's {total} answers in these phases: {escalated:.1%} escalated past {first}, where its routing "
        f"run in this process escalates {routed:.1%} of the same texts as often as sent (the whole dev split: "
        f"{cascade.metrics['dev_escalated']:.1%}, from its manifest); {refused} escalations refused by a full queue "
        "(answered by the member before).",
    ]
    markdown = "\n".join(lines) + "\n"
    answered = [(member, flagged, n) for (member, flagged), n in answered_by.items()]
    options = {"concurrency": cfg.concurrency, "rate": cfg.rate, "repeats": cfg.repeats, "duration_s": cfg.duration_s}
    result = CascadeResult(
        names=names,
        runs=runs,
        summary=summary,
        capacity_ratio=ratio,
        answered=answered,
        machine=ran_on,
        options=options,
    )
    result.save(work, markdown)
    console.print(markdown)
    return Built(
        metrics={
            "capacity_ratio": ratio,
            "served_escalated": escalated,
            "routed_escalated": routed,
            "escalation_refused": refused,
            **{f"{model}_capacity_texts_per_s": capacity[model] for model in folders},
            **{f"{model}_paced_p99_ms": summary[model]["paced"]["p99_ms"].median for model in folders},
            **{
                f"{model}_paced_p99_from_due_ms": summary[model]["paced"]["p99_from_due_ms"].median for model in folders
            },
        },
        info={"names": names},
        line=f"capacity {ratio:.2f}x {names['last']}, {escalated:.1%} escalated (routing on the same texts "
        f"{routed:.1%}), {refused} escalations refused; "
        f"paced p99 {summary['cascade']['paced']['p99_ms'].median:.2f} ms "
        f"vs {summary['last']['paced']['p99_ms'].median:.2f} ms",
    )
