"""`python -m distill <stage> RECIPE [--section.key=value ...] [--force]`.

Stages: `pretrain`, `finetune`, `teacher` (pretrain when the recipe has a `pretrain` section,
then fine-tune), `transfer` (build and label the transfer set), and `distill` (every student of
the recipe, or those named with `--only`, plus their label-only baselines, then the summary
table; `--jobs N` trains N of them at once in separate processes). A stage whose artifact is up
to date is skipped unless `--force`.
"""

import argparse
import sys

from edgedistill.common.data import DataError
from edgedistill.common.manifest import ArtifactError
from edgedistill.common.recipe import RecipeError, load_recipe, parse_overrides, run_dir
from edgedistill.distill import device, dist, finetune, parallel, pretrain, student_stage, table, transfer
from edgedistill.distill.trainer import CheckpointError

STAGES = {
    "pretrain": "pretrain the teacher language model (recipes with a `pretrain` section)",
    "finetune": "fine-tune the teacher for classification",
    "teacher": "pretrain (if the recipe says so) and fine-tune the teacher",
    "transfer": "build the transfer set and label it with the teacher",
    "distill": "distil every student of the recipe and train their baselines, then print the table",
}


def build_parser(prog: str) -> argparse.ArgumentParser:
    """One subcommand per stage; `prog` is what the usage lines start with."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.set_defaults(only=None, no_baseline=False, jobs=1)
    stages = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    for name, summary in STAGES.items():
        stage = stages.add_parser(name, help=summary, description=summary)
        stage.add_argument("recipe", help="recipe file, e.g. recipes/sst2.yaml")
        stage.add_argument("--force", action="store_true", help="rerun even if the artifact is up to date")
    distill = stages.choices["distill"]
    distill.add_argument("--only", action="append", help="just this student (repeatable)")
    distill.add_argument("--no-baseline", action="store_true", help="skip the label-only baselines")
    distill.add_argument("--jobs", type=int, default=1, help="train this many students/baselines at once")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m distill") -> int:
    args, rest = build_parser(prog).parse_known_args(argv)
    device.configure_process()
    try:
        recipe = load_recipe(args.recipe, parse_overrides(rest))
        placement = device.for_process(recipe.runtime)
        dist.init(placement.device.type)
        dist.check_shared(run_dir(recipe))
        world_size = dist.world_size()
        if dist.is_main():
            p = placement.describe()
            print(f"[runtime] {p['device']} ({p['device_name']}), {p['precision']}, {world_size} process(es)")
        if args.stage == "pretrain" or (args.stage == "teacher" and recipe.pretrain is not None):
            if recipe.pretrain is None:
                raise RecipeError(f"{args.recipe}: no `pretrain` section to run")
            dist.run_stage(pretrain.stage(recipe), args.force)
        if args.stage in ("finetune", "teacher"):
            dist.run_stage(finetune.stage(recipe), args.force)
        if args.stage in ("transfer", "distill") and (recipe.transfer is None or recipe.distill is None):
            raise RecipeError(f"{args.recipe}: needs `transfer` and `distill` sections for stage {args.stage}")
        unknown = set(args.only or ()) - set(recipe.distill.students if recipe.distill else ())
        if unknown:
            raise RecipeError(f"--only {sorted(unknown)}: not in distill.students of {args.recipe}")
        if args.stage == "transfer" and world_size > 1:
            raise RecipeError("the transfer set is labelled in one process: run `make transfer` without torchrun")
        if args.stage == "transfer" or (args.stage == "distill" and world_size == 1):
            transfer.stage(recipe).run(args.force and args.stage == "transfer")
        elif args.stage == "distill" and not transfer.stage(recipe).is_current():
            raise RecipeError(
                "the transfer set is labelled in one process: run `make transfer` before distilling under torchrun"
            )
        if args.stage == "distill":
            jobs = [
                (name, baseline)
                for name in args.only or list(recipe.distill.students)
                for baseline in ((False,) if args.no_baseline else (False, True))
            ]
            if args.jobs > 1 and world_size == 1:
                parallel.run_all(recipe, jobs, args.jobs, force=args.force)
            else:
                for name, baseline in jobs:
                    dist.run_stage(student_stage.stage(recipe, name, baseline), args.force)
            if dist.is_main():
                table.write(recipe)
    except (RecipeError, DataError, ArtifactError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
