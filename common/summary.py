"""The distillation table's file, `distill-summary.json` in a run folder: its rows as the last `make distill` wrote
them (`distill.table`), each with the sha256 of the manifests it was drawn from, and whether they are still of the
artifacts in the run, which the report and the headline ask before they show a figure of it."""

import json
from pathlib import Path

from edgedistill.common import manifest as mf
from edgedistill.common.atomic import write_changed
from edgedistill.common.scores import one_label

FILE = "distill-summary.json"
DRAWN_FROM = "manifest_sha256"  # a row's key: folder -> the sha256 of its manifest when written, null where none was


def _folders(row: dict, first: bool) -> list[str]:
    """The folders the table's row is drawn from: the teacher's (the `first` row), else a student's and its
    baseline's."""
    return ["teacher"] if first else [f"{kind}-{row['student']}" for kind in ("student", "baseline")]


def _sha256(folder: Path) -> str | None:
    manifest = folder / mf.MANIFEST
    return mf.sha256_file(manifest) if manifest.is_file() else None


def sha256(root: Path) -> str | None:
    """The sha256 of the table's file in the run folder `root`, None without one: what a reader of it is current
    against."""
    path = root / FILE
    return mf.sha256_file(path) if path.is_file() else None


def write(root: Path, rows: list[dict]) -> None:
    """The table's `rows` (the teacher's first, keys in column order) into the run folder `root`, each with the sha256
    of the manifests now in the folders it is drawn from."""
    drawn = [row | {DRAWN_FROM: {f: _sha256(root / f) for f in _folders(row, i == 0)}} for i, row in enumerate(rows)]
    write_changed(root / FILE, json.dumps(drawn, indent=1))


def load(root: Path) -> list[dict] | None:
    """The rows of the table in the run folder `root`, keys in column order, without the manifests they were drawn
    from; None when `make distill` has written none."""
    path = root / FILE
    if not path.is_file():
        return None
    return [{k: v for k, v in row.items() if k != DRAWN_FROM} for row in json.loads(path.read_text(encoding="utf-8"))]


def out_of_date(row: dict) -> list[str]:
    """The kinds of a student's row ("student", "baseline") whose figures it leaves out as out of date."""
    return (row.get("out_of_date") or "").split(", ")  # distill.table joins them so


def one_label_note(root: Path, rows: list[dict]) -> str | None:
    """A note naming the models of the table's `rows` in the run folder `root` (the teacher, students and baselines
    whose figures it shows) that predict one label for every dev example (`common.scores.one_label`); None when none
    does."""
    folders = [
        folder
        for i, row in enumerate(rows)
        for folder in _folders(row, i == 0)
        if folder.split("-", 1)[0] not in out_of_date(row) and (root / folder / mf.MANIFEST).is_file()
    ]
    named = [f for f in folders if one_label(mf.load(root / f, verify=False).metrics.get("dev_confusion")) is not None]
    if not named:
        return None
    verb = "predicts" if len(named) == 1 else "predict"
    return (
        f"one label: {', '.join(named)} {verb} one label for every dev example (no more than the majority class); a "
        "retention or gain of such a model says little"
    )


def _redrawn(root: Path, rows: list[dict]) -> str | None:
    """Which folder a row was drawn from holds another manifest now (built again, gone, or built since)."""
    for row in rows:
        for folder, recorded in row.get(DRAWN_FROM, {}).items():
            now = _sha256(root / folder)
            if now is None and recorded is not None:
                return f"{folder} is gone"
            if now != recorded:
                return f"{folder} was built {'since' if recorded is None else 'again'}"
    return None


def _built_from_others(root: Path, rows: list[dict]) -> str | None:
    """Which student or baseline the rows show as current was built from other parents (teacher, transfer set) than
    those now in the run, or on one out of date (`common.manifest.built_from_others`)."""
    for row in rows[1:]:
        for kind in ("student", "baseline"):
            folder = root / f"{kind}-{row['student']}"
            if (
                kind not in out_of_date(row)
                and (folder / mf.MANIFEST).is_file()
                and (why := mf.built_from_others(folder))
            ):
                return f"{folder.name}: {why}"
    return None


def change(root: Path) -> str | None:
    """Why the table in the run folder `root` is not of the artifacts now there: a folder it was drawn from holds
    another manifest than when it was written (a table of an earlier release records none), or a student or baseline
    it shows as current was built from another teacher or transfer set than those now there; None when it is of
    them, or there is no table."""
    path = root / FILE
    if not path.is_file():
        return None
    rows = json.loads(path.read_text(encoding="utf-8"))
    return _redrawn(root, rows) or _built_from_others(root, rows)
