"""`python -m common.summary RECIPE`: one line per finished stage of a recipe, from its manifests."""

import sys

from rich.console import Console
from rich.table import Table

from common import manifest as mf
from common.recipe import load_recipe, run_dir

HEADLINE = ("dev_accuracy", "params", "size_bytes", "wall_seconds")


def stage_table(recipe_path: str) -> Table:
    recipe = load_recipe(recipe_path)
    table = Table(title=f"edgedistill: {recipe.name}", title_justify="left")
    for column in ("stage", *HEADLINE, "folder"):
        table.add_column(column, justify="left" if column in ("stage", "folder") else "right")
    for folder in sorted(p for p in run_dir(recipe).iterdir() if (p / mf.MANIFEST).is_file()):
        metrics = mf.load(folder, verify=False).metrics
        cells = [
            f"{metrics['dev_accuracy']:.4f}" if "dev_accuracy" in metrics else "-",
            f"{metrics['params'] / 1e6:.2f}M" if "params" in metrics else "-",
            f"{metrics['size_bytes'] / 2**20:.1f} MiB" if "size_bytes" in metrics else "-",
            f"{metrics['wall_seconds'] / 60:.1f} min" if "wall_seconds" in metrics else "-",
        ]
        table.add_row(folder.name, *cells, str(folder))
    return table


if __name__ == "__main__":
    Console().print(stage_table(sys.argv[1]))
