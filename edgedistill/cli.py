"""`edgedistill <command> [args]`: every stage of the pipeline, the server and its client as one command.

Each command hands its arguments to a stage's own entry point (`python -m distill teacher ...` and the
others) and imports that stage only when it runs, so `edgedistill --help` and `edgedistill serve` load no
torch. `edgedistill all RECIPE` runs the stages of `make all`, one process each, and stops at the first
that fails, with its exit status; a smoke load test that misses its SLO (exit 1) is the exception, as in `make all`:
the report and the headline are still written, and the command then exits 1.
"""

import argparse
import contextlib
import errno
import importlib
import io
import os
import shlex
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import NoReturn

from edgedistill.common import guide
from edgedistill.common.arguments import ArgumentParser, WholeWordsHelp, count
from edgedistill.common.grpc_core import quiet_grpc_core
from edgedistill.common.processes import (
    Terminated,
    dying_with_this_process,
    python_module,
    shell_status,
    terminated_as_interrupted,
)
from edgedistill.common.settings import SettingError

PROG = "edgedistill"
# a full, read-only or foreign runs folder, or a file past `ulimit -f`
CANNOT_WRITE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG)
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
TERMINATED = 143  # 128 + SIGTERM, likewise
SLO_MISSED = 1  # a load test that measured and missed its SLO, as `python -m loadtests` exits
CRASHED = 70  # EX_SOFTWARE (sysexits.h): not Python's 1, which means a missed gate, target or SLO
READER_GONE = 141  # 128 + SIGPIPE, as a shell reports a writer whose reader stopped early (`| head`)
EXIT_STATUSES = (
    "Exit status: 0 done (or up to date); 1 a check failed (a bundle's gate, a benchmark's target with --check, a "
    "load test's SLO, a failed call); 2 bad arguments, recipe, input or artifacts, or a machine that "
    f"cannot run it; {INTERRUPTED} interrupted (Ctrl-C); {TERMINATED} stopped by SIGTERM; {READER_GONE} the reader of its output stopped early (| head); "
    f"{CRASHED} an unexpected error (a traceback)."
)
SERVE_EXIT_STATUSES = (  # serve.app's and its supervisor's, beside those of EXIT_STATUSES
    f"{PROG} serve has its own besides: 3 after a fault, 71 a worker that could not be started, 128 + N killed by "
    "signal N (or a worker, under WORKERS)"
)
BUILD_NOTHING = ("serve", "call", "headline", "proto")  # the commands that publish no artifact
STOPPED_BUILDING = "; no artifact was half written: run it again to go on"
GOES_ON_FROM = {  # where a command run again after Ctrl-C goes on from, beyond the artifacts it finished
    **dict.fromkeys(("pretrain", "finetune", "teacher", "distill"), "training resumes from its last checkpoint"),
    "transfer": "labelling resumes from its finished shards",
}
FORCED_AGAIN = "to build only those left, name them: docs/training.md, Resume"
JOBS = 2  # students trained at once by `all`, as `make all` does
LOADTEST_PROFILE = "smoke"  # the load test `all` runs, as `make all` does
DISTILL = "edgedistill.distill.__main__"  # python -m distill <stage>
EXPORT = "edgedistill.export.__main__"  # python -m export <command>


@dataclass(frozen=True)
class Command:
    """A subcommand: the module whose `main(argv, prog=...)` runs it and the install extra its imports need."""

    help: str
    module: str
    extra: str
    dispatches: bool = False  # the module's own parser takes the command's name first: `python -m distill teacher`

    def run(self, name: str, argv: list[str]) -> int:
        quiet_grpc_core()  # read as gRPC is imported
        main = importlib.import_module(self.module).main
        if self.dispatches:
            return main([name, *argv], prog=PROG)  # its subparser's usage reads `edgedistill <name>`
        return main(argv, prog=f"{PROG} {name}")


