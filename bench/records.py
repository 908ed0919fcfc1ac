"""The benchmarks' result records, as their JSON files hold them.

`Spread` is a figure's median, min and max over repeats, `Timing` that of one model's timed calls. `ModelTable` is
the model benchmark's `bench.json`; `ServingResult` that of the serving benchmark, the peer comparison and the scaling
benchmark; `machine` and `bundle_record` what each result records of the machine it was measured on and of the
bundle it measured.
"""

import os
import statistics
from pathlib import Path
from typing import Any, ClassVar, Self

from edgedistill.common.bundle import BundleSpec
from edgedistill.common.config.training import METRIC_NAMES, Metric
from edgedistill.common.machine import usable_cores
from edgedistill.common.tables import counted
from pydantic import BaseModel, ConfigDict, Field, model_validator

RESULT_FILE = "bench.json"  # of a ModelTable or a ServingResult


def machine(load_before: tuple[float, float, float], **more: Any) -> dict[str, Any]:
    """The machine a measurement ran on: its CPUs (`cpus`), the cores this process could use of them (`cores`, fewer
    under taskset or a container's CPU quota: `common.machine.usable_cores`), the load average before it
    (`os.getloadavg()` then) and now, after it, and `more` (versions, ...)."""
    return {
        "cpus": os.cpu_count(),
        "cores": usable_cores(),
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        **more,
    }


def cores_phrase(machine: dict[str, Any]) -> str:
    """The cores a measurement could use, as a `machine` record gives them: '2 cores', and '2 cores of 16 CPUs' where
    the machine had more."""
    cores, cpus = machine["cores"], machine["cpus"]
    return counted(cores, "core") if cores == cpus else f"{counted(cores, 'core')} of {cpus} CPUs"


def bundle_record(folder: Path, spec: BundleSpec) -> dict[str, Any]:
    """The bundle a measurement served: its folder, name, version, architecture, precision and runtime."""
    return {"path": str(folder)} | spec.model_dump(include={"name", "version", "arch", "precision", "runtime"})


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Result(Record):
    """A benchmark's result: `FILE` in its artifact folder, beside its tables in markdown, `TABLES`."""

    FILE: ClassVar[str] = RESULT_FILE
    TABLES: ClassVar[str] = "bench.md"

    def save(self, folder: Path, markdown: str) -> None:
        """The result as `FILE` and its tables as `TABLES` in `folder`."""
        (folder / self.FILE).write_text(self.model_dump_json(indent=1) + "\n", encoding="utf-8")
        (folder / self.TABLES).write_text(markdown, encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> Self:
        return cls.model_validate_json((Path(folder) / cls.FILE).read_text(encoding="utf-8"))


class Spread(Record):
    """A figure over repeats."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> "Spread":
        return cls(median=statistics.median(values), min=min(values), max=max(values))


class Timing(Record):
    """Milliseconds per call over `calls` timed calls."""

    median_ms: float
    min_ms: float
    max_ms: float
    calls: int

    @classmethod
    def of(cls, times_ms: list[float]) -> "Timing":
        return cls(
            median_ms=statistics.median(times_ms), min_ms=min(times_ms), max_ms=max(times_ms), calls=len(times_ms)
        )


class Cell(Timing):
    """One model at one batch size and length. A model that cuts texts to fewer tokens (a bundle's `max_length`) is
    timed at those, `timed_length`; `speedup` is against the table's first row at the same shape, None where the
    model was timed at another length than that row."""

    batch: int
    length: int
    timed_length: int
    speedup: float | None
    items_per_s: float

    @model_validator(mode="before")
    @classmethod
    def _timed_at_its_length(cls, data):
        """A cell of a bench.json written before cells recorded `timed_length` counts as timed at its length."""
        if isinstance(data, dict) and "timed_length" not in data:
            return data | {"timed_length": data.get("length")}
        return data

    @property
    def label(self) -> str:
        return f"b{self.batch}_s{self.length}"

    @property
    def cut(self) -> bool:
        """Whether the model was timed at fewer tokens than the cell's length."""
        return self.timed_length != self.length

    @property
    def versus(self) -> str:
        """What a table shows beside the cell's latency: its speedup (`2.1x`), or the length a model cut to fewer
        tokens was timed at (`cut to 64`), which has no speedup of the same shape."""
        return f"cut to {self.timed_length}" if self.speedup is None else f"{self.speedup:.1f}x"


class ModelRow(Record):
    """One model of the model benchmark: what it is, and a cell per batch size and length."""

    model: str
    precision: str
    runtime: str
    size_bytes: int
    dev_accuracy: float
    dev_selected: float | None = Field(
        None, description="the recipe's selection metric on dev (`ModelTable.metric`) when it is not accuracy"
    )
    max_length: int | None = None
    cells: list[Cell]

    def cell(self, batch: int, length: int) -> Cell | None:
        return next((c for c in self.cells if (c.batch, c.length) == (batch, length)), None)


def cut_note(rows: list[ModelRow]) -> str | None:
    """The note under a model benchmark's table of `rows` where a cell says `cut to N` (`Cell.cut`), else None."""
    if not any(cell.cut for row in rows for cell in row.cells):
        return None
    return (
        "cut to N: a bundle whose max_length is N tokens, timed at N where the column asks for more (the server cuts "
        "texts to it), so with no speedup against the teacher at the column's length."
    )


class ModelTable(Result):
    """The model benchmark's `bench.json`: the rows, the teacher in PyTorch eager on the CPU first."""

    threads: int
    metric: Metric = Field("accuracy", description="the recipe's selection metric (`data.metric`)")
    rows: list[ModelRow]

    def dev_columns(self) -> list[str]:
        """Titles of the dev figures a table shows: accuracy, then the selection metric when it is another."""
        return ["dev acc"] + ([] if self.metric == "accuracy" else [f"dev {METRIC_NAMES[self.metric]}"])

    def dev_figures(self, row: ModelRow) -> list[str]:
        """`row`'s figures under `dev_columns` ("-" where its manifest has no such figure)."""
        shown = [f"{row.dev_accuracy:.4f}"]
        if self.metric != "accuracy":
            shown.append("-" if row.dev_selected is None else f"{row.dev_selected:.4f}")
        return shown

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(batch, length) of every cell, in the order of the columns."""
        return [(c.batch, c.length) for c in self.rows[0].cells]


class ServingResult(Result):
    """The `bench.json` of the serving benchmark, the peer comparison and the scaling benchmark (`bench.serving`,
    `bench.peers.compare`, `bench.scaling`): every repeat's figures per run (a phase, of a server or a worker count
    in the last two), their spreads, the ratios between runs and the targets' verdicts."""

    bundle: dict[str, Any]
    settings: dict[str, Any]
    options: dict[str, Any]
    texts: dict[str, Any]
    machine: dict[str, Any]
    runs: dict[str, list[dict[str, Any]]]
    summary: dict[str, dict[str, Spread]]
    ratios: dict[str, float]
    targets: list[dict[str, Any]]
    passed: bool

    def median(self, phase: str, figure: str) -> float:
        return self.summary[phase][figure].median

    def failed_calls(self) -> int:
        """The calls that failed over every run and repeat."""
        return sum(record.get("failures", 0) for records in self.runs.values() for record in records)
