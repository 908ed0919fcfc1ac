"""The serving benchmark: the server's latency, capacity and batched throughput on one bundle, against its targets.

One run starts the server (`python -m serve`) and the two baseline servers of `bench.servers` as
subprocesses on loopback and drives them from this process with grpc.aio tasks (`bench.drivers`).
The texts are the recipe's dev split (with their pairs, for a pair model) unless a file is given
(`bench.texts`); one the bundle reads as nothing is refused before anything starts (`check_readable`).
"single-text" below means one example per call, a text and its pair for a pair model.
Each repeat measures, in an order rotated by one phase each repeat (`bench.drivers.rotated`):

- paced: single-text `Classify` calls, one at a time, paced at `rate` for `duration_s`: latency, achieved rate;
  the same against the echo server gives the latency floor of gRPC and this client;
- capacity: single-text calls with `concurrency` in flight, unpaced, against the server, the echo server and
  the bare server (the bundle's tokenizer and backend on the event loop, nothing else: the ceiling of any
  server that runs this model on its event loop);
- batched: 32-text calls, BATCH_CONCURRENCY in flight, against the server (a `MAX_TEXTS` below 32, which would
  refuse them all, is refused before anything starts);
- raw: the bundle's backend in this process (same thread count) on the same texts, tokenized and padded
  into batches of 32: the throughput the server's batched path is compared with.

Settings and targets come from the recipe's `bench.serving` section; server settings also from
`EDGEDISTILL_*` variables, as for `python -m serve`, whose session settings (SPIN, PROVIDERS, ALLOW_CPU_FALLBACK) the
bare server and the raw backend run with too (bench.json's `sessions`: the server's and the bare server's). CPU %
(100 = one core) is recorded for this process and the server, so a client-bound result shows. Each figure is the
median over the repeats with min and max. The result is the artifact `runs/<recipe>/serve-bench-<bundle>/`, one per bundle folder
(`common.measured`): bench.json (a `bench.records.ServingResult`), bench.md, the three servers' logs and the manifest.
"""

import asyncio
import functools
import os
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import numpy as np
from edgedistill.bench import BenchError, drivers, servers, slo
from edgedistill.bench.environ import call_metadata, measured_server, served_settings
from edgedistill.bench.peers.launch import classifier_session
from edgedistill.bench.peers.model import session_of
from edgedistill.bench.ports import free_port
from edgedistill.bench.processes import running, serving
from edgedistill.bench.records import ServingResult, bundle_record, cores_phrase, machine
from edgedistill.bench.stats import pooled, summarize
from edgedistill.bench.tables import (
    markdown_results,
    print_results,
    record_line,
    spread_cell,
    target_rows,
    threads_phrase,
)
from edgedistill.bench.texts import PairsFile, hashed_path, load_groups, load_texts, stdin_for, texts_info
from edgedistill.common import manifest as mf
from edgedistill.common import measured, progress
from edgedistill.common.bundle import Bundle, load_bundle
from edgedistill.common.cascade import is_cascade
from edgedistill.common.config.measure import ServingBenchConfig
from edgedistill.common.console import Console
from edgedistill.common.data import Examples
from edgedistill.common.recipe import Recipe, RecipeError, run_dir
from edgedistill.common.stage import Artifact, Built, Inputs, Stage
from edgedistill.serve.backend import load_backend
from edgedistill.serve.batching import pad_rows
from edgedistill.serve.encoding import TextEncoder
from edgedistill.serve.errors import UnreadableText
from edgedistill.serve.proto import classifier_pb2
from edgedistill.serve.settings import Settings, env_name
from edgedistill.serve.textfiles import numbered_lines, numbered_pairs
from edgedistill.serve.workers import intra_op_threads

STAGE = measured.SERVING
BATCH = 32
BATCH_CONCURRENCY = 4
WARMUP_S = 1.0
PHASES = {  # phase -> table label: calls in flight x texts per call
    "paced": "server, paced {rate:g}/s",
    "echo_paced": "echo, paced {rate:g}/s",
    "capacity": "server {concurrency}x1",
    "echo": "echo {concurrency}x1",
    "bare": "bare server {concurrency}x1",
    "batched": f"server {BATCH_CONCURRENCY}x{BATCH}",
    "raw": f"raw backend 1x{BATCH}",
}


