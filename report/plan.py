"""The artifact folders `make all` writes for a recipe, each with the make target that builds it."""

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
        folders |= {"bench": "bench", "serve-bench": "all", deployed_accuracy(recipe): "all"}
        if (cascade := recipe.export.default_cascade) is not None:
            folders[f"serve-cascade-{cascade}"] = "all"
        folders["loadtest-smoke"] = "all"
    return folders


def deployed_accuracy(recipe: Recipe) -> str | None:
    """The served-accuracy folder of the deployed bundle, `serve-accuracy-<export.deploy>` (`bench.accuracy` keeps one
    per bundle); None without an export section."""
    return None if recipe.export is None else f"serve-accuracy-{recipe.export.deploy}"


def missing(recipe: Recipe, finished: set[str]) -> dict[str, str]:
    """The planned folders not among `finished` (not run yet, failed, or not buildable where the run was made)."""
    return {name: target for name, target in planned(recipe).items() if name not in finished}
