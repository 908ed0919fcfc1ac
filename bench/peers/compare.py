"""The peer comparison: the server against the Python servers a user would pick instead, on one bundle.

Every server (`bench.peers.launch`: edgedistill with `workers` processes, KServe's `ModelServer`, MLServer, and
the echo floor) runs at once on loopback and answers the same KServe v2 `ModelInfer` call: one example of the
recipe's dev split (the one of median length among the 512 the serving benchmark samples, with its pair for a pair
model), `logits` requested. Each server is first probed (its reply must carry the bundle's logits, computed
here, and gives the reply size that h2load's counts are checked against, see `bench.h2load`) and
loaded for `warmup_s`. Then, `repeats` times, the servers in a rotating order, h2load runs two
phases on each: capacity (`connections` x `streams` calls in flight, every stream busy) and paced at
`rate` calls/s over `paced_connections`, each from its own h2load process started 1/`rate` s after the
last, so that their calls interleave (one h2load paces its connections together, in bursts). The result
is the artifact `runs/<recipe>/serve-peers-<bundle>/`, one per bundle folder (`common.measured`): bench.json (a
`bench.records.ServingResult`), bench.md, every server's log.
"""

import functools
import os
import subprocess
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
from edgedistill.common.config.measure import PeersBenchConfig
from edgedistill.common.console import Console
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.stage import Artifact, Built, Inputs, Stage

STAGE = measured.PEERS


def peer_version(python: Path, peer: str) -> str:
    """`peer`'s package version in the environment of `python`; `BenchError` naming the set-up command when it is not
    installed there."""
    code = f"import importlib.metadata as m; print(m.version({peer!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if done.returncode:
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"
        raise BenchError(f"no {peer} in {python} ({why}); run `make peers-setup` (or pass --{peer}-python)")
    return done.stdout.strip()


def environments(peers: list[str], pythons: dict[str, Path | None]) -> dict[str, tuple[Path, str]]:
    """Each of `peers`' interpreter (`launch.peer_python`, from `pythons` where given) and its package version;
    `BenchError` naming the set-up command when one is missing."""
    found = {peer: launch.peer_python(peer, pythons.get(peer)) for peer in peers}
    return {peer: (python, peer_version(python, peer)) for peer, python in found.items()}


def evaluate(summary: dict, cfg: PeersBenchConfig) -> tuple[dict[str, float], list[dict]]:
    """Ratios of the server's medians to the best peer's and to echo, and a verdict per target the recipe sets."""

    def median(server: str, phase: str, figure: str) -> float:
        return summary[f"{server} {phase}"][figure].median

    require_answered(summary)
    capacity = {server: median(server, CAPACITY, "requests_per_s") for server in ["edgedistill", *cfg.peers]}
    p99 = {server: median(server, PACED, "p99_ms") for server in ["edgedistill", *cfg.peers]}
    best_capacity, best_p99 = max(capacity[p] for p in cfg.peers), min(p99[p] for p in cfg.peers)
    ratios = {
        "capacity_vs_best_peer": capacity["edgedistill"] / best_capacity,
        "p99_vs_best_peer": p99["edgedistill"] / best_p99,
        "capacity_vs_echo": capacity["edgedistill"] / median("echo", CAPACITY, "requests_per_s"),
    } | {f"capacity_vs_{p}": capacity["edgedistill"] / capacity[p] for p in cfg.peers}
    targets = []
    if (least := cfg.min_capacity_vs_best_peer) is not None:
        measured = ratios["capacity_vs_best_peer"]
        targets.append(slo.verdict("calls/s at saturation / best peer's", measured, f">= {least:g}", measured >= least))
    if (most := cfg.max_p99_vs_best_peer) is not None:
        measured = ratios["p99_vs_best_peer"]
        name = f"p99 at {cfg.rate:g} calls/s / best peer's"
        targets.append(slo.verdict(name, measured, f"<= {most:g}", measured <= most))
        sides = ["edgedistill", min(cfg.peers, key=p99.__getitem__)]
        paced = [summary[f"{side} {PACED}"] for side in sides]
        targets.append(slo.no_failed_calls(sides, [figures["failures"].max for figures in paced]))
        targets.append(slo.paced_share(sides, [figures["rate_share"].min for figures in paced]))
    return ratios, targets


def stage(
    recipe: Recipe, bundle_folder: Path, peers: dict[str, tuple[Path, str]], console: Console | None = None
) -> Stage:
    """`runs/<recipe>/serve-peers-<bundle>/`: `bundle_folder` behind the server and its `peers` (the recipe's, with
    their `environments`); current while the settings, the dev split, the bundle, the server's settings and each peer's
    interpreter and package version are unchanged."""
    # the interpreter as a URI, which the stage hashes as written: a path it would hash by the interpreter's bytes,
    # which every environment made from one Python shares
    recorded = {peer: {"python": python.as_uri(), "version": version} for peer, (python, version) in peers.items()}
    return Stage(
        measured.of_bundle(STAGE, bundle_folder, run_dir(recipe)),
        recipe,
        ("bench.peers", "data"),
        functools.partial(_build, peers=peers, console=console or Console(width=200)),
        (Artifact(measured.BUNDLE, bundle_folder),),
        extra={"server": served_settings(bundle_folder, recipe.bench.peers.threads), "peers": recorded},
    )