def bundle_to_serve(recipe: Recipe, given: Path | None = None) -> Path:
    """`given` (a command's `--bundle`), else `runs/<recipe>/bundle-<export.deploy>`, resolved."""
    if given is not None:
        return given.resolve()
    if recipe.export is None:
        raise RecipeError(f"recipe {recipe.name} has no `export` section: pass --bundle")
    return (run_dir(recipe) / f"bundle-{recipe.export.deploy}").resolve()


def evaluate(runs: dict[str, list[dict]], cfg: ServingBenchConfig) -> tuple[dict[str, float], list[dict]]:
    """The ratios (of medians over the repeats in `runs`) and a verdict per target the recipe sets: the paced latencies
    are medians, timed from each call's due time (`bench.slo.check_paced`), its error rate that of every repeat's calls
    together (`bench.stats.pooled`), its rate share the least of one repeat."""
    median = {
        phase: {key: spread.median for key, spread in summarize(records).items()} for phase, records in runs.items()
    }
    texts = {phase: figures["texts_per_s"] for phase, figures in median.items()}  # single-text phases: calls/s
    ratios = {
        "capacity_vs_echo": texts["capacity"] / texts["echo"],
        "batched_vs_raw": texts["batched"] / texts["raw"],
        "bare_vs_echo": texts["bare"] / texts["echo"],
        "capacity_vs_bare": texts["capacity"] / texts["bare"],
    }
    least_share = min(record["rate_share"] for record in runs["paced"])
    paced = median["paced"] | pooled(runs["paced"]) | {"rate_share": least_share}
    targets = [v | {"name": f"paced {cfg.rate:g}/s: {v['name']}"} for v in slo.check_paced(paced, cfg.paced_slo)]
    if (least := cfg.min_capacity_vs_echo) is not None:
        measured = ratios["capacity_vs_echo"]
        targets.append(slo.verdict("capacity, server / echo", measured, f">= {least:g}", measured >= least))
    if (least := cfg.min_batched_vs_raw) is not None:
        measured = ratios["batched_vs_raw"]
        targets.append(
            slo.verdict(f"batch-{BATCH} texts/s, server / raw", measured, f">= {least:g}", measured >= least)
        )
    return ratios, targets


def check_readable(
    bundles: list[Bundle], examples: Examples, texts_file: Path | None = None, pairs_file: PairsFile | None = None
) -> None:
    """`BenchError` naming the first of `examples` that one of `bundles` reads as nothing in its text style
    (`serve.encoding.TextEncoder.encode`), which the server would refuse in every call that sends it: by its line in
    `texts_file` or `pairs_file`, else by the examples' source and its text."""
    for bundle in bundles:
        try:
            TextEncoder.for_bundle(bundle).encode(examples.texts, examples.pairs)
        except UnreadableText as err:
            text, pair = examples.texts[err.row], None if examples.pairs is None else examples.pairs[err.row]
            where = line_of(text, pair, texts_file, pairs_file) or examples.source
            unread = text if err.kind == "text" else pair
            raise BenchError(
                f"{where}: {err.kind} {unread!r} holds nothing the tokenizer of {bundle.folder.name} keeps (only "
                f"characters it drops, such as control or zero-width ones{err.note}): the server would refuse every "
                "call that sends it; remove it"
            ) from None


def line_of(text: str, pair: str | None, texts_file: Path | None, pairs_file: PairsFile | None) -> str | None:
    """`FILE:LINE` of the example `text` (with `pair`) in `texts_file` or `pairs_file`, read as `bench.texts` reads
    them; None without either."""
    if texts_file is not None:
        lines = numbered_lines(texts_file, stdin_for(texts_file))
        return next(f"{texts_file}:{number}" for number, line in lines if line.strip() == text)
    if pairs_file is not None:
        path = pairs_file.path
        rows = numbered_pairs(path, pairs_file.header, stdin_for(path), pairs_file.columns, option="--pairs")
        return next(f"{path}:{number}" for number, *example in rows if example == [text, pair])
    return None


