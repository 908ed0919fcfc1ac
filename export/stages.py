"""The bundles and cascades as a recipe declares them, as `distill.stages` declares the training stages: each one's
folder, the settings it hashes, its parents and its build body, imported only once it builds. `python -m export
bundles` whose bundles and cascades are all current says so without importing torch, transformers or ONNX.

A recipe may list GPU bundles beside CPU ones: `bundles` and `cascades` leave out, saying why, those this machine
cannot run.
"""

from functools import partial
from pathlib import Path

from edgedistill.common import manifest as mf
from edgedistill.common.bundle import SPEC_VERSION
from edgedistill.common.config.export import AGREEMENT_KEYS, BundleRecipe
from edgedistill.common.names import not_among
from edgedistill.common.recipe import Recipe, RecipeError
from edgedistill.common.runtime import (
    GPU_HINT,
    ProviderFallback,
    TensorRTUnavailable,
    cascade_missing_here,
    missing_here,
    refuse_tf32,
    require_tensorrt,
)
from edgedistill.common.stage import Stage, body
from edgedistill.distill import stages as trained

GATES = (
    "opset",
    "min_agreement",
    "min_fp16_agreement",
    "max_int8_drop",
    "min_int8_agreement",
    "calibration_sentences",
    "smooth_sentences",
)
# Settings hashed once set (`ExportConfig.hashed_when_set`) that every bundle, or a smoothed one, reads.
ONCE_SET = frozenset({"tie_margin", "smooth_sentences"})


def bundle(recipe: Recipe, bundle_id: str, cache=None) -> Stage:
    """`runs/<recipe>/bundle-<id>/`: exported from its source, checked against it on the dev set tokenized by the
    teacher's tokenizer, gated; static INT8 and TensorRT INT8 bundles also read the transfer set (calibration), a
    smoothed one (`smooth`) the train split. `cache` (an `export.bundle_stage.SourceCache`) shares each source's
    export among the bundles a command builds."""
    spec = recipe.export.bundles[bundle_id]
    teacher = trained.teacher(recipe)
    parents = [teacher] if spec.source == "teacher" else [trained.student(recipe, spec.source), teacher]
    if spec.calibrated_on_transfer_set:
        parents.append(trained.transfer(recipe))
    unset = ONCE_SET - recipe.export.model_dump().keys()  # at their default, left out of the dump
    gates = tuple(key for key in (*read_gates(spec), "tie_margin") if key not in unset)
    return Stage(
        f"bundle-{bundle_id}",
        recipe,
        (f"export.bundles.{bundle_id}", *(f"export.{key}" for key in gates)),
        body("edgedistill.export.bundle_stage", bundle_id=bundle_id, cache=cache),
        tuple(parents),
        extra={"spec_version": SPEC_VERSION, "text_style": recipe.text_style},
        unread=tuple(f"export.{key}" for key in GATES if key not in gates),
        preflight=partial(buildable_here, spec, bundle_id),
        also_stale=engine_of_another_machine if spec.runtime == "tensorrt" else None,
    )


def engine_of_another_machine(folder: Path) -> str | None:
    """Why the TensorRT engine in bundle `folder` must be built again here: it was built for another TensorRT version
    or GPU (`info.tensorrt_build`), and loads on those alone; None where it was built for this machine's, or where
    this machine runs no engine (`bundles` leaves it out, saying why)."""
    try:
        now = require_tensorrt()  # probed once: the package and the GPU
    except TensorRTUnavailable:
        return None
    built = mf.load(folder, verify=False).info.get("tensorrt_build", {})
    if moved := [f"{key} {built.get(key)} -> {now[key]}" for key in ("tensorrt", "gpu") if built.get(key) != now[key]]:
        return f"its engine was built for another machine ({'; '.join(moved)}), and loads only on that one"
    return None


