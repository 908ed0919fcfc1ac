"""`python -m distill <stage> RECIPE [--section.key=value ...] [--force]`.

Stages: `pretrain`, `finetune`, `teacher` (pretrain when the recipe has a `pretrain` section,
then fine-tune), `transfer` (build and label the transfer set), and `distill` (every student of
the recipe, or those named with `--only`, plus their label-only baselines, then the summary
table; `--jobs N` trains N of them at once in separate processes). A stage whose artifact is up
to date is skipped unless `--force`; a command whose stages are all up to date says so without importing torch.
"""

import argparse
import sys

from edgedistill.common.arguments import ArgumentParser, count
from edgedistill.common.data import DataError
from edgedistill.common.manifest import ArtifactError
from edgedistill.common.recipe import RecipeError, add_recipe_argument, load_command_recipe, parse_overrides
from edgedistill.common.stage import skip_all
from edgedistill.distill import placement, stages, table

STAGES = {
    "pretrain": "pretrain the teacher language model (recipes with a `pretrain` section)",
    "finetune": "fine-tune the teacher for classification",
    "teacher": "pretrain (if the recipe says so) and fine-tune the teacher",
    "transfer": "build the transfer set and label it with the teacher",
    "distill": "distil every student of the recipe and train their baselines, then print the table",
}


def build_parser(prog: str) -> argparse.ArgumentParser:
    """One subcommand per stage; `prog` is what the usage lines start with."""
    parser = ArgumentParser(prog=prog, description=f"`{prog} <stage> RECIPE [--section.key=value ...] [--force]`.")
    parser.set_defaults(only=None, no_baseline=False, jobs=1)
    stages = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for name, summary in STAGES.items():
        stage = stages.add_parser(name, help=summary, description=summary)
        add_recipe_argument(stage, name)
        stage.add_argument("--force", action="store_true", help="rerun even if the artifact is up to date")
    distill = stages.choices["distill"]
    distill.add_argument("--only", action="append", metavar="STUDENT", help="just this student (repeatable)")
    distill.add_argument("--no-baseline", action="store_true", help="skip the label-only baselines")
    distill.add_argument("--jobs", type=count, default=1, help="train this many students/baselines at once (default 1)")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m distill") -> int:
    args, rest = build_parser(prog).parse_known_args(argv)
    try:
        recipe = load_command_recipe(args.recipe, parse_overrides(rest), args.stage, f"{prog} {args.stage}")
        planned = stages.of_command(recipe, args.recipe, args.stage, args.only, not args.no_baseline)
        placement.check(recipe.runtime)
        if not args.force and skip_all(planned):
            if args.stage == "distill":
                table.write(recipe, rest)
            return 0
    except (RecipeError, DataError, ArtifactError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # Building imports torch and transformers (seconds): only once a stage is to be built, so that --help, a usage
    # error and a command whose stages are current answer at once.
    from edgedistill.distill import device, pipeline
    from edgedistill.distill.dist import CollectiveTimeout
    from edgedistill.distill.parallel import JobKilled
    from edgedistill.distill.trainer import CheckpointError

    device.configure_process()
    try:
        pipeline.run(
            recipe,
            args.recipe,
            args.stage,
            args.only,
            args.jobs,
            force=args.force,
            baselines=not args.no_baseline,
            overrides=rest,
        )
    except (RecipeError, DataError, ArtifactError, CheckpointError, CollectiveTimeout, JobKilled) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from edgedistill.cli import run_module

    # as it was run: `distill` in a checkout, `edgedistill.distill`
    run_module(main, f"python -m {__spec__.parent}")