def raw_batches(bundle: Bundle, examples: Examples) -> list[dict[str, np.ndarray]]:
    """The examples tokenized with the bundle's tokenizer, padded into batches of BATCH."""
    encoder = TextEncoder.for_bundle(bundle)
    return [pad_rows(encoder.encode(g.texts, g.pairs), encoder.pad_values) for g in load_groups(examples, BATCH)]


def classify_requests(examples: Examples, size: int) -> list[classifier_pb2.ClassifyRequest]:
    """`Classify` requests of `size` examples each (`bench.texts.load_groups`), with their pairs where they have them."""
    return [
        classifier_pb2.ClassifyRequest(texts=group.texts, text_pairs=group.pairs or [])
        for group in load_groups(examples, size)
    ]


async def measure_all(
    cfg: ServingBenchConfig,
    bundle: Bundle,
    logs: Path,
    flags: list[str],
    settings: Settings,
    examples: Examples,
) -> dict[str, list[dict]]:
    """Start the three servers (their logs in `logs`), warm everything up, then run every phase `cfg.repeats`
    times, in an order rotated each repeat, reporting each finished phase as progress."""
    batches = raw_batches(bundle, examples)
    singles = classify_requests(examples, 1)
    grouped = classify_requests(examples, BATCH)
    metadata = call_metadata(settings)
    echo_port, bare_port = free_port(), free_port()
    runs: dict[str, list[dict]] = {phase: [] for phase in PHASES}
    async with AsyncExitStack() as stack:
        backend = load_backend(bundle, settings)
        stack.callback(backend.close)
        server = stack.enter_context(running("edgedistill.serve", flags, settings.port, logs / "server.log"))
        echo = stack.enter_context(serving(servers.command(echo_port), echo_port, logs / "echo.log"))
        bare_command = servers.command(bare_port, bundle.folder, cfg.threads)
        bare = stack.enter_context(serving(bare_command, bare_port, logs / "bare.log"))
        call = await drivers.classify_call(stack, settings.port, metadata)
        echo_call = await drivers.classify_call(stack, echo_port)
        bare_call = await drivers.classify_call(stack, bare_port)
        await drivers.saturate(call, singles, cfg.concurrency, WARMUP_S)
        await drivers.saturate(call, grouped, BATCH_CONCURRENCY, WARMUP_S)
        await drivers.saturate(echo_call, singles, cfg.concurrency, WARMUP_S)
        await drivers.saturate(bare_call, singles, cfg.concurrency, WARMUP_S)
        drivers.infer_for(backend, batches, WARMUP_S)
        seconds, rate = cfg.duration_s, cfg.rate
        phases = {  # phase -> (load, texts per call, server process, offered calls/s)
            "paced": (functools.partial(drivers.paced, call, singles, rate, seconds), 1, server, rate),
            "echo_paced": (functools.partial(drivers.paced, echo_call, singles, rate, seconds), 1, echo, rate),
            "capacity": (functools.partial(drivers.saturate, call, singles, cfg.concurrency, seconds), 1, server, None),
            "echo": (functools.partial(drivers.saturate, echo_call, singles, cfg.concurrency, seconds), 1, echo, None),
            "bare": (functools.partial(drivers.saturate, bare_call, singles, cfg.concurrency, seconds), 1, bare, None),
            "batched": (
                functools.partial(drivers.saturate, call, grouped, BATCH_CONCURRENCY, seconds),
                BATCH,
                server,
                None,
            ),
            "raw": (drivers.infer_in_thread(stack, backend, batches, seconds), BATCH, None, None),
        }
        names = phase_names(cfg.model_dump())
        rounds = progress.bar(cfg.repeats * len(phases), desc=STAGE, unit="phase")
        for repeat in range(1, cfg.repeats + 1):
            for phase in drivers.rotated(list(phases), repeat - 1):
                load, texts_per_call, process, offered = phases[phase]
                what = f"repeat {repeat}/{cfg.repeats} {names[phase]}"
                record = await drivers.measure(load, texts_per_call, process, offered, what)
                runs[phase].append(record)
                rounds.set_postfix_str(f"{what}: {record_line(record)}", refresh=False)
                rounds.update()
        rounds.close()
    return runs


