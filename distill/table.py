"""The distillation table: each student against the teacher and its label-only baseline, on the recipe's metric.

Retention, baseline and gain compare the metric that selects checkpoints (`data.metric`); the table shows dev
accuracy, that metric when it is another, and the same on the test split when the manifests carry it.
`baseline_from` says where the baseline started: `scratch`, or `teacher` (its layers or embeddings: a
pre-trained smaller model fine-tuned on the labels, `baseline_init_from_teacher`).
"""

import json

from edgedistill.common import manifest as mf
from edgedistill.common import tables
from edgedistill.common.atomic import write_changed
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.distill.metrics import retention
from rich.console import Console

TEXT_COLUMNS = ("student", "arch", "baseline_from")


def figures(recipe: Recipe, test: bool) -> list[str]:
    """The metric columns: dev accuracy, the selection metric when it is another, then their test twins."""
    dev = recipe.data.dev_keys
    return dev + ([key.replace("dev_", "test_", 1) for key in dev] if test else [])


def rows(recipe: Recipe) -> list[dict]:
    """One row per finished student of the recipe (baseline columns empty when it has not run)."""
    folder = run_dir(recipe)
    key = recipe.data.selection_key
    teacher = mf.load(folder / "teacher", verify=False).metrics
    found = [("teacher", "teacher", teacher, None)]
    for name in recipe.distill.students:
        try:
            student = mf.load(folder / f"student-{name}", verify=False)
        except mf.ArtifactError:
            continue
        try:
            baseline = mf.load(folder / f"baseline-{name}", verify=False)
        except mf.ArtifactError:
            baseline = None
        found.append((name, student.info["arch"], student.metrics, baseline))
    columns = figures(recipe, test=any("test_accuracy" in metrics for _, _, metrics, _ in found))
    return [_row(name, arch, m, columns, key, teacher.get(key), baseline) for name, arch, m, baseline in found]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _row(name, arch, m, columns, key, teacher_score, baseline_manifest) -> dict:
    score = m.get(key)
    baseline = baseline_manifest.metrics.get(key) if baseline_manifest else None
    start = None
    if baseline_manifest is not None:
        start = "teacher" if baseline_manifest.info.get("init_from_teacher") else "scratch"
    return {
        "student": name,
        "arch": arch,
        "params": m["params"],
        "size_MiB": round(m["size_bytes"] / 2**20, 2),
        **{column: _rounded(m.get(column)) for column in columns},
        "retention": None if (kept := retention(score, teacher_score)) is None else round(kept, 4),
        "baseline": _rounded(baseline),
        "baseline_from": start,
        "gain": None if None in (score, baseline) else round(score - baseline, 4),
        "wall_min": round(m["wall_seconds"] / 60, 1),
    }


def write(recipe: Recipe) -> list[dict]:
    """Print the table and write `distill-summary.md` and `.json` (its rows, keys in column order) into the run
    folder."""
    table_rows = rows(recipe)
    columns = list(table_rows[0])
    key = recipe.data.selection_key
    cells = [[tables.cell(r[c]) for c in columns] for r in table_rows]
    lines = [
        f"# Distillation: {recipe.name}",
        "",
        f"Checkpoints are selected on {key}; retention, baseline and gain compare {key}.",
        "",
        *tables.markdown(columns, cells),
    ]
    folder = run_dir(recipe)
    write_changed(folder / "distill-summary.md", "\n".join(lines) + "\n")
    write_changed(folder / "distill-summary.json", json.dumps(table_rows, indent=1))
    title = f"distillation: {recipe.name} (selected on {key})"
    Console(width=160).print(tables.console_table(title, columns, cells, TEXT_COLUMNS))
    return table_rows
