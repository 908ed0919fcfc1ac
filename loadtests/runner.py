"""Run one load-test profile: serve the bundle, drive it with locust, write `runs/<recipe>/loadtest-<profile>-<id>/`.

The server (`python -m serve`) and locust (headless, `loadtests/locustfile.py`) run as subprocesses
on loopback; this process samples their CPU and the server's RSS twice a second. The folder is
built under a temporary name and renamed into place with its manifest: plan.json, texts.txt (and
pairs.txt, for a pair model), requests.npz (every call), locust's CSV files (`locust_stats.csv`, `locust_stats_history.csv`, ...;
their percentiles are rounded to whole ms) and HTML report (`report.html`), server.log, locust.log,
summary.json and summary.md (see `loadtests.result`).
"""

import csv
import math
import os
import site
import sys
import threading
import time
from functools import partial
from pathlib import Path

import psutil
from edgedistill.bench.environ import measured_server, served_settings
from edgedistill.bench.processes import cpu_seconds, log_tail, running, start
from edgedistill.bench.records import machine
from edgedistill.bench.texts import PairsFile, hashed_path, load_texts, texts_info
from edgedistill.common import manifest as mf
from edgedistill.common import measured, sections
from edgedistill.common.cascade import load_served
from edgedistill.common.config.measure import LoadtestConfig, Profile
from edgedistill.common.console import Console
from edgedistill.common.processes import python_module
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.stage import Artifact, Built, Inputs, Stage
from edgedistill.common.text import write_texts
from edgedistill.loadtests import live
from edgedistill.loadtests import result as rs
from edgedistill.loadtests.analysis import Resources, Samples
from edgedistill.loadtests.plan import PLAN_VAR, Plan
from edgedistill.loadtests.recorder import SAMPLES_FILE

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"  # package data, beside this module
SAMPLE_S = 0.5
EXIT_MARGIN_S = 60.0  # locust's start-up and shutdown on top of the schedule
LOCUST_PREFIX = "LOCUST_"  # locust's options from the environment
CONFIG_FILE = "~/.locust.conf"  # the first of the files locust reads its options from
ECHO_SCENARIOS = {"single", "batch"}  # the echo server implements Classify alone
ECHO_TARGET = {"name": "echo server (no model)", "version": "-", "arch": "echo", "precision": "-", "runtime": "-"}


class LoadtestError(RuntimeError):
    """The load test could not run: locust failed or hung, or the settings rule the run out."""


class Sampler(threading.Thread):
    """Rows of (monotonic time, server CPU s, locust CPU s, server RSS bytes) every SAMPLE_S until `stop`: the
    system's monotonic clock, as the recorder in locust's process keeps it."""

    def __init__(self, server: psutil.Process, locust: psutil.Process):
        super().__init__(daemon=True)
        self.server, self.locust = server, locust
        self.rows: list[tuple[float, float, float, float]] = []
        self._done = threading.Event()

    def run(self) -> None:
        while True:
            try:
                row = (
                    time.monotonic(),
                    cpu_seconds(self.server),
                    cpu_seconds(self.locust),
                    self.server.memory_info().rss,
                )
            except psutil.Error:  # locust has exited
                return
            self.rows.append(row)
            if self._done.wait(SAMPLE_S):
                return

    def stop(self) -> list[tuple[float, float, float, float]]:
        self._done.set()
        self.join()
        return self.rows


def locust_environ(folder: Path) -> dict[str, str]:
    """The environment of locust run in `folder`: this one with the plan, less the `LOCUST_*` variables, with HOME
    `folder`, where locust finds no `~/.locust.conf`. Either would set options of locust's that the run leaves to their
    defaults (forked workers, a master waiting for workers, tags that leave no task); those left out are named on
    stderr."""
    left_out = sorted(name for name in os.environ if name.startswith(LOCUST_PREFIX))
    left_out += [CONFIG_FILE] if os.path.isfile(os.path.expanduser(CONFIG_FILE)) else []
    if left_out:
        print(f"[loadtest] locust runs without {', '.join(left_out)}: the load test sets its options", file=sys.stderr)
    kept = {name: value for name, value in os.environ.items() if not name.startswith(LOCUST_PREFIX)}
    # PYTHONUSERBASE: the user's site-packages (pip install --user), which Python finds under HOME
    return kept | {PLAN_VAR: str(folder / "plan.json"), "HOME": str(folder), "PYTHONUSERBASE": site.getuserbase()}


