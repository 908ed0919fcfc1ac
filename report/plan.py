"""The artifact folders `make all` (or `edgedistill all`) writes for a recipe, each with the target that builds it:
a make target in a checkout, the edgedistill commands it runs where the package is installed (`Target`)."""

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, get_args

from edgedistill.bench.records import ModelRow, ModelTable
from edgedistill.common import manifest as mf
from edgedistill.common import measured, modelcard
from edgedistill.common.cascade import is_cascade
from edgedistill.common.config.measure import Profile
from edgedistill.common.manifest import MANIFEST
from edgedistill.common.recipe import Recipe
from edgedistill.common.sections import loadtest

from edgedistill.cli import taken

CHECKOUT = Path(__file__).resolve().parents[1]  # the checkout's top folder, where edgedistill runs from one


class Target(NamedTuple):
    """A make target, with the value of the one variable it takes here (`loadtest`'s PROFILE, `serve-cascade`'s
    CASCADE), and the edgedistill commands it runs beyond its prerequisites (`COMMANDS`)."""

    name: str
    value: str = ""

    def make(self) -> str:
        return f"{self.name} {VARIABLE[self.name]}={self.value}" if self.value else self.name

    def commands(self, recipe: str, overrides: Sequence[str] = ()) -> list[str]:
        """The edgedistill commands on the recipe file `recipe`, each with those of the recipe `overrides`
        (`--section.key=value`) it takes (`edgedistill.cli.taken`)."""
        option = f" {OPTION[self.name]} {self.value}" if self.value else ""
        given = taken(recipe, list(overrides), [self._read_as(command) for command in COMMANDS[self.name]])
        return [
            f"edgedistill {command.format(recipe=recipe)}{option}" + "".join(f" {shlex.quote(arg)}" for arg in args)
            for command, args in zip(COMMANDS[self.name], given, strict=True)
        ]

    def _read_as(self, command: str) -> str:
        """`command`, of `COMMANDS`, as `common.sections` names it: a load test by its profile."""
        name = command.partition(" {recipe}")[0]
        return loadtest(self.value) if name == "loadtest" and self.value else name


COMMANDS = {  # make target -> the edgedistill commands it runs after its prerequisites, as the Makefile has them
    "teacher": ["teacher {recipe}"],
    "transfer": ["labeller {recipe}", "transfer {recipe}"],
    "distill": ["distill {recipe} --jobs 2"],
    "bundles": ["bundles {recipe}"],
    "bench": ["bench models {recipe}"],
    "serve-bench": ["bench serving {recipe}"],
    "serve-accuracy": ["bench accuracy {recipe} --check"],
    "serve-cascade": ["bench cascade {recipe}"],
    "peers-bench": ["bench peers {recipe}"],
    "scaling-bench": ["bench scaling {recipe}"],
    "loadtest": ["loadtest {recipe}"],
}
DISTILL = (Target("distill"),)  # what builds the distillation table again
VARIABLE = {"loadtest": "PROFILE", "serve-cascade": "CASCADE"}  # make target -> its variable, and its option
OPTION = {"loadtest": "--profile", "serve-cascade": "--cascade"}


def rerun(targets: tuple[Target, ...], recipe: str, overrides: Sequence[str] = ()) -> str:
    """How to run `targets` on the recipe file `recipe` with the recipe `overrides`: the edgedistill commands, then
    how in a checkout (`in_checkout`)."""
    return f"{command_line(targets, recipe, overrides)}; {in_checkout(targets, recipe, overrides)}"


def command_line(targets: tuple[Target, ...], recipe: str, overrides: Sequence[str] = ()) -> str:
    """The edgedistill commands that run `targets` on the recipe file `recipe` with the recipe `overrides` each takes,
    joined by `&&`."""
    return " && ".join(command for target in targets for command in target.commands(recipe, overrides))


