"""`python -m bench <command> RECIPE [options] [--section.key=value ...]`.

Commands: `models` (every bundle beside the teacher in PyTorch eager, batch x length:
runs/<recipe>/bench/), `serving` (one bundle behind the server, against the targets of the
recipe's `bench.serving` section: runs/<recipe>/serve-bench-<bundle id>/), `accuracy` (the recipe's dev split
through the server by both APIs, against the bundle's own predictions and dev accuracy: runs/<recipe>/serve-accuracy-<bundle id>/)
`cascade` (a cascade against its last member served alone: runs/<recipe>/serve-cascade-<name>/), `peers`
(one bundle behind the server, KServe's ModelServer and MLServer, driven by h2load: runs/<recipe>/serve-peers-<bundle id>/)
and `scaling` (one bundle behind the server with 1, 2, ... workers, by h2load: runs/<recipe>/serve-scaling-<bundle id>/).
`--bundle runs/<recipe>/bundle-<id>` (default: the deployed bundle, `export.deploy`) gives the bundle id; each bundle keeps
its own result (`common.measured`).
Exit status: 0 when measured (with `--check`, also every target met, or the served predictions and accuracy equal to the
bundle's but at near-ties), 1 when `--check` found a target missed or a different prediction or accuracy, 2 when the
benchmark could not run, or `--check` found no target the recipe set.
"""

import argparse
import sys
from pathlib import Path

from edgedistill.bench import BUNDLE_HELP, BenchError, slo
from edgedistill.bench.records import ServingResult
from edgedistill.bench.texts import PairsFile, add_texts_arguments
from edgedistill.common.arguments import ArgumentParser
from edgedistill.common.manifest import ArtifactError
from edgedistill.common.recipe import RecipeError, add_recipe_argument, load_command_recipe, parse_overrides
from edgedistill.common.runtime import ModelLoadError, PrecisionRefused, ProviderFallback, TensorRTUnavailable
from edgedistill.common.stage import skip_all
from edgedistill.serve.errors import BundleRejected
from edgedistill.serve.settings import SettingsError


def run_models(recipe, args) -> int:
    from edgedistill.bench import model_stage

    if recipe.export is None:
        raise RecipeError(f"{args.recipe}: no `export` section")
    stage = model_stage.stage(recipe, args.recipe, args.overrides)
    if (timeable := model_stage.timeable(recipe)) and len(stage.parents) == 1:  # the teacher alone: none built
        raise BenchError(
            f"none of the bundles it times here ({', '.join(timeable)}) is built yet: build them first "
            f"(edgedistill bundles {args.recipe}; make bundles in a checkout)"
        )
    if args.force or not skip_all([stage]):  # timing imports torch, transformers and the models' code (seconds)
        from edgedistill.distill import device

        device.configure_process(recipe.bench.models.threads)  # the same count for PyTorch and ONNX Runtime
        stage.run(args.force)
    return 0


def run_serving(recipe, args) -> int:
    from edgedistill.bench import serving
    from edgedistill.common.cascade import is_cascade

    pairs_file = PairsFile.of(args)
    bundle = serving.bundle_to_serve(recipe, args.bundle)
    deployed = recipe.export is not None and bundle == serving.bundle_to_serve(recipe)
    if deployed and is_cascade(bundle):  # as make all and edgedistill all give it; bench cascade measures it
        given = [
            flag for flag, value in (("--check", args.check), ("--texts", args.texts), ("--pairs", args.pairs)) if value
        ]
        if given:
            raise BenchError(
                f"the deployed {bundle.name} is a cascade, which `edgedistill bench cascade` measures against its "
                "last member served alone, on the recipe's dev split and with no targets to check: "
                f"{' and '.join(given)} would do nothing here; drop "
                f"{'them' if len(given) > 1 else 'it'}, or give --bundle a single bundle"
            )
        print(
            f"[serve-bench] none: the deployed {bundle.name} is a cascade, which `edgedistill bench cascade` measures"
        )
        return 0
    stage = serving.stage(recipe, bundle, args.texts, pairs_file=pairs_file)
    stage.run(args.force)
    return checked_targets(stage, args.check, "serving")


def run_accuracy(recipe, args) -> int:
    from edgedistill.bench import accuracy, serving

    bundle = serving.bundle_to_serve(recipe, args.bundle)
    stage = accuracy.stage(recipe, bundle)
    stage.run(args.force)
    result = accuracy.AccuracyResult.load(stage.folder)
    if args.check and not result.passed:
        print(f"[{stage.name}] check failed: {'; '.join(accuracy.failures(result))}", file=sys.stderr)
        return 1
    return 0


def run_cascade(recipe, args) -> int:
    from edgedistill.bench import cascade
    from edgedistill.common.runtime import cascade_missing_here

    if args.cascade is None and not (recipe.export and recipe.export.cascades):
        print(f"[serve-cascade] none: recipe {recipe.name} has no export.cascades")
        return 0
    name = cascade.default_name(recipe, args.cascade)
    if args.cascade is None and (
        absent := cascade_missing_here(recipe.export, name)
    ):  # as `export bundles` left it out
        print(f"[serve-cascade] none here: cascade {name}'s {absent} (name it with --cascade for the whole error)")
        return 0
    cascade.refuse_another_recipe(recipe, name, args.recipe)
    cascade.stage(recipe, name).run(args.force)
    return 0


