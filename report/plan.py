"""The artifact folders `make all` writes for a recipe, each with the make target that builds it."""

from pathlib import Path
from typing import get_args

from edgedistill.common import measured
from edgedistill.common.config.measure import Profile
from edgedistill.common.manifest import MANIFEST
from edgedistill.common.recipe import Recipe


def planned(recipe: Recipe) -> dict[str, str]:
    """Folder name -> make target, in pipeline order."""
    folders = {"pretrain": "teacher"} if recipe.pretrain is not None else {}
    folders["teacher"] = "teacher"
    if recipe.transfer is not None:
        folders["transfer"] = "transfer"
    for name in recipe.distill.students if recipe.distill is not None else ():
        folders |= {f"student-{name}": "distill", f"baseline-{name}": "distill"}
    if recipe.export is not None:
        folders |= {f"bundle-{b}": "bundles" for b in (*recipe.export.bundles, *recipe.export.cascades)}
        folders["bench"] = "bench"
        if recipe.export.deploy not in recipe.export.cascades:  # a deployed cascade's is the cascade benchmark
            folders[deployed(recipe, measured.SERVING)] = "all"
        folders[deployed(recipe, measured.ACCURACY)] = "all"
        if (cascade := recipe.export.default_cascade) is not None:
            folders[f"serve-cascade-{cascade}"] = "all"
        folders[deployed(recipe, measured.loadtest("smoke"))] = "all"
    return folders


def deployed(recipe: Recipe, measurement: str) -> str | None:
    """The folder of `measurement` (`common.measured`: one per bundle) on the deployed bundle, `export.deploy`; None
    without an export section."""
    return None if recipe.export is None else measured.folder_name(measurement, recipe.export.deploy)


MEASURE_AGAIN = {  # measurement kept one folder per bundle -> the make target that measures the deployed bundle
    measured.SERVING: "serve-bench",
    measured.ACCURACY: "serve-accuracy",
    measured.PEERS: "peers-bench",
    measured.SCALING: "scaling-bench",
} | {measured.loadtest(profile): f"loadtest PROFILE={profile}" for profile in get_args(Profile)}


def stale(recipe: Recipe, root: Path) -> dict[str, tuple[str, str]]:
    """The deployed bundle's finished measurements in the run folder `root` that are not of the bundle now there
    (`common.measured.stale`: built again since they ran, or gone): folder name -> why, and the make target that
    measures it again."""
    if recipe.export is None:
        return {}
    bundle = root / f"bundle-{recipe.export.deploy}"
    found = {}
    for measurement, target in MEASURE_AGAIN.items():
        folder = root / deployed(recipe, measurement)
        if (folder / MANIFEST).is_file() and (why := measured.stale(folder, bundle)):
            found[folder.name] = (why, f"make {target}")
    return found


def loadtests(recipe: Recipe) -> list[str]:
    """The folders of the load tests the report shows, sorted: each profile's on the deployed bundle (one folder per
    bundle, `common.measured`) and against the echo server."""
    names = [measured.echo_loadtest(profile) for profile in get_args(Profile)]
    if recipe.export is not None:
        names += [deployed(recipe, measured.loadtest(profile)) for profile in get_args(Profile)]
    return sorted(names)


def missing(recipe: Recipe, finished: set[str]) -> dict[str, str]:
    """The planned folders not among `finished` (not run yet, failed, or not buildable where the run was made). Any of
    the recipe's cascades measured stands for the default one, since `make all CASCADE=x` measures `x`."""
    cascades = {f"serve-cascade-{c}" for c in recipe.export.cascades} if recipe.export is not None else set()
    if cascades & finished:
        finished = finished | cascades
    return {name: target for name, target in planned(recipe).items() if name not in finished}
