"""The distillation table: each student against the teacher and its label-only baseline."""

import json

from rich.console import Console
from rich.table import Table

from common import manifest as mf
from common.atomic import atomic_write
from common.recipe import Recipe, run_dir

COLUMNS = ("student", "arch", "params", "size_MiB", "dev_accuracy", "retention", "baseline", "gain", "wall_min")


def rows(recipe: Recipe) -> list[dict]:
    """One row per finished student of the recipe (baseline columns empty when it has not run)."""
    folder = run_dir(recipe)
    teacher = mf.load(folder / "teacher", verify=False).metrics
    out = [_row("teacher", "teacher", teacher, teacher["dev_accuracy"], None)]
    for name in recipe.distill.students:
        try:
            student = mf.load(folder / f"student-{name}", verify=False)
        except mf.ArtifactError:
            continue
        try:
            baseline = mf.load(folder / f"baseline-{name}", verify=False).metrics["dev_accuracy"]
        except mf.ArtifactError:
            baseline = None
        out.append(_row(name, student.info["arch"], student.metrics, teacher["dev_accuracy"], baseline))
    return out


def _row(name, arch, m, teacher_acc, baseline) -> dict:
    return {
        "student": name,
        "arch": arch,
        "params": m["params"],
        "size_MiB": round(m["size_bytes"] / 2**20, 2),
        "dev_accuracy": round(m["dev_accuracy"], 4),
        "retention": round(m["dev_accuracy"] / teacher_acc, 4),
        "baseline": None if baseline is None else round(baseline, 4),
        "gain": None if baseline is None else round(m["dev_accuracy"] - baseline, 4),
        "wall_min": round(m["wall_seconds"] / 60, 1),
    }


def write(recipe: Recipe) -> list[dict]:
    """Print the table and write `distill-summary.md` and `.json` into the run folder."""
    table_rows = rows(recipe)
    fmt = lambda v: "-" if v is None else (f"{v:,}" if isinstance(v, int) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in COLUMNS) + " |" for r in table_rows]
    folder = run_dir(recipe)
    atomic_write(folder / "distill-summary.md", f"# Distillation: {recipe.name}\n\n" + "\n".join(lines) + "\n")
    atomic_write(folder / "distill-summary.json", json.dumps(table_rows, indent=1))
    table = Table(title=f"distillation: {recipe.name} (SST-2 dev)", title_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("student", "arch") else "right")
    for r in table_rows:
        table.add_row(*(fmt(r[c]) for c in COLUMNS))
    Console(width=140).print(table)
    return table_rows
