"""`python -m export <command> RECIPE [--section.key=value ...]`.

Commands: `bundles` (build every bundle of the recipe, or those named with `--only`, each checked
against PyTorch and gated, then its confidence cascades) and `labeller` (the bundle `transfer.labeller` names, which labels the
transfer set on the CPU; nothing when the recipe has none or labelling runs on a GPU). The bundles
are timed by `python -m bench models`. A command whose bundles are all up to date says so without importing torch,
transformers or ONNX. Exit status: 0 when built, 1 when a bundle missed its parity or accuracy gate, 2 when the recipe,
an artifact or the machine stopped the build.
"""

import argparse
import sys

from edgedistill.common.arguments import ArgumentParser
from edgedistill.common.manifest import ArtifactError
from edgedistill.common.recipe import RecipeError, add_recipe_argument, load_command_recipe, parse_overrides
from edgedistill.common.stage import skip_all
from edgedistill.distill import placement
from edgedistill.export import stages


def failures() -> tuple[type[Exception], ...]:
    """What a build can meet that is the recipe's, the artifacts' or the machine's doing: a message, not a traceback.
    Imported when a command builds: the export imports torch, transformers and ONNX Runtime (seconds), which --help, a
    usage error and bundles all current need not wait for."""
    from edgedistill.common.data import DataError
    from edgedistill.common.runtime import (
        DeviceError,
        ModelLoadError,
        PrecisionRefused,
        ProviderFallback,
        TensorRTUnavailable,
    )
    from edgedistill.export.onnx_export import ExportError
    from edgedistill.export.tensorrt import EngineBuildError

    return (
        RecipeError,
        DataError,
        ArtifactError,
        ExportError,
        EngineBuildError,
        TensorRTUnavailable,
        ProviderFallback,
        PrecisionRefused,
        ModelLoadError,
        DeviceError,
    )


def planned(recipe, args) -> tuple[list[str], list[str]] | None:
    """The bundles and the cascades the command builds (`export.stages.of_command`), or None where the transfer set
    needs no labeller: the recipe names none, or it is labelled on a GPU, in PyTorch."""
    if args.command == "bundles":
        return stages.of_command(recipe, args.recipe, args.only)
    name = recipe.transfer.labeller if recipe.transfer else None
    if name is None:
        placement.check(recipe.runtime)  # a runtime this machine cannot honour is refused all the same
        print("[labeller] none needed: the recipe names no transfer.labeller; the transfer set is labelled in PyTorch")
        return None
    if placement.on_cpu(recipe.runtime):
        placement.check(recipe.runtime)  # without torch but where it must refuse (fp16)
    else:
        from edgedistill.distill import device  # torch, which resolving `runtime.device` takes

        on = device.for_process(recipe.runtime).device  # refuses what this machine cannot honour
        if on.type != "cpu":
            print(f"[labeller] none needed: the transfer set is labelled in PyTorch on {on}")
            return None
    return [name], []


def kept(recipe, args, ids: list[str]) -> set[str]:
    """The bundles `bundles --force` builds only where stale: the labeller, unless `--only` names it. Built again, it
    would put the transfer set it labelled out of date, and every student and bundle with it; `labeller --force`
    builds it again, and `edgedistill all --force` runs that first."""
    name = recipe.transfer.labeller if recipe.transfer else None
    if args.command != "bundles" or not args.force or name not in ids or name in (args.only or ()):
        return set()
    print(
        f"[bundle-{name}] not forced: it labels the transfer set, which building it again would put out of date, "
        "and every student with it; `edgedistill labeller RECIPE --force` builds it again"
    )
    return {name}


def build(recipe, ids: list[str], names: list[str], force: bool, keep: set[str] = frozenset()) -> int:
    """Build the bundles `ids`, then the cascades `names` (with `force`, all but those of `keep`); the exit status."""
    caught = failures()
    from edgedistill.distill import device
    from edgedistill.export import bundle_stage, cascade
    from edgedistill.export.validate import ExportGateError

    device.configure_process()
    try:
        if ids:
            bundle_stage.build(recipe, ids, force, keep)
        cascade.build(recipe, names, force)
    except ExportGateError as err:  # built and checked, and missed its gate: 1, as a missed target or SLO
        print(f"error: {err}", file=sys.stderr)
        return 1
    except caught as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


COMMANDS = {
    "bundles": "build every bundle of the recipe, each checked against PyTorch and gated, then its cascades",
    "labeller": "build the bundle `transfer.labeller` names, which labels the transfer set on the CPU",
}


def build_parser(prog: str) -> argparse.ArgumentParser:
    """One subcommand per command; `prog` is what the usage lines start with."""
    parser = ArgumentParser(prog=prog, description=f"`{prog} <command> RECIPE [--section.key=value ...]`.")
    parser.set_defaults(only=None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in COMMANDS.items():
        command = commands.add_parser(name, help=summary, description=summary)
        add_recipe_argument(command, name)
        command.add_argument("--force", action="store_true", help="rebuild even if up to date")
    commands.choices["bundles"].add_argument(
        "--only", action="append", metavar="ID", help="just this bundle or cascade id (repeatable)"
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m export") -> int:
    args, rest = build_parser(prog).parse_known_args(argv)
    try:
        recipe = load_command_recipe(args.recipe, parse_overrides(rest), args.command, f"{prog} {args.command}")
        chosen = planned(recipe, args)
        if chosen is None:
            return 0
        ids, names = chosen
        if not args.force and skip_all(
            [*(stages.bundle(recipe, bundle_id) for bundle_id in ids), *(stages.cascade(recipe, n) for n in names)]
        ):
            return 0
    except (RecipeError, ArtifactError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return build(recipe, ids, names, args.force, kept(recipe, args, ids))


if __name__ == "__main__":
    from edgedistill.cli import run_module

    # as it was run: `export` in a checkout, `edgedistill.export`
    run_module(main, f"python -m {__spec__.parent}")