def run_peers(recipe, args) -> int:
    from edgedistill.bench import serving
    from edgedistill.bench.peers import compare

    bundle = serving.bundle_to_serve(recipe, args.bundle)
    pythons = {"kserve": args.kserve_python, "mlserver": args.mlserver_python}
    stage = compare.stage(recipe, bundle, compare.environments(recipe.bench.peers.peers, pythons))
    stage.run(args.force)
    return checked_targets(stage, args.check, "peers")


def run_scaling(recipe, args) -> int:
    from edgedistill.bench import scaling, serving

    bundle = serving.bundle_to_serve(recipe, args.bundle)
    stage = scaling.stage(recipe, bundle)
    stage.run(args.force)
    return checked_targets(stage, args.check, "scaling")


def checked_targets(stage, check: bool, section: str) -> int:
    """With `check`, 1 when the `ServingResult` in `stage`'s folder missed a target, each named on stderr with its
    figure (a result up to date says nothing else of them), 2 when the recipe's `bench.<section>` set it none to miss,
    else 0."""
    result = ServingResult.load(stage.folder)
    if check and not result.targets:
        print(
            f"[{stage.name}] --check: bench.{section} of the recipe sets no target, so nothing was checked; set one "
            f"(docs/settings.md), or drop --check",
            file=sys.stderr,
        )
        return 2
    if not check or result.passed:
        return 0
    missed = "; ".join(slo.describe(target) for target in result.targets if not target["passed"])
    print(f"[{stage.name}] check failed: {missed}", file=sys.stderr)
    return 1


def add_command(commands, name: str, summary: str) -> argparse.ArgumentParser:
    """A benchmark's subcommand, its summary both in the list of commands and atop its own help."""
    return commands.add_parser(name, help=summary, description=summary)


def main(argv: list[str] | None = None, prog: str = "python -m bench") -> int:
    parser = ArgumentParser(prog=prog, description=f"`{prog} <command> RECIPE [options] [--section.key=value ...]`.")
    commands = parser.add_subparsers(dest="command", required=True)
    timed = add_command(commands, "models", "every bundle beside the teacher in PyTorch eager")
    add_recipe_argument(timed, "bench models")
    timed.add_argument("--force", action="store_true", help="measure again even if up to date")
    timed.set_defaults(command_run=run_models)
    served = add_command(commands, "serving", "one bundle behind the server, against the recipe's targets")
    add_recipe_argument(served, "bench serving")
    served.add_argument("--bundle", type=Path, help=BUNDLE_HELP)
    add_texts_arguments(served)
    served.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    served.add_argument("--force", action="store_true", help="measure again even if up to date")
    served.set_defaults(command_run=run_serving)
    checked = add_command(
        commands,
        "accuracy",
        "the recipe's dev split through the server by both APIs, against the bundle's own predictions and dev accuracy",
    )
    add_recipe_argument(checked, "bench accuracy")
    checked.add_argument("--bundle", type=Path, help=BUNDLE_HELP)
    checked.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when an API's predictions or accuracy differ from the bundle's beyond its near-ties",
    )
    checked.add_argument("--force", action="store_true", help="measure again even if up to date")
    checked.set_defaults(command_run=run_accuracy)
    paired = add_command(commands, "cascade", "a cascade against its last member served alone: capacity, paced p99")
    add_recipe_argument(paired, "bench cascade")
    paired.add_argument(
        "--cascade",
        help="the cascade, by its key in export.cascades (default: export.deploy if it is one, else the first)",
    )
    paired.add_argument("--force", action="store_true", help="measure again even if up to date")
    paired.set_defaults(command_run=run_cascade)
    peers = add_command(commands, "peers", "the server against KServe's ModelServer and MLServer, by h2load")
    add_recipe_argument(peers, "bench peers")
    peers.add_argument("--bundle", type=Path, help=BUNDLE_HELP)
    for peer in ("kserve", "mlserver"):
        peers.add_argument(
            f"--{peer}-python", type=Path, help=f"{peer}'s environment (default: .venv-peers/{peer}/bin/python)"
        )
    peers.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    peers.add_argument("--force", action="store_true", help="measure again even if up to date")
    peers.set_defaults(command_run=run_peers)
    scaled = add_command(commands, "scaling", "the server with 1, 2, ... worker processes, by h2load")
    add_recipe_argument(scaled, "bench scaling")
    scaled.add_argument("--bundle", type=Path, help=BUNDLE_HELP)
    scaled.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    scaled.add_argument("--force", action="store_true", help="measure again even if up to date")
    scaled.set_defaults(command_run=run_scaling)
    args, rest = parser.parse_known_args(argv)
    args.overrides = rest  # the recipe overrides, which a command named in an error carries
    try:
        overrides = parse_overrides(rest)
        recipe = load_command_recipe(args.recipe, overrides, f"bench {args.command}", f"{prog} {args.command}")
        return args.command_run(recipe, args)
    except (
        BenchError,
        RecipeError,
        SettingsError,
        ArtifactError,
        ProviderFallback,
        PrecisionRefused,
        TensorRTUnavailable,
        ModelLoadError,
        BundleRejected,
    ) as err:
        print(f"{prog} {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from edgedistill.cli import run_module

    # as it was run: `bench` in a checkout, `edgedistill.bench`
    run_module(main, f"python -m {__spec__.parent}", "bench")