COMMANDS = {
    "pretrain": Command(
        "pretrain the teacher language model (recipes with a `pretrain` section)", DISTILL, "train", True
    ),
    "finetune": Command("fine-tune the teacher for classification", DISTILL, "train", True),
    "teacher": Command("pretrain (if the recipe says so) and fine-tune the teacher", DISTILL, "train", True),
    "labeller": Command(
        "build the bundle `transfer.labeller` names, which labels the transfer set on the CPU", EXPORT, "export", True
    ),
    "transfer": Command("build the transfer set and label it with the teacher", DISTILL, "train", True),
    "distill": Command(
        "distil every student of the recipe and train their baselines, then print the table", DISTILL, "train", True
    ),
    "bundles": Command(
        "build every bundle of the recipe, each checked against PyTorch and gated, then its cascades",
        EXPORT,
        "export",
        True,
    ),
    "triton-repo": Command("a Triton model repository for a bundle", "edgedistill.export.triton", "export"),
    "bench": Command(
        "benchmarks: models, serving, accuracy, cascade, peers or scaling", "edgedistill.bench.__main__", "bench"
    ),
    "serve": Command("serve a bundle over gRPC (Classifier and KServe v2)", "edgedistill.serve.__main__", "serve"),
    "call": Command("classify texts with a running server", "edgedistill.serve.call", "serve"),
    "loadtest": Command(
        "load-test a served bundle with locust, gated on the recipe's SLO", "edgedistill.loadtests.__main__", "loadtest"
    ),
    "report": Command(
        "the run report (HTML and markdown) from every finished stage", "edgedistill.report.__main__", "report"
    ),
    "headline": Command("the headline figures of a run", "edgedistill.report.headline", "report"),
    "proto": Command("regenerate the gRPC modules from the .proto files", "edgedistill.serve.proto.generate", "dev"),
}
ALL_HELP = "the whole pipeline on a recipe, as `make all` runs it"


# The commands `edgedistill all` runs, in order, as `common.sections` names them; those that build or measure first
BUILDING = (
    "teacher",
    "labeller",
    "transfer",
    "distill",
    "bundles",
    "bench models",
    "bench serving",
    "bench accuracy",
    "bench cascade",
    "loadtest",
    "report",
)
STEPS = (*BUILDING, "headline")
# the optional recipe sections those of `STEPS` need that fail without them; the others run on any recipe
NEEDS = {
    "labeller": ("transfer", "export"),  # a bundle of `export` that `transfer.labeller` names
    "transfer": ("transfer", "distill"),  # checks the students before labelling
    "distill": ("transfer", "distill"),
    **dict.fromkeys(
        ("bundles", "bench models", "bench serving", "bench accuracy", "bench cascade", "loadtest"), ("export",)
    ),
}


def pipeline(recipe: str, jobs: int, overrides: list[str], force: bool = False) -> list[list[str]]:
    """The arguments of each of `STEPS`, in order, each with the recipe overrides of the sections it reads
    (`forwarded`) and, with `force`, each that builds or measures with `--force`."""
    from edgedistill.common.sections import loadtest

    options = {"distill": ["--jobs", str(jobs)], "loadtest": ["--profile", LOADTEST_PROFILE]}
    read_as = {"loadtest": loadtest(LOADTEST_PROFILE)}  # a load test reads its own profile's settings
    given = forwarded(recipe, overrides, [read_as.get(command, command) for command in STEPS])
    again = ["--force"] if force else []
    return [
        [*command.split(), recipe, *options.get(command, []), *extra, *(again if command in BUILDING else [])]
        for command, extra in zip(STEPS, given, strict=True)
    ]


def forwarded(recipe: str, overrides: list[str], commands: list[str]) -> list[list[str]]:
    """For each of `commands`, those of `overrides` it takes (`taken`); one that none of them reads is refused
    (`RecipeError`)."""
    from edgedistill.common.recipe import RecipeError, parse_overrides
    from edgedistill.common.sections import readers, scope

    given = taken(recipe, overrides, commands)
    keys = [next(iter(parse_overrides([override]))) for override in overrides]
    read = {key for arg, key in zip(overrides, keys, strict=True) if any(arg in args for args in given)}
    if unread := [key for key in dict.fromkeys(keys) if key not in read]:
        raise RecipeError(
            "; ".join(
                f"--{key}: no command {PROG} all runs reads {scope(key)}, so the override would change nothing: drop "
                f"it, or give it to {' or '.join(f'{PROG} {c}' for c in readers(key))}"
                for key in unread
            )
        )
    return given


def taken(recipe: str, overrides: list[str], commands: list[str]) -> list[list[str]]:
    """For each of `commands` (as `common.sections` names them), those of `overrides` it takes: each reads only some
    sections, and refuses an override of another, which would change nothing it does. An override the recipe does not
    take (an unknown key: the loader's message names the near ones) is refused (`RecipeError`)."""
    from edgedistill.common.recipe import load_recipe, needless, parse_overrides
    from edgedistill.common.sections import outside

    if not overrides:
        return [[] for _ in commands]
    keys = [next(iter(parse_overrides([override]))) for override in overrides]
    parsed = parse_overrides(overrides)
    load_recipe(recipe, parsed)  # a misspelt key is one, not a section no stage reads
    beyond = {command: tuple(dict.fromkeys(outside(keys, command))) for command in commands}
    # what each command is not given: as it would refuse it (`load_command_recipe`), once per set of unread sections
    left_out = {outside_keys: set(needless(recipe, parsed, outside_keys)) for outside_keys in set(beyond.values())}
    dropped = {command: left_out[beyond[command]] for command in commands}
    return [
        [arg for arg, key in zip(overrides, keys, strict=True) if key not in dropped[command]] for command in commands
    ]


