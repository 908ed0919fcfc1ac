"""The model benchmark's stage as a recipe declares it (`bench.models` times the models): its parents, the bundles
this machine can time, and the devices the teacher is timed on in PyTorch eager. Declared without the models'
libraries, so that a current benchmark says so at once; resolving a `runtime.device` that may find a GPU imports torch.
"""

from collections.abc import Sequence
from functools import partial

from edgedistill.bench import BenchError
from edgedistill.common import manifest as mf
from edgedistill.common.config.training import RuntimeConfig
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.common.runtime import missing_here
from edgedistill.common.stage import Artifact, Stage, body
from edgedistill.distill import placement
from edgedistill.export import stages as export_stages

STAGE = "bench"


def left_out(spec) -> str | None:
    """Why a bundle cannot be timed here, or None."""
    if spec.runtime != "onnxruntime":
        return f"runtime {spec.runtime} (`edgedistill bench serving` times it behind the server)"
    return missing_here(spec.runtime, spec.providers)


def eager_devices(runtime: RuntimeConfig) -> list[str]:
    """Where the teacher is timed in PyTorch eager (torch's device names): the CPU, which every ratio is against, and
    the GPU that the recipe's `runtime.device` (`EDGEDISTILL_DEVICE`, `--runtime.device`) resolves to, if it resolves
    to one; a device this machine cannot honour is `distill.device.DeviceError`."""
    if placement.on_cpu(runtime):
        return ["cpu"]
    from edgedistill.distill import device  # torch, which finding a GPU takes

    # The eager teacher is timed in fp32 whatever `runtime.precision` says: only the device is resolved.
    on = device.resolve(runtime.model_copy(update={"precision": "fp32"})).device
    return ["cpu"] + ([str(on)] if on.type == "cuda" else [])


def timeable(recipe: Recipe) -> list[str]:
    """The bundles of the recipe this machine can time, built or not."""
    return [bundle_id for bundle_id, spec in recipe.export.bundles.items() if left_out(spec) is None]


def refuse_out_of_date(recipe: Recipe, bundle_ids: list[str], recipe_file: str, overrides: Sequence[str]) -> None:
    """`BenchError` naming each of the built bundles `bundle_ids` that is out of date (`export.stages.bundle`'s
    staleness: built with other settings than the recipe's now, or from a student or teacher built again since), which
    the benchmark would time under the recipe's settings of it, and the command that builds it again on `recipe_file`
    with the recipe `overrides` the benchmark was given (make takes none)."""
    stale = {b: why for b in bundle_ids if (why := export_stages.bundle(recipe, b).staleness())}
    if stale:
        whys = "; ".join(f"bundle-{b} ({why})" for b, why in stale.items())
        only = " ".join(f"--only {b}" for b in stale)
        again = f"edgedistill bundles {recipe_file} {only}"
        again += ", with those of the overrides given here that it reads; make takes none" if overrides else ""
        raise BenchError(
            f"bundles out of date, whose figures it would record as the recipe's: {whys}; build them first "
            f"({again}{'' if overrides else '; make bundles in a checkout'})"
        )


def stage(recipe: Recipe, recipe_file: str = "RECIPE", overrides: Sequence[str] = ()) -> Stage:
    """`runs/<recipe>/bench/`: every bundle this machine can time (and that is built) beside the teacher, timed in
    PyTorch eager on `eager_devices`, which the hash covers as resolved: a GPU that `runtime.device=auto` finds or
    loses, or another `runtime.device`, measures again. Before it is built, a bundle out of date is refused
    (`refuse_out_of_date`)."""
    folder = run_dir(recipe)
    timed = [bundle_id for bundle_id in timeable(recipe) if (folder / f"bundle-{bundle_id}" / mf.MANIFEST).is_file()]
    parents = (
        Artifact("teacher", folder / "teacher"),
        *(Artifact(f"bundle-{b}", folder / f"bundle-{b}") for b in timed),
    )
    devices = eager_devices(recipe.runtime)
    return Stage(
        STAGE,
        recipe,
        ("export.bundles", "bench.models"),
        body("edgedistill.bench.models", devices=devices),
        parents,
        extra={"eager_devices": devices},
        preflight=partial(refuse_out_of_date, recipe, timed, recipe_file, overrides),
    )
