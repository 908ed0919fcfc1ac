"""`python -m report RECIPE`: write runs/<recipe>/report/index.html and report.md."""

import sys

from common.recipe import RecipeError, load_recipe, parse_overrides
from report.render import build


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m report RECIPE [--section.key=value ...]", file=sys.stderr)
        return 2
    try:
        build(load_recipe(args[0], parse_overrides(args[1:])))
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
