"""`python -m export <command> RECIPE [--section.key=value ...]`.

Commands: `bundles` (build every bundle of the recipe, or those named with `--only`, each checked
against PyTorch and gated). The bundles are timed by `python -m bench models`.
"""

import argparse
import os
import sys

import torch
import transformers

from common.manifest import ArtifactError
from common.recipe import RecipeError, load_recipe, parse_overrides
from common.runtime import ProviderFallback, TensorRTUnavailable
from export import bundle_stage
from export.onnx_export import ExportError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("bundles",))
    parser.add_argument("recipe")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--only", action="append", help="bundles: just this bundle id (repeatable)")
    args, rest = parser.parse_known_args(argv)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", os.cpu_count() or 1)))
    try:
        recipe = load_recipe(args.recipe, parse_overrides(rest))
        if recipe.export is None:
            raise RecipeError(f"{args.recipe}: no `export` section")
        unknown = set(args.only or ()) - set(recipe.export.bundles)
        if unknown:
            raise RecipeError(f"--only {sorted(unknown)}: not in export.bundles of {args.recipe}")
        bundle_stage.build(recipe, args.only, args.force)
    except (RecipeError, ArtifactError, ExportError, TensorRTUnavailable, ProviderFallback) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