def in_checkout(targets: tuple[Target, ...], recipe: str, overrides: Sequence[str] = ()) -> str:
    """`in a checkout, <the make command line>` (`for_make`); with recipe `overrides`, that the same commands run there:
    make passes them to no target, whose prerequisites would build again without them."""
    if overrides:
        return "the same in a checkout, where make takes no recipe overrides"
    return f"in a checkout, {make_line(targets, for_make(recipe))}"


def for_make(path: str | Path) -> str:
    """`path`, relative to the working directory or absolute, as make reads it in the checkout's top folder, quoted for
    the shell: as given where that is the working directory, else absolute."""
    here = Path.cwd().resolve() == CHECKOUT
    return shlex.quote(str(path) if here or Path(path).is_absolute() else os.path.abspath(path))


def make_line(targets: tuple[Target, ...], recipe: str | None = None) -> str:
    """The make command line that runs `targets` in a checkout, on the recipe file `recipe` if given."""
    return f"make {' '.join(target.make() for target in targets)}" + (f" RECIPE={recipe}" if recipe else "")


def planned(recipe: Recipe) -> dict[str, Target]:
    """Folder name -> the target that builds it, in pipeline order."""
    teacher, distill, bundles = Target("teacher"), Target("distill"), Target("bundles")
    folders = {"pretrain": teacher} if recipe.pretrain is not None else {}
    folders["teacher"] = teacher
    if recipe.transfer is not None:
        folders["transfer"] = Target("transfer")
    for name in recipe.distill.students if recipe.distill is not None else ():
        folders |= {f"student-{name}": distill, f"baseline-{name}": distill}
    if recipe.export is not None:
        folders |= {f"bundle-{b}": bundles for b in (*recipe.export.bundles, *recipe.export.cascades)}
        folders["bench"] = Target("bench")
        # the measurements `make all` takes, each by the target that takes it alone
        if recipe.export.deploy not in recipe.export.cascades:  # a deployed cascade's is the cascade benchmark
            folders[deployed(recipe, measured.SERVING)] = MEASURE_AGAIN[measured.SERVING]
        folders[deployed(recipe, measured.ACCURACY)] = MEASURE_AGAIN[measured.ACCURACY]
        if (cascade := recipe.export.default_cascade) is not None:
            folders[measured.folder_name(measured.CASCADE, cascade)] = Target("serve-cascade")
        folders[deployed(recipe, measured.loadtest("smoke"))] = MEASURE_AGAIN[measured.loadtest("smoke")]
    return folders


def deployed(recipe: Recipe, measurement: str) -> str | None:
    """The folder of `measurement` (`common.measured`: one per bundle) on the deployed bundle, `export.deploy`; None
    without an export section."""
    return None if recipe.export is None else measured.folder_name(measurement, recipe.export.deploy)


MEASURE_AGAIN = {  # measurement kept one folder per bundle -> the target that measures the deployed bundle
    measured.SERVING: Target("serve-bench"),
    measured.ACCURACY: Target("serve-accuracy"),
    measured.PEERS: Target("peers-bench"),
    measured.SCALING: Target("scaling-bench"),
} | {measured.loadtest(profile): Target("loadtest", profile) for profile in get_args(Profile)}


class Stale(NamedTuple):
    """A finished measurement the report and the headline name instead of showing: its folder, why it is not of the
    artifacts now in the run, and the targets that build or measure it again, in order."""

    folder: str
    why: str
    targets: tuple[Target, ...]


def bench_row(model: str) -> str:
    """How the report and the headline name the model benchmark's row of `model` when they leave it out."""
    return f"bench row {model}"