def stage(
    recipe: Recipe,
    bundle_folder: Path,
    texts_file: Path | None = None,
    console: Console | None = None,
    pairs_file: PairsFile | None = None,
) -> Stage:
    """`runs/<recipe>/serve-bench-<bundle>/`: `bundle_folder` measured behind the server against the recipe's
    targets; current while the settings, the dev split, the bundle, the texts and the server's settings are
    unchanged. `BenchError` where the server's MAX_TEXTS is below the batched phase's BATCH texts, whose every call
    it would refuse."""
    server = served_settings(bundle_folder, recipe.bench.serving.threads)
    if server["max_texts"] < BATCH:
        raise BenchError(
            f"{env_name('max_texts')}={server['max_texts']}: the server would refuse every call of the batched phase, "
            f"of {BATCH} texts (RESOURCE_EXHAUSTED); unset it, or set it to {BATCH} or more, to measure"
        )
    return Stage(
        measured.of_bundle(STAGE, bundle_folder, run_dir(recipe)),
        recipe,
        ("bench.serving", "data"),
        functools.partial(_build, texts_file=texts_file, pairs_file=pairs_file, console=console or Console(width=200)),
        (Artifact(measured.BUNDLE, bundle_folder),),
        extra={
            "texts": None if texts_file is None else hashed_path(texts_file),
            "pairs": None if pairs_file is None else pairs_file.hashed(),
            "server": server,
        },
    )


def _build(inputs: Inputs, texts_file: Path | None, pairs_file: PairsFile | None, console: Console) -> Built:
    cfg = inputs.recipe.bench.serving
    bundle_folder = inputs.parent(measured.BUNDLE)
    if is_cascade(bundle_folder):
        raise BenchError(
            f"{bundle_folder} is a cascade: its members have no single backend for the raw and bare phases; measure it "
            "with `edgedistill bench cascade RECIPE --cascade NAME` (NAME: its key in export.cascades; without --cascade, "
            "the deployed cascade, else the first)"
        )
    bundle = load_bundle(bundle_folder)
    examples = load_texts(inputs.recipe.data, bundle.spec.pairs, texts_file, pairs_file, takes_files=True)
    check_readable([bundle], examples, texts_file, pairs_file)
    flags, settings = measured_server(bundle_folder, cfg.threads)
    work = inputs.fresh_work()
    load_before = os.getloadavg()
    runs = asyncio.run(measure_all(cfg, bundle, work, flags, settings, examples))
    summary = {phase: summarize(records) for phase, records in runs.items()}
    ratios, targets = evaluate(runs, cfg)
    result = ServingResult(
        bundle=bundle_record(bundle_folder, bundle.spec),
        settings=settings.model_dump(mode="json", exclude={"token", "port"})
        | {"sessions": {"server": session_of(settings), "bare": classifier_session(cfg.threads)}},
        options=cfg.model_dump(include={"rate", "duration_s", "concurrency", "threads", "repeats"})
        | {
            "batch": BATCH,
            "batch_concurrency": BATCH_CONCURRENCY,
            "intra_op_threads": intra_op_threads(cfg.threads, 1),
        },
        texts=texts_info(examples),
        machine=machine(load_before, versions=mf.package_versions()),
        runs=runs,
        summary=summary,
        ratios=ratios,
        targets=targets,
        passed=all(t["passed"] for t in targets),
    )
    result.save(work, markdown(result))
    print_tables(result, console)
    failed = result.failed_calls()
    return Built(
        metrics={
            "paced_p99_ms": result.median("paced", "p99_ms"),
            "paced_p99_from_due_ms": result.median("paced", "p99_from_due_ms"),
            "capacity_calls_per_s": result.median("capacity", "texts_per_s"),
            **ratios,
            "failed_calls": failed,
            "passed": result.passed,
        },
        info={"bench": cfg.model_dump(mode="json"), "targets": targets},
        line=(slo.missed(targets) or f"every target met on {bundle_folder.name}")
        + (f"; {failed} calls failed" if failed else ""),
    )