def drive(folder: Path, port: int, server: psutil.Process, seconds: float, call_timeout_s: float) -> list[tuple]:
    """Run headless locust on the plan in `folder` against `port`; the process samples taken meanwhile.

    A user that stops (a spike's end, the end of the run) finishes the call it is making, which ends within
    `call_timeout_s`: locust would otherwise kill it mid-call, and the call, typically a slow one, would be in
    no figure.
    """
    stop_timeout_s = math.ceil(call_timeout_s)
    # locust runs in `folder`: it puts its working directory first on sys.path (-P or not) before it loads the
    # locustfile, where a checkout's top folder `edgedistill/` would hide an installed wheel's stages, and it reads a
    # locust.conf there; the run folder holds neither
    folder = folder.absolute()
    command = python_module("locust", "-f", str(LOCUSTFILE), "--headless", "--host", f"127.0.0.1:{port}")
    command += ["--csv", str(folder / "locust"), "--csv-full-history", "--html", str(folder / "report.html")]
    command += ["--only-summary", "--exit-code-on-error", "0", "--stop-timeout", str(stop_timeout_s)]
    log = folder / "locust.log"
    process = start(command, log, locust_environ(folder), cwd=folder)
    sampler = Sampler(server, psutil.Process(process.pid))
    sampler.start()
    code = live.follow(process, folder / "locust_stats_history.csv", seconds, seconds + stop_timeout_s + EXIT_MARGIN_S)
    rows = sampler.stop()
    if code != 0:
        outcome = "hung" if code is None else f"exited with {code}"
        raise LoadtestError(f"locust {outcome}; its log ends:\n{log_tail(log)}")
    return rows


def task_errors(folder: Path) -> int:
    """Exceptions raised in locust tasks (bugs in the scenarios, not failed calls), from locust_exceptions.csv."""
    with open(folder / "locust_exceptions.csv", newline="") as handle:
        return sum(int(row["Count"]) for row in csv.DictReader(handle))


def hashed_settings(profile: Profile) -> tuple[str, ...]:
    """The recipe settings a load test of `profile` hashes: the dev split, the settings every profile shares and its
    own profile's; another profile's change measures nothing again."""
    return ("data", *sections.LOADTEST, f"loadtest.{profile}")