def refuse_missing_sections(recipe_file: str, overrides: list[str]) -> None:
    """`RecipeError` where the recipe (with `overrides`) lacks a section a step needs (`NEEDS`), which would stop `all`
    only once the stages before it, the teacher's training included, had run: naming the sections and the commands
    that run on the recipe."""
    from edgedistill.common.recipe import Recipe, RecipeError, load_recipe, parse_overrides

    recipe = load_recipe(recipe_file, parse_overrides(overrides))
    needed = [section for section in Recipe.model_fields if any(section in needs for needs in NEEDS.values())]
    if not (missing := [section for section in needed if getattr(recipe, section) is None]):
        return
    running = [step for step in STEPS if not set(NEEDS.get(step, ())) & set(missing)]
    raise RecipeError(
        f"{recipe_file}: {PROG} all needs the sections {', '.join(needed[:-1])} and {needed[-1]}, and the recipe has no "
        f"{' or '.join(missing)}: add {'it' if len(missing) == 1 else 'them'}, or run the commands that apply on "
        f"their own ({', '.join(f'{PROG} {step}' for step in running)})"
    )


def run_stage(command: list[str]) -> int:
    """Run a stage's process to its end; its exit status as a shell gives it (128 + N where signal N killed it). Ctrl-C reaches the stage too: this waits while it stops
    and says so, where `subprocess.run` would kill it a quarter of a second later. Killed (SIGTERM, kill -9), this
    process takes the stage with it, which would otherwise train on alone, holding its lock."""
    with subprocess.Popen(dying_with_this_process(command)) as stage:
        try:
            return shell_status(stage.wait())
        except KeyboardInterrupt as stop:
            if isinstance(stop, Terminated):  # sent to this process alone, maybe: the stage stops as it would
                stage.terminate()
            return shell_status(stage.wait())