COLUMNS = {  # figure -> table column
    "requests_per_s": "calls/s",
    "texts_per_s": "texts/s",
    "p50_ms": "p50 ms",
    "p95_ms": "p95 ms",
    "p99_ms": "p99 ms",
    "max_ms": "max ms",
    "failures": "errors",
    "client_cpu": "client CPU %",
    "server_cpu": "server CPU %",
}


def phase_names(options: dict) -> dict[str, str]:
    """Each phase's name in the tables, with the run's `options` (`server, paced 200/s`)."""
    return {phase: label.format(**options) for phase, label in PHASES.items()}


def table_rows(result: ServingResult) -> list[list[str]]:
    names = phase_names(result.options)
    return [
        [names[phase]] + [spread_cell(figures.get(key), 2 if key.endswith("_ms") else 0) for key in COLUMNS]
        for phase, figures in result.summary.items()
    ]


def heading(result: ServingResult) -> str:
    o, b, t = result.options, result.bundle, result.texts
    threads = o.get("intra_op_threads", o["threads"])  # what the servers ran; a result of an earlier release has none
    return (
        f"{b['name']} ({b['arch']}, {b['precision']}, {b['runtime']}), {threads_phrase(b, threads)}, "
        f"{cores_phrase(result.machine)}; median (min-max) of {o['repeats']} repeats of {o['duration_s']:g} s; "
        f"{t['count']} {'text pairs' if t['pairs'] else 'texts'} from {t['source']}"
    )


def baseline_line(result: ServingResult) -> str:
    return (
        f"The bare server (this bundle's tokenizer and backend on the event loop, nothing else) reached "
        f"{result.ratios['bare_vs_echo']:.2f} of the echo server's calls/s; the server reached "
        f"{result.ratios['capacity_vs_bare']:.2f} of the bare server's."
    )


def failed_calls(result: ServingResult) -> dict[str, Counter]:
    """The failed calls of every phase that had any, by status code, summed over the repeats."""
    failed = {}
    for phase, records in result.runs.items():
        codes = Counter()
        for record in records:
            codes.update(record.get("error_codes", {}))
        if codes:
            failed[phase] = codes
    return failed


def failures_line(result: ServingResult) -> str | None:
    """Which phases had failed calls, by status code, over all repeats; None when every call succeeded."""
    if not (failed := failed_calls(result)):
        return None
    names = phase_names(result.options)
    phases = "; ".join(
        f"{names[phase]}: " + ", ".join(f"{code} {count}" for code, count in codes.most_common())
        for phase, codes in failed.items()
    )
    return f"Failed calls over the repeats ({phases}): calls/s and texts/s count successful calls only."


def due_line(result: ServingResult) -> str:
    """The paced phases' p99 timed from each call's due time, the calls sent late and those never sent, over the
    repeats."""
    names = phase_names(result.options)
    phases = "; ".join(
        f"{names[phase]} {spread_cell(result.summary[phase]['p99_from_due_ms'], 2)} ms, "
        f"{sum(record['late_calls'] for record in result.runs[phase])} calls sent late, "
        f"{sum(record['unsent_calls'] for record in result.runs[phase])} never sent"
        for phase in ("paced", "echo_paced")
    )
    return (
        f"Paced p99 timed from each call's due time, so that a slow call's delay to the calls due behind it counts "
        f"({phases} over the repeats)."
    )


def markdown(result: ServingResult) -> str:
    lines = [f"Serving benchmark: {heading(result)}.", ""]
    lines += markdown_results(["phase", *COLUMNS.values()], table_rows(result), ("target", target_rows(result.targets)))
    if failures := failures_line(result):
        lines += ["", failures]
    lines += ["", due_line(result), "", baseline_line(result)]
    lines += [
        "",
        "CPU %: 100 = one core. Client CPU near 100 % means the client, not the server, limited the rate;",
        "for the raw backend it is the benchmark process running the model.",
    ]
    return "\n".join(lines) + "\n"


def print_tables(result: ServingResult, console: Console) -> None:
    header = ["phase", *COLUMNS.values()]
    print_results(
        console, heading(result), header, table_rows(result), ("targets", "target", target_rows(result.targets))
    )
    if failures := failures_line(result):
        console.print(failures)
    console.print(due_line(result))
    console.print(baseline_line(result))