def buildable_here(spec: BundleRecipe, bundle_id: str) -> None:
    """Refuse a bundle this machine cannot build (TensorRT, an execution provider or a GPU it lacks; TF32 where the
    bundle was not checked with it), before its parents are read: named with `--only`, it fails at once, not after
    the teacher or student it needs is built."""
    if spec.runtime == "tensorrt":
        require_tensorrt()
        return
    refuse_tf32(spec.providers, spec.precision, f"bundle {bundle_id} (export.bundles.{bundle_id}.providers)")
    if absent := missing_here(spec.runtime, spec.providers):
        raise ProviderFallback(f"bundle {bundle_id}: {absent}. {GPU_HINT}")


def read_gates(spec: BundleRecipe) -> tuple[str, ...]:
    """The `GATES` a bundle of `spec` reads, and so hashes: the opset, its precision's agreement gate, the INT8 drop
    gate for INT8, the calibration count where it calibrates and the smoothing one where it smooths. A gate of another
    precision, or an engine's calibration count, does not make it stale: the INT8 labeller is not built again, and
    the transfer set with it, for an fp16 gate."""
    int8 = ("max_int8_drop",) if spec.precision == "int8" else ()
    calibrates = ("calibration_sentences",) if spec.calibrated_on_transfer_set else ()
    smooths = ("smooth_sentences",) if spec.smooth is not None else ()
    return ("opset", AGREEMENT_KEYS[spec.precision], *int8, *calibrates, *smooths)


def cascade(recipe: Recipe, name: str) -> Stage:
    """`runs/<recipe>/bundle-<name>/`: the cascade of `export.cascades.<name>`, its members copied in."""
    members = [bundle(recipe, member) for member in recipe.export.cascades[name].members]
    return Stage(
        f"bundle-{name}",
        recipe,
        (
            f"export.cascades.{name}",
            "transfer.unlabelled_files",
            "transfer.unlabelled_max_lines",
            "transfer.text_style",
        ),
        body("edgedistill.export.cascade", name=name),
        (*members, trained.teacher(recipe)),
    )


def bundles(recipe: Recipe) -> list[str]:
    """Every bundle of the recipe this machine can run, the others left out with the reason (`left_out`)."""
    ids = []
    for bundle_id in recipe.export.bundles:
        if reason := missing_for(recipe, bundle_id):
            left_out(bundle_id, reason)
        else:
            ids.append(bundle_id)
    return ids


def cascades(recipe: Recipe, only: list[str] | None = None) -> list[str]:
    """The cascades to build: those named in `only`, else every cascade whose members this machine can run. A cascade
    of a bundle that `bundles` leaves out is left out too, naming that member and the reason. Named with `--only`,
    such a cascade fails with the full error."""
    if only is not None:
        return [name for name in recipe.export.cascades if name in only]
    names = []
    for name in recipe.export.cascades:
        if reasons := cascade_missing_here(recipe.export, name):
            left_out(name, reasons)
        else:
            names.append(name)
    return names


def missing_for(recipe: Recipe, bundle_id: str) -> str | None:
    """Why this machine cannot run bundle `bundle_id` (its runtime or execution provider is absent), or None."""
    spec = recipe.export.bundles[bundle_id]
    return missing_here(spec.runtime, spec.providers)


def left_out(name: str, reason: str) -> None:
    """Say that `bundle-<name>` is not built on this machine, and why."""
    print(f"[bundle-{name}] not built here: {reason} (name it with --only for the whole error)")


def of_command(recipe: Recipe, recipe_file: str, only: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The bundles, then the cascades, that `python -m export bundles` builds: those of `only` (bundle and cascade
    ids; one given twice is built once, as `distill --only` runs a student once), else every one this machine can run
    (`bundles`, `cascades`). An id the recipe has not, or a recipe without an `export` section, raises `RecipeError`
    naming `recipe_file`."""
    if recipe.export is None:
        raise RecipeError(f"{recipe_file}: no `export` section")
    named = recipe.export.cascades
    ids = [*recipe.export.bundles, *named]
    if unknown := not_among("--only", only or (), ids, f"export.bundles or export.cascades of {recipe_file}"):
        raise RecipeError(unknown)
    if not only:
        return bundles(recipe), cascades(recipe)
    return [name for name in dict.fromkeys(only) if name not in named], cascades(recipe, only)
