"""The distillation table: each student against the teacher and its label-only baseline, on the recipe's metric.

Retention, baseline and gain compare the metric that selects checkpoints (`data.metric`); the table shows the dev
figures of `DataConfig.dev_keys` (accuracy, that metric, and the F1 figures that fit the task), and the same on the
test split when the manifests carry it.
`baseline_from` says where the baseline started: `scratch`, or `teacher` (its layers or embeddings: a
pre-trained smaller model fine-tuned on the labels, `baseline_init_from_teacher`).
"""

import shlex
from collections.abc import Sequence

from edgedistill.common import manifest as mf
from edgedistill.common import summary, tables
from edgedistill.common.atomic import write_changed
from edgedistill.common.console import Console
from edgedistill.common.recipe import Recipe, run_dir
from edgedistill.distill import stages
from edgedistill.distill.metrics import retention

TEXT_COLUMNS = ("student", "arch", "baseline_from", "out_of_date")


def _built(recipe: Recipe, name: str, baseline: bool) -> tuple[mf.Manifest | None, bool]:
    """The manifest of student `name` (or its baseline), None when it has not run; and whether it is out of date:
    built from other settings than the recipe's now, or from other parents than those now in the run folder
    (`Stage.staleness`)."""
    stage = stages.student(recipe, name, baseline)
    try:
        manifest = mf.load(stage.folder, verify=False)
    except mf.ArtifactError:
        return None, False
    return manifest, not stage.is_current()


def rows(recipe: Recipe) -> list[dict]:
    """One row per finished student of the recipe (baseline columns empty when it has not run). The figures of a
    student or baseline out of date are left out, and an `out_of_date` column, there only then, names them."""
    folder = run_dir(recipe)
    key = recipe.data.selection_key
    teacher = mf.load(folder / "teacher", verify=False).metrics
    found = [("teacher", "teacher", teacher, None, [])]
    for name in recipe.distill.students:
        student, student_stale = _built(recipe, name, baseline=False)
        if student is None:
            continue
        baseline, baseline_stale = _built(recipe, name, baseline=True)
        stale = [kind for kind, out in (("student", student_stale), ("baseline", baseline_stale)) if out]
        metrics = {} if student_stale else student.metrics
        found.append((name, student.info["arch"], metrics, None if baseline_stale else baseline, stale))
    columns = recipe.data.figure_keys(test=any("test_accuracy" in metrics for _, _, metrics, _, _ in found))
    table_rows = [_row(name, arch, m, columns, key, teacher.get(key), baseline) for name, arch, m, baseline, _ in found]
    if any(stale for *_, stale in found):
        for row, (*_, stale) in zip(table_rows, found, strict=True):
            row["out_of_date"] = ", ".join(stale) or None
    return table_rows


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _row(name, arch, m, columns, key, teacher_score, baseline_manifest) -> dict:
    score = m.get(key)
    baseline = baseline_manifest.metrics.get(key) if baseline_manifest else None
    start = None
    if baseline_manifest is not None:
        start = "teacher" if baseline_manifest.info.get("init_from_teacher") else "scratch"
    return {
        "student": name,
        "arch": arch,
        "params": m.get("params"),
        "size_MiB": _rounded(m["size_bytes"] / 2**20 if "size_bytes" in m else None, 2),
        **{column: _rounded(m.get(column)) for column in columns},
        "retention": None if (kept := retention(score, teacher_score)) is None else round(kept, 4),
        "baseline": _rounded(baseline),
        "baseline_from": start,
        "gain": None if None in (score, baseline) else round(score - baseline, 4),
        "wall_min": _rounded(m["wall_seconds"] / 60 if "wall_seconds" in m else None, 1),
    }


def write(recipe: Recipe, overrides: Sequence[str] = ()) -> list[dict]:
    """Print the table and write `distill-summary.md` and `.json` (its rows, keys in column order, each with the
    manifests it was drawn from: `common.summary`) into the run folder. The command its note gives to rebuild what is
    out of date carries the recipe `overrides` (`--section.key=value`) the distill command was given: it refuses
    those it does not take (`load_command_recipe`)."""
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
    notes = []
    if stale := [r["student"] for r in table_rows if r.get("out_of_date")]:
        only = " ".join(f"--only {name}" for name in stale)
        command = f"edgedistill distill RECIPE {only}" + "".join(f" {shlex.quote(arg)}" for arg in overrides)
        notes.append(
            "out_of_date: built from other settings or another teacher or transfer set than the recipe's now, so its "
            f"figures are left out; `{command}` rebuilds them."
        )
    folder = run_dir(recipe)
    if unlearnt := summary.one_label_note(folder, table_rows):
        notes.append(unlearnt)
    lines += [line for note in notes for line in ("", note)]
    write_changed(folder / "distill-summary.md", "\n".join(lines) + "\n")
    summary.write(folder, table_rows)
    title = f"distillation: {recipe.name} (selected on {key})"
    Console(width=160).print(tables.console_table(title, columns, cells, TEXT_COLUMNS))
    for note in notes:
        print(note)
    return table_rows