def _stale_bench(root: Path, teacher: Stale | None) -> dict[str, Stale]:
    """The model benchmark whole where the teacher, each speedup's base, was built again since it ran or is `teacher`
    (of other settings), else its rows of bundles built again since (`common.modelcard.bench_change`)."""
    if not (root / "bench" / MANIFEST).is_file():
        return {}
    if why := modelcard.bench_change(root, "teacher") or (teacher and teacher.why):
        return {"bench": Stale("bench", why, (Target("bench"),))}
    bundles = [name for name in mf.load(root / "bench", verify=False).parents if name != "teacher"]
    return {
        bench_row(measured.bundle_id(Path(name))): Stale("bench", why, (Target("bench"),))
        for name in bundles
        if (why := modelcard.bench_change(root, name))
    }


def cascades(root: Path) -> list[Path]:
    """The finished cascade bundles in the run folder `root`."""
    return [p for p in sorted(root.glob("bundle-*")) if (p / MANIFEST).is_file() and is_cascade(p)]


def cascade_point(cascade: str) -> str:
    """How the report and the headline name the accuracy-latency figure's point of `cascade` when they leave it out."""
    return f"expected latency of cascade {cascade}"


def _built_from_others(recipe: Recipe, root: Path) -> dict[str, Stale]:
    """The finished bundles (not cascades) in the run folder `root` built from a student or teacher built again since,
    gone, or out of date (`common.manifest.built_from_others`), by folder name, with the targets that build each
    again (`_builds_again`)."""
    bundles = (p for p in sorted(root.glob("bundle-*")) if (p / MANIFEST).is_file() and not is_cascade(p))
    return {p.name: Stale(p.name, why, _builds_again(recipe, p)) for p in bundles if (why := mf.built_from_others(p))}


def _builds_again(recipe: Recipe, bundle: Path) -> tuple[Target, ...]:
    """The targets that build `bundle` again: `bundles`, after the target of a parent out of date (a student older
    than its transfer set is distilled again first, which builds the transfer set where it is stale too)."""
    out_of_date = mf.first_out_of_date(mf.beside(bundle, mf.load(bundle, verify=False)))
    first = planned(recipe).get(out_of_date[0]) if out_of_date else None
    return (first, Target("bundles")) if first not in (None, Target("bundles")) else (Target("bundles"),)


def _other_settings(recipe: Recipe, root: Path) -> dict[str, Stale]:
    """The finished models of `make all` in the run folder `root` (teacher, students, baselines, bundles) built with
    other settings than the recipe's now, or from one that was (`common.modelcard.settings_change`: the recipe edited
    and the stage not built again), by folder name, with the target that builds each again."""
    return {
        name: Stale(name, why, (target,))
        for name, target in planned(recipe).items()
        if modelcard.is_model(name)
        and (root / name / MANIFEST).is_file()
        and (why := modelcard.settings_change(recipe, root / name))
    }


def _measurement(
    found: dict[str, Stale], folder: Path, why: str | None, bundle: str, target: Target
) -> dict[str, Stale]:
    """The finished measurement `folder` of the bundle folder `bundle`, taken by `target`, by name where it is stale:
    for `why` (what it measured was built again or is gone since), or where `found` names the bundle now there (built
    with other settings, or from an older model), then measured again after the bundle is built again; else none."""
    if why:
        return {folder.name: Stale(folder.name, why, (target,))}
    if bundle in found:
        return {folder.name: Stale(folder.name, f"{bundle}: {found[bundle].why}", (*found[bundle].targets, target))}
    return {}