def _build(inputs: Inputs, peers: dict[str, tuple[Path, str]], console: Console) -> Built:
    cfg = inputs.recipe.bench.peers
    bundle_folder = inputs.parent(measured.BUNDLE)
    if is_cascade(bundle_folder):
        raise BenchError(f"{bundle_folder} is a cascade: the peers serve one model; compare one of its members")
    interpreters = {peer: peers[peer][0] for peer in cfg.peers}
    example = Example.of(inputs.recipe.data, bundle_folder, cfg.threads)
    work = inputs.fresh_work()
    servers = launched(cfg, bundle_folder, example.spec.name, interpreters, work)
    load_before = os.getloadavg()
    runs = measure(cfg, servers, example, work)
    summary = {key: summarize(records) for key, records in runs.items()}
    ratios, targets = evaluate(summary, cfg)
    result = ServingResult(
        bundle=bundle_record(bundle_folder, example.spec),
        settings={
            name: {"command": server.command, "workers": server.workers, "session": server.session}
            for name, server in servers.items()
        },
        options=cfg.model_dump(mode="json"),
        texts={"text": example.text, "pair": example.pair, "source": inputs.recipe.data.dev},
        machine=machine(
            load_before,
            versions=mf.package_versions()
            | {peer: peers[peer][1] for peer in cfg.peers}
            | {"h2load": h2load.version()},
        ),
        runs=runs,
        summary=summary,
        ratios=ratios,
        targets=targets,
        passed=all(t["passed"] for t in targets),
    )
    result.save(work, markdown(result))
    print_results(
        console, heading(result), HEADER, table_rows(result), ("targets", "target", target_rows(result.targets))
    )
    return Built(
        metrics=ratios | {"passed": result.passed},
        info={"bench": cfg.model_dump(mode="json"), "targets": targets},
        line=(
            f"{ratios['capacity_vs_best_peer']:.2f}x the best peer's calls/s, p99 {ratios['p99_vs_best_peer']:.2f}x"
            + (f"; {missed}" if (missed := slo.missed(targets)) else "")
        ),
    )


def launched(
    cfg: PeersBenchConfig, bundle: Path, model: str, interpreters: dict[str, Path], work: Path
) -> dict[str, launch.Server]:
    """How to start each server of the comparison on `bundle` (`model`: the server's name for it), the peers from
    `interpreters`; the server and MLServer with the same count of workers, `cfg.workers` resolved once, in the memory
    both share."""
    workers = launch.resolved_workers(cfg.workers, bundle, servers=2 if "mlserver" in cfg.peers else 1)
    servers = {"edgedistill": launch.edgedistill(bundle, model, cfg.threads, workers)}
    if "kserve" in interpreters:
        servers["kserve"] = launch.kserve(interpreters["kserve"], bundle, cfg.threads)
    if "mlserver" in interpreters:
        servers["mlserver"] = launch.mlserver(interpreters["mlserver"], bundle, cfg.threads, workers, work / "mlserver")
    return servers | {"echo": launch.echo()}


def measure(
    cfg: PeersBenchConfig, servers: dict[str, launch.Server], example: Example, work: Path
) -> dict[str, list[dict]]:
    """Start every server, probe and warm each once every worker serves (`bench.targets.started`), then run both
    phases on each, `cfg.repeats` times in a rotating order (`h2load.interleaved`)."""
    loads = phases(cfg, h2load.Load(cfg.connections, cfg.streams, cfg.duration_s))
    warm = h2load.Load(cfg.connections, cfg.streams, cfg.warmup_s)
    with ExitStack() as stack:
        targets = {
            name: started(
                stack, server, name, (work / f"{name}.log", work / f"{name}.request"), example, loads, warm, work
            )
            for name, server in servers.items()
        }
        return h2load.interleaved(targets, cfg.repeats, work, STAGE)


HEADER = ["server", "phase", *H2LOAD_COLUMNS.values()]


def table_rows(result: ServingResult) -> list[list[str]]:
    return h2load_rows(result.summary, result.options["rate"])


def heading(result: ServingResult) -> str:
    o, b = result.options, result.bundle
    workers = result.settings["edgedistill"]["workers"]
    return (
        f"{b['name']} ({b['arch']}, {b['precision']}, {b['runtime']}) behind each server, "
        f"{threads_phrase(b, o['threads'])}, {workers} worker(s) where a server has them, "
        f"{cores_phrase(result.machine)}; h2load, saturated over {o['connections']} connection(s) x "
        f"{o['streams']} streams, paced over {o['paced_connections']}; median (min-max) of {o['repeats']} repeats of {o['duration_s']:g} s"
    )


def markdown(result: ServingResult) -> str:
    lines = [f"Peer comparison: {heading(result)}.", ""]
    lines += markdown_results(HEADER, table_rows(result), ("target", target_rows(result.targets)))
    if failures := h2load_failures_line(result.runs, result.options["rate"]):
        lines += ["", failures]
    versions = result.machine["versions"]
    lines += [
        "",
        *H2LOAD_LEGEND,
        f"includes its child processes. Peers: {', '.join(f'{p} {versions[p]}' for p in result.options['peers'])}; "
        f"h2load {versions['h2load']}.",
    ]
    return "\n".join(lines) + "\n"