def stage(
    recipe: Recipe,
    profile: Profile,
    bundle: Path,
    texts_file: Path | None = None,
    scenarios: dict[str, int] | None = None,
    console: Console | None = None,
    echo: bool = False,
    pairs_file: PairsFile | None = None,
) -> Stage:
    """`profile` of the recipe's `loadtest` section against `bundle` (`loadtest-<profile>-<bundle id>/`, one per
    bundle folder (`common.measured`); result: see `loadtests.result`), with the texts of `texts_file` or the pairs
    of `pairs_file` (`bench.texts`: default, the recipe's dev split). With `echo`, the same load goes to the
    do-nothing echo server instead (`loadtest-<profile>-echo/`, whatever the bundle): the latency floor of gRPC and
    locust on this machine, to tell the server's cost from the client's. Current while the settings, dev split,
    bundle, texts, scenarios and the server's settings (`EDGEDISTILL_*` variables) are unchanged.
    """
    cfg = recipe.loadtest or LoadtestConfig()
    scenarios = scenarios or cfg.profile(profile).scenarios
    if echo and (unsupported := sorted({name for name, weight in scenarios.items() if weight} - ECHO_SCENARIOS)):
        raise LoadtestError(
            f"the echo server answers Classify only; drop scenarios {unsupported} or give them weight 0 (--scenarios)"
        )
    folder = (
        measured.echo_loadtest(profile)
        if echo
        else measured.of_bundle(measured.loadtest(profile), bundle, run_dir(recipe))
    )
    if not echo and folder == measured.echo_loadtest(profile):
        raise LoadtestError(f"{bundle}: its load test would share the echo server's folder {folder}: rename the bundle")
    server = served_settings(bundle, cfg.threads)  # what a measured server refuses, refused here, current or not
    if scenarios.get("batch") and cfg.batch_size > server["max_texts"]:  # the one scenario sending several texts
        raise LoadtestError(
            f"loadtest.batch_size={cfg.batch_size} exceeds the server's max_texts={server['max_texts']}: lower it, "
            "or give the batch scenario weight 0 (--scenarios)"
        )
    if echo:  # not a parent, but its texts are of the bundle's kind: a finished one, as for the bundle's own test
        mf.load(bundle, verify=False)
    return Stage(
        folder,
        recipe,
        hashed_settings(profile),
        partial(
            _build,
            profile=profile,
            bundle=bundle,
            texts_file=texts_file,
            pairs_file=pairs_file,
            scenarios=scenarios,
            echo=echo,
            console=console or Console(width=200),
        ),
        () if echo else (Artifact(measured.BUNDLE, bundle),),
        extra={
            "texts": None if texts_file is None else hashed_path(texts_file),
            "pairs": None if pairs_file is None else pairs_file.hashed(),
            "scenarios": scenarios,
            "echo": echo,
            "server": None if echo else server,
        },
    )


def _build(
    inputs: Inputs,
    profile: Profile,
    bundle: Path,
    texts_file: Path | None,
    pairs_file: PairsFile | None,
    scenarios: dict[str, int],
    echo: bool,
    console: Console,
) -> Built:
    recipe = inputs.recipe
    cfg = recipe.loadtest or LoadtestConfig()
    loaded = load_served(bundle)
    examples = load_texts(recipe.data, loaded.pairs, texts_file, pairs_file, takes_files=True)
    flags, settings = measured_server(bundle, cfg.threads)  # the sampler watches one server process
    work = inputs.fresh_work()
    plan = Plan(
        profile=profile,
        loadtest=cfg,
        scenarios=scenarios,
        model=loaded.name,
        texts=Path("texts.txt"),
        pairs=None if examples.pairs is None else Path("pairs.txt"),
        samples=Path(SAMPLES_FILE),
    )
    (work / "plan.json").write_text(plan.model_dump_json(indent=1), encoding="utf-8")
    try:
        write_texts(work / "texts.txt", examples.texts)
        if examples.pairs is not None:
            write_texts(work / "pairs.txt", examples.pairs)
    except ValueError as err:
        raise LoadtestError(
            f"{examples.source}: {err}; the load test sends its texts from such a file: remove it"
        ) from None
    load_before = os.getloadavg()
    console.print(f"[dim]{profile}: {plan.duration_s:g} s of load on {bundle.name}[/]")
    module, args = (
        ("edgedistill.bench.servers", ["--port", str(settings.port)]) if echo else ("edgedistill.serve", flags)
    )
    with running(module, args, settings.port, work / "server.log") as server:
        rows = drive(work, settings.port, server, plan.duration_s, cfg.timeout_s)
    samples = Samples.load(work / SAMPLES_FILE)
    target = ECHO_TARGET if echo else loaded.description
    context = {
        "recipe": recipe.name,
        "echo": echo,
        "bundle": {"path": None if echo else str(bundle)} | target,
        "server": None if echo else settings.model_dump(mode="json", exclude={"token", "port", "bundle"}),
        "texts": texts_info(examples),
        "machine": machine(load_before),
    }
    result = rs.build(plan, samples, Resources.from_rows(rows, samples.started), task_errors(work), context)
    rs.save(work, result)
    rs.show(result, console)
    missed = sum(not check["passed"] for check in result["checks"])
    return Built(
        metrics=rs.headline(result),
        info={"profile": profile, "echo": echo, "checks": result["checks"]},
        line=f"{len(result['checks']) - missed} of {len(result['checks'])} SLO checks met",
    )