def stale(recipe: Recipe, root: Path) -> dict[str, Stale]:
    """The finished artifacts and measurements in the run folder `root` that are not of the recipe and the artifacts
    now there, by the name they are shown under: each model built with other settings than the recipe's now
    (`_other_settings`), and each bundle built from a student or teacher built again since (by its folder's name),
    whose figures, row in the model benchmark and measurements are left out with it; the deployed bundle's
    measurements and each cascade's serving benchmark, of a bundle built again or gone since or named here
    (`_measurement`), the model benchmark's rows (`bench_row`), or the whole of it as `bench` (its teacher, each
    speedup's base, built again since or with other settings), and the expected latency of each cascade built from
    members built again since (`cascade_point`), whose dev answered shares are not of the members the benchmark
    timed."""
    found = _built_from_others(recipe, root) | _other_settings(recipe, root)
    if recipe.export is None:
        return found
    bundle = root / f"bundle-{recipe.export.deploy}"
    for measurement, target in MEASURE_AGAIN.items():
        folder = root / deployed(recipe, measurement)
        if (folder / MANIFEST).is_file():
            found |= _measurement(found, folder, measured.stale(folder, bundle), bundle.name, target)
    for name in recipe.export.cascades:
        folder = root / measured.folder_name(measured.CASCADE, name)
        if (folder / MANIFEST).is_file():
            why = mf.built_from_others(folder)
            found |= _measurement(found, folder, why, f"bundle-{name}", Target("serve-cascade", name))
    for folder in cascades(root):
        if why := mf.built_from_others(folder):
            found[cascade_point(measured.bundle_id(folder))] = Stale(folder.name, why, (Target("bundles"),))
    return found | _stale_bench(root, found.get("teacher"))


FIGURE_SHAPES = ((1, 64), (1, 32), (1, 16))  # (batch, length) the benchmark's figures are quoted at: the first timed


def figure_cell(table: ModelTable) -> tuple[int, int]:
    """The (batch, length) of the model benchmark `table` that the report's accuracy-latency figure and the headline's
    bench lines quote: the first of `FIGURE_SHAPES` it timed, else its first."""
    return next((shape for shape in FIGURE_SHAPES if shape in table.shapes), table.shapes[0])


def bench_rows(table: ModelTable, stale: dict[str, Stale]) -> list[ModelRow]:
    """The rows of the model benchmark `table` the report and the headline show: none where `stale` names it whole,
    else those it names neither as a row nor as a bundle."""
    if "bench" in stale:
        return []
    return [row for row in table.rows if bench_row(row.model) not in stale and f"bundle-{row.model}" not in stale]


def loadtests(recipe: Recipe) -> list[str]:
    """The folders of the load tests the report shows, sorted: each profile's on the deployed bundle (one folder per
    bundle, `common.measured`) and against the echo server."""
    names = [measured.echo_loadtest(profile) for profile in get_args(Profile)]
    if recipe.export is not None:
        names += [deployed(recipe, measured.loadtest(profile)) for profile in get_args(Profile)]
    return sorted(names)


def not_buildable_here(recipe: Recipe, name: str) -> str | None:
    """Why this machine cannot build or measure the planned folder `name` (a bundle, a cascade, or a measurement of
    one, that needs a runtime or provider it lacks), or None; None too where the report runs without ONNX Runtime
    (its `report` install), which cannot tell."""
    if recipe.export is None:
        return None
    try:
        from edgedistill.common.runtime import cascade_missing_here, missing_here
    except ImportError:
        return None
    export = recipe.export
    measured_cascades = {measured.folder_name(measured.CASCADE, cascade): cascade for cascade in export.cascades}
    if name.startswith("bundle-"):
        model = name.removeprefix("bundle-")
    elif name in measured_cascades:
        model = measured_cascades[name]
    elif name.startswith(("serve-", "loadtest-")):  # a planned measurement is of the deployed bundle
        model = export.deploy
    else:
        model = None
    if model in export.cascades:
        return cascade_missing_here(export, model)
    if model in export.bundles:
        return missing_here(export.bundles[model].runtime, export.bundles[model].providers)
    return None


def missing(recipe: Recipe, finished: set[str]) -> dict[str, Target]:
    """The planned folders not among `finished` (not run yet, failed, or not buildable where the run was made). Any of
    the recipe's cascades measured stands for the default one, since `make all CASCADE=x` measures `x`."""
    cascades = set()
    if recipe.export is not None:
        cascades = {measured.folder_name(measured.CASCADE, cascade) for cascade in recipe.export.cascades}
    if cascades & finished:
        finished = finished | cascades
    return {name: target for name, target in planned(recipe).items() if name not in finished}