def run_all(argv: list[str]) -> int:
    """Every stage in its own process; the exit status of the first that fails, else 0."""
    from edgedistill.common.recipe import RECIPE_HELP, not_an_override, parse_overrides
    from edgedistill.common.scenarios import scenario_weights
    from edgedistill.common.settings import refuse_measured_variables

    parser = ArgumentParser(
        prog=f"{PROG} all",
        description=f"Run {ALL_HELP}: teacher, labeller, transfer, distill, bundles, the model, serving, accuracy "
        "and cascade benchmarks, the smoke load test, report, headline. Stages already up to date return at once.",
        epilog="Further --section.key=value arguments override the recipe: each stage is given those of the sections it "
        "reads (`edgedistill <command> --help` names them), and one no stage reads is refused.",
    )
    parser.add_argument("recipe", help=RECIPE_HELP)
    parser.not_an_override = not_an_override
    parser.add_argument("--jobs", type=count, default=JOBS, help=f"students trained at once (default {JOBS})")
    parser.add_argument("--force", action="store_true", help="build and measure every stage again, up to date or not")
    args, overrides = parser.parse_known_args(argv)
    try:
        steps = pipeline(args.recipe, args.jobs, overrides, args.force)
        refuse_measured_variables()  # the benchmarks' refusal, before hours of training
        refuse_missing_sections(args.recipe, overrides)  # the later stages' refusals of the recipe, likewise
        scenario_weights(parse_overrides(overrides), LOADTEST_PROFILE)  # the load test's refusals, likewise
    except ValueError as err:  # a bad recipe or override, one no stage reads, a variable no bench takes, scenarios
        print(f"error: {err}", file=sys.stderr)
        return 2
    missed = 0
    for command, step in zip(STEPS, steps, strict=True):
        print(f"[all] {shlex.join([PROG, *step])}", flush=True)  # a line to paste, a mapping override quoted
        status = run_stage(python_module(PROG, *step))
        if status in (INTERRUPTED, TERMINATED):
            return status
        if command == "loadtest" and status == SLO_MISSED:  # it measured: the report and the headline show the miss
            print(f"[all] {PROG} {command} missed its SLO (exit status {status}); the report and headline follow")
            missed = status
        elif status != 0:
            print(f"[all] {PROG} {command} failed with exit status {status}", file=sys.stderr)
            return status
    return missed


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: it lists the commands; each command's own options are its entry point's."""
    parser = ArgumentParser(
        prog=PROG,
        description="Distil a Transformer teacher into a small student, export it, benchmark it and serve it.",
        epilog=f"`{PROG} COMMAND --help` shows a command's own options. Settings: {guide.page('settings.md')}. "
        f"{EXIT_STATUSES} {SERVE_EXIT_STATUSES}: {guide.page('troubleshooting.md', 'the-server-exits')}.",
        formatter_class=WholeWordsHelp,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version(PROG)}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.help, add_help=False)
    commands.add_parser("all", help=ALL_HELP, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in {*COMMANDS, "all"}:
        build_parser().parse_args(argv)  # prints the help, the version or the usage error, and exits
    name, rest = argv[0], argv[1:]

    def work() -> int:
        return run_all(rest) if name == "all" else COMMANDS[name].run(name, rest)

    return guarded(f"{PROG} {name}", name, work, "--force" in rest)


def guarded(label: str, name: str, work: Callable[[], int], forced: bool = False) -> int:
    """`work()`'s exit status; where it ends by Ctrl-C or an error of no stage's own, one line naming `label` (after
    the traceback of an unexpected error) and the status `EXIT_STATUSES` gives it. `name`: the `edgedistill` command
    that runs, and `forced`: whether with `--force`, for what the line of an interrupted one adds. Its stdout is
    written line by line: a log or a pipe gets each evaluation and summary line as it is printed, not at the exit."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    try:
        with terminated_as_interrupted() if name not in BUILD_NOTHING else contextlib.nullcontext():
            return work()
    except BrokenPipeError:  # the reader stopped early: stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush cannot fail again
        return READER_GONE
    except OSError as err:  # common.atomic's DiskFull names the folder; other writes their file
        if err.errno not in CANNOT_WRITE:
            return crashed(label)
        print(f"error: {err.strerror}{f': {err.filename}' if err.filename else ''}", file=sys.stderr)
        return 2
    except SettingError as err:  # an EDGEDISTILL_* variable that any stage may read, wherever it read it
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        if (hint := install_hint(name, err)) is None:
            return crashed(label)
        print(f"{label}: {hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # a line, not the traceback of wherever the stage was
        return stopped(label, name, forced, stop)
    except Exception as err:  # noqa: BLE001 - the traceback is printed; the status keeps 1 for a failed check
        if (stop := wrapped_interrupt(err)) is not None:
            return stopped(label, name, forced, stop)
        return crashed(label)


def install_hint(name: str, err: ModuleNotFoundError) -> str | None:
    """The package the `edgedistill` command `name` stopped without (`err`) and the install of its extra; None for a
    module of this package's own (a bug) or a name no command has."""
    if err.name is None or err.name.partition(".")[0] == PROG or name not in COMMANDS:
        return None
    install = f"pip install '{PROG}[{COMMANDS[name].extra}]'"
    if err.name == "onnxruntime":  # its CPU and GPU wheels exclude each other, so no role's extra holds it
        install = f"pip install '{PROG}[cpu]' ('{PROG}[gpu]' on an NVIDIA GPU machine)"
    return f"needs {err.name}, which is not installed: {install}"


def stopped(label: str, name: str, forced: bool, stop: KeyboardInterrupt) -> int:
    """Say that `label` was stopped by Ctrl-C or SIGTERM (`stop`), and how to go on; the status a shell gives it."""
    terminated = isinstance(stop, Terminated)
    print(
        f"{label}: {'stopped by SIGTERM' if terminated else 'interrupted'}{interrupted_note(name, forced)}",
        file=sys.stderr,
    )
    return TERMINATED if terminated else INTERRUPTED


def wrapped_interrupt(err: Exception) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM that landed in a serializer of ours (a recipe's hash) as pydantic called it, which it
    wraps in a `PydanticSerializationError` keeping only its name; None for any other error."""
    if type(err).__name__ != "PydanticSerializationError":
        return None
    return next((kind() for kind in (Terminated, KeyboardInterrupt) if f": {kind.__name__}:" in str(err)), None)


def run_module(main: Callable[..., int], prog: str, command: str | None = None) -> NoReturn:
    """Exit with the status of `python -m <stage>`'s `main(prog=prog)`, Ctrl-C and unexpected errors handled as the
    `edgedistill` command handles them. `command`: the `edgedistill` command the module is; None where its first
    argument names it (`python -m distill teacher`)."""
    name = command or next(iter(sys.argv[1:2]), "")
    label = prog if command else f"{prog} {name}".rstrip()
    sys.exit(guarded(label, name, lambda: main(prog=prog), "--force" in sys.argv))


def interrupted_note(name: str, forced: bool = False) -> str:
    """What the line of a command stopped by Ctrl-C adds: for one that builds, that running it again goes on; run
    again with `--force`, it builds the stages it had finished again first."""
    if name in BUILD_NOTHING:
        return ""
    again = f"; with --force, the stages it had finished are built again first ({FORCED_AGAIN})" if forced else ""
    return STOPPED_BUILDING + (f" ({GOES_ON_FROM[name]})" if name in GOES_ON_FROM else "") + again


def crashed(label: str) -> int:
    """Print the traceback of the error being handled and a line naming the command, `label`; `CRASHED`."""
    traceback.print_exc()
    print(f"{label}: stopped by an unexpected error (above): exit status {CRASHED}", file=sys.stderr)
    return CRASHED
