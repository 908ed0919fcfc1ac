"""The training stages as a recipe declares them: each one's folder, the settings it hashes, its parents and its build
body, imported only once it builds (`common.stage.body`). A command whose stages are all current says so without
importing torch or transformers, which load for seconds.

`of_command` gives the stages each `python -m distill` command runs, in order.
"""

from functools import partial
from pathlib import Path

from edgedistill.common import manifest as mf
from edgedistill.common.config.strict import HASHING
from edgedistill.common.names import not_among
from edgedistill.common.recipe import Recipe, RecipeError
from edgedistill.common.stage import Stage, body

# Part of the students' hash: a student folder written before the Hub layout (student.json) is stale.
FOLDER_LAYOUT = "hub"
# Part of the transfer set's hash: one built when only dev texts were held out, and after augmenting, is stale (as is
# one of the release before, whose sentences were also cut at abbreviations and styled `mr .`).
HELD_OUT = "dev and test, before augmenting"
BASELINE_UNREAD = {"losses", "temperature", "init_from_teacher"}  # a student's settings its baseline never reads
TEACHER_COMMANDS = ("pretrain", "finetune", "teacher")


def pretrain(recipe: Recipe) -> Stage:
    """`runs/<recipe>/pretrain/`: the language model the teacher is fine-tuned from."""
    return Stage("pretrain", recipe, ("model", "pretrain"), body("edgedistill.distill.pretrain"))


def teacher(recipe: Recipe) -> Stage:
    """`runs/<recipe>/teacher/`: fine-tuned from the pretrain artifact when the recipe pretrains, else `model.init`."""
    parents = (pretrain(recipe),) if recipe.pretrain is not None else ()
    return Stage(
        "teacher",
        recipe,
        ("data", "model", "finetune"),
        body("edgedistill.distill.finetune"),
        parents,
        also_stale=partial(_scored_in_another_style, recipe.text_style),
    )


def _scored_in_another_style(style: str, folder: Path) -> str | None:
    """Why the teacher in `folder`, scored and chosen on dev texts written in the style its manifest records
    (`info.text_style`), is not of `style`, the recipe's `text_style` (not hashed, so that teachers built before it was
    recorded stay current); None when it is, or when it records none."""
    scored = mf.load(folder, verify=False).info.get("text_style")
    if scored in (None, style):
        return None
    return f"its dev and test texts were written {scored} (info.text_style), and transfer.text_style is {style}"


def transfer(recipe: Recipe) -> Stage:
    """`runs/<recipe>/transfer/`: the transfer set, labelled by the teacher (through the labeller bundle the
    recipe names, whose export settings count too; where it labelled, it is recorded as a parent, so that building
    it again makes the transfer set stale, as it does one of an earlier release, which names it in `info.labelling`
    alone). Which texts it holds out (`HELD_OUT`) counts too."""
    name = recipe.transfer.labeller if recipe.transfer else None
    labeller = {"labeller": recipe.export.bundles[name].model_dump(mode="json")} if name else {}
    return Stage(
        "transfer",
        recipe,
        ("data", "transfer"),
        body("edgedistill.distill.transfer"),
        (teacher(recipe),),
        extra={"held_out": HELD_OUT} | labeller,
        also_stale=_labelled_by_another_bundle if name else None,
    )


def _labelled_by_another_bundle(folder: Path) -> str | None:
    """Why the transfer set in `folder`, labelled through a bundle by a release that recorded the bundle in
    `info.labelling` (its manifest's sha256, `bundle_sha256`) but not among the parents, is not of the bundle now
    beside it: that one is gone, or was built again since; None when it is, when the parents record the bundle
    (`Stage.staleness` judges it so), or when PyTorch labelled."""
    manifest = mf.load(folder, verify=False)
    labelling = manifest.info.get("labelling", {})
    if labelling.get("engine") != "onnxruntime":
        return None
    bundle = folder.parent / Path(labelling["bundle"]).name
    if bundle.name in manifest.parents:
        return None
    now = bundle / mf.MANIFEST
    if not now.is_file():
        change = "is gone"
    elif mf.sha256_file(now) != labelling.get("bundle_sha256"):
        change = "was built again since it labelled the set"
    else:
        return None
    return (
        f"its labeller {bundle.name} {change} (info.labelling.bundle_sha256; an earlier release did not record the "
        "labeller among the parents): `edgedistill transfer RECIPE` labels it again"
    )


def student(recipe: Recipe, name: str, baseline: bool = False, bar_position: int | None = None) -> Stage:
    """`student-<name>/` distilled from the transfer set, or with `baseline` `baseline-<name>/` trained on labels
    only for the same step budget (the transfer set's size sets it); its training bar on terminal line
    `bar_position` (parallel jobs)."""
    spec = recipe.distill.students[name]
    # Only the settings this run reads (and everything upstream) decide whether it is stale.
    unread = BASELINE_UNREAD if baseline else {"baseline_init_from_teacher"}
    transfer_stage = transfer(recipe)
    return Stage(
        f"{'baseline' if baseline else 'student'}-{name}",
        recipe,
        (),
        body("edgedistill.distill.student_stage", name=name, baseline=baseline, bar_position=bar_position),
        (transfer_stage, *transfer_stage.parents),
        extra=spec.model_dump(mode="json", exclude=unread, context=HASHING) | {"layout": FOLDER_LAYOUT},
    )


def students(recipe: Recipe, recipe_file: str, only: list[str] | None, baselines: bool) -> list[tuple[str, bool]]:
    """The `(student name, baseline?)` runs of `distill`: each student of the recipe, or of `only` (a name given twice
    runs once), then its baseline where `baselines`. A name the recipe has not raises `RecipeError`."""
    if unknown := not_among("--only", only or (), list(recipe.distill.students), f"distill.students of {recipe_file}"):
        raise RecipeError(unknown)
    names = dict.fromkeys(only or recipe.distill.students)
    return [(name, baseline) for name in names for baseline in ((False, True) if baselines else (False,))]


def of_command(
    recipe: Recipe, recipe_file: str, command: str, only: list[str] | None = None, baselines: bool = True
) -> list[Stage]:
    """The stages `python -m distill <command>` runs, in order: `pretrain`; `finetune` (the teacher); `teacher` (both,
    pretraining where the recipe has it); `transfer`; `distill` (the transfer set, then each student and its
    baseline). A recipe without the sections the command needs raises `RecipeError` naming `recipe_file`."""
    if command in TEACHER_COMMANDS:
        if command == "pretrain" and recipe.pretrain is None:
            raise RecipeError(f"{recipe_file}: no `pretrain` section to run")
        pretrained = [pretrain(recipe)] if command != "finetune" and recipe.pretrain is not None else []
        return pretrained + ([teacher(recipe)] if command != "pretrain" else [])
    if recipe.transfer is None or recipe.distill is None:
        raise RecipeError(f"{recipe_file}: needs `transfer` and `distill` sections for stage {command}")
    runs = students(recipe, recipe_file, only, baselines) if command == "distill" else []
    return [transfer(recipe), *(student(recipe, name, baseline) for name, baseline in runs)]
