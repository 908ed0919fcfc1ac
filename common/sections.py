"""The recipe sections each command reads; a command-line override of any other section changes nothing it does.

A command reads the sections its stages hash (`Stage.settings`), those its stages' parents hash (through their
hashes: `distill --finetune.optim.lr=...` makes the teacher stale, and the command says so), and those it reads
without hashing them (`runtime`: where it trains, of which `bench models` reads the device alone, as it times the
teacher in fp32; `tracking`: where its stages log; `export.deploy`: the bundle a benchmark serves by default). Every
command reads `name`, its run folder. `bench`, `export` and `loadtest` are shared: each benchmark reads its own
subsection (`bench.serving`, `bench.peers`, ...) and of `export` the bundle it serves by default (`export.deploy`;
`bench accuracy` the near-tie margin too, `bench cascade` the whole section), and a load test the settings every
profile shares (`loadtest.timeout_s`, ...) and its own profile's (`loadtest --profile steady` reads `loadtest.steady`).
`common.recipe.load_command_recipe` refuses an override of any other section; `edgedistill all` gives each command it
runs those of the sections it reads, and refuses one that none of them reads.
"""

from typing import get_args

from edgedistill.common.config.measure import LoadtestConfig, Profile

SHARED = ("bench", "export", "loadtest")  # sections whose subsections different commands read
PROFILES: tuple[str, ...] = get_args(Profile)  # a load test's, each a subsection of `loadtest`
DEFAULT_PROFILE = "smoke"  # the one `edgedistill loadtest RECIPE` runs without --profile
PROFILE = "PROFILE"  # a load test's own profile, as its help names it: the one its --profile gives
LOADTEST = tuple(f"loadtest.{key}" for key in LoadtestConfig.model_fields if key not in PROFILES)  # every profile's
EVERY = ("name",)  # the run folder's name: every command writes or reads runs/<name>/
TEACHER = ("data", "model", "pretrain", "finetune")  # what the teacher is built from
TRAINED = (*TEACHER, "transfer", "distill", "export")  # ... and the transfer set (its labeller too) and the students
_BENCH = ("data", "export.deploy", "tracking")  # a benchmark of a served bundle: the dev split, the deployed bundle
READS: dict[str, tuple[str, ...]] = {  # command (as `edgedistill` names it) -> the sections it reads
    # pretraining checks finetune.reinit_layers, finetune.pooling and finetune.classifier_dropout against the model;
    # the teacher's commands warn about missing transfer.unlabelled_files, and about students the distill stage would
    # refuse, before hours of training, and refuse teacher bundles (export.bundles, transfer.labeller) asking for
    # fusion of a teacher ONNX Runtime fuses only in part (distill.heads.require_fusable)
    "pretrain": ("data", "model", "pretrain", "finetune", "transfer", "distill", "export", "runtime", "tracking"),
    "finetune": (*TEACHER, "transfer", "distill", "export", "runtime", "tracking"),
    "teacher": (*TEACHER, "transfer", "distill", "export", "runtime", "tracking"),
    "labeller": (*TEACHER, "transfer", "export", "runtime", "tracking"),
    "transfer": (*TRAINED, "runtime", "tracking"),  # checks the students before labelling
    "distill": (*TRAINED, "runtime", "tracking"),
    "bundles": (*TRAINED, "tracking"),
    "bench models": (*TRAINED, "bench.models", "runtime.device", "tracking"),  # the teacher in PyTorch, in fp32
    "bench serving": (*_BENCH, "bench.serving"),
    "bench accuracy": (*_BENCH, "export.tie_margin"),  # a near-tie's margin
    "bench cascade": ("data", "export", "tracking", "bench.serving"),  # the cascades, their members' bundles
    "bench peers": (*_BENCH, "bench.peers"),
    "bench scaling": (*_BENCH, "bench.scaling"),
    "loadtest": (*_BENCH, *LOADTEST),  # and its own profile's settings (`named`)
    "report": (*TRAINED, "tracking"),  # the plan of make all's folders, the models' cards
    "headline": TRAINED,  # a model built with other settings than these is named, not shown (`report.plan.stale`)
}


def loadtest(profile: str) -> str:
    """The load test of `profile` as `reads` takes it: `loadtest --profile steady`."""
    return f"loadtest --profile {profile}"


def named(command: str) -> tuple[str, ...]:
    """The sections `command` reads as its help names them, `name` first: a load test's own profile as
    `loadtest.PROFILE` where `command` names none."""
    name, _, profile = command.partition(" --profile ")
    own = (f"loadtest.{profile or PROFILE}",) if name == "loadtest" else ()
    return (*EVERY, *READS[name], *own)


def reads(command: str) -> tuple[str, ...]:
    """The sections `command` reads, `name` first; a load test its own profile's (`loadtest --profile steady`;
    `loadtest` alone: `DEFAULT_PROFILE`, as it runs)."""
    return named(loadtest(DEFAULT_PROFILE) if command == "loadtest" else command)


def readers(key: str) -> list[str]:
    """The commands that read the section override `key` sets, as `reads` names them: the load test as `loadtest`
    where every profile reads it, else as the profiles that do (`loadtest --profile steady`)."""
    found = []
    for name in READS:
        runs = [loadtest(profile) for profile in PROFILES] if name == "loadtest" else [name]
        reading = [command for command in runs if not outside([key], command)]
        found += [name] if reading == runs else reading
    return found


def scope(key: str, command: str | None = None) -> str:
    """The section an override of dotted `key` sets: its first part, or its first two in a shared section or in one
    that `command` reads a part of (`bench models`: of `runtime`, the device)."""
    parts = key.split(".")
    partly = command is not None and any(section.startswith(f"{parts[0]}.") for section in reads(command))
    return ".".join(parts[:2] if parts[0] in SHARED or partly else parts[:1])


def outside(keys, command: str) -> list[str]:
    """The override keys that set no section `command` reads (`--bench` sets `bench.serving` too)."""
    read = reads(command)
    return [
        key
        for key in keys
        if not any(key == section or key.startswith(f"{section}.") or section.startswith(f"{key}.") for section in read)
    ]
