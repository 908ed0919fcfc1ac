"""`python -m report RECIPE [--section.key=value ...]`: write runs/<recipe>/report/index.html and report.md."""

import sys

from edgedistill.common.arguments import ArgumentParser
from edgedistill.common.manifest import ArtifactError
from edgedistill.common.recipe import RecipeError, add_recipe_argument, load_command_recipe, parse_overrides


def main(argv: list[str] | None = None, prog: str = "python -m report") -> int:
    description = f"`{prog} RECIPE [--section.key=value ...]`: write runs/<recipe>/report/index.html and report.md."
    parser = ArgumentParser(prog=prog, description=description)
    add_recipe_argument(parser, "report")
    parser.add_argument("--force", action="store_true", help="render again even if up to date")
    args, rest = parser.parse_known_args(argv)
    from edgedistill.report.render import stage  # matplotlib: run_module names the extra of a missing one

    try:
        stage(load_command_recipe(args.recipe, parse_overrides(rest), "report", prog), rest).run(args.force)
    except (RecipeError, ArtifactError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from edgedistill.cli import run_module

    # as it was run: `report` in a checkout, `edgedistill.report`
    run_module(main, f"python -m {__spec__.parent}", "report")
