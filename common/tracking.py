"""Experiment tracking: training curves and each stage's final metrics, written to TensorBoard or MLflow files.

The recipe's `tracking` key picks the backend; both write files under `runs/<recipe>/tracking/`, so nothing
needs a server:

- `none` (default): nothing is written;
- `tensorboard`: event files in `tensorboard/<stage>/<build>/`, one TensorBoard run per build of a stage, named
  for its start (UTC) and the stage's config hash, e.g. `20261130T223512.345678Z-1a2b3c4d`: a stage built again
  (another setting, --force, a retry) is a run of its own beside the earlier ones, and a build resumed after a kill
  too, its curves going on from the step it resumed at;
- `mlflow`: a SQLite store, `mlruns/mlflow.db` (MLflow's supported file-based store), one MLflow run per build in
  an experiment named after the recipe, named `<stage>-<build>` and tagged with the recipe, the stage and its config
  hash.

`Stage.run` opens a tracker around each build (`stage_run`) and logs the manifest's metrics when it publishes;
the training loop logs its curves to `active()`. Only the main process of a distributed run tracks. The
libraries are an optional extra: a recipe that asks for one that is missing fails when its stage starts. Tracking
fails no build: a tracker that raises (a store locked or full, a disk error) prints one warning and tracks nothing
more of that build (`Guarded`).
"""

import importlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path

from edgedistill.common import locks, progress
from edgedistill.common.machine import main_rank
from edgedistill.common.recipe import Recipe, RecipeError, run_dir

INSTALL = "pip install 'edgedistill[tracking]'"
# backend -> the modules it needs (MLflow's SQLite store runs on SQLAlchemy and Alembic)
MODULES = {"tensorboard": ("tensorboard",), "mlflow": ("mlflow", "sqlalchemy", "alembic")}
FOLDER = "tracking"


class TrackingUnavailable(RecipeError):
    """The recipe asks for a tracking backend whose library is not installed."""


def _numbers(metrics: dict) -> dict[str, float]:
    """The numeric entries of `metrics` (booleans as 0/1), as floats."""
    return {key: float(value) for key, value in metrics.items() if isinstance(value, int | float)}


class Tracker:
    """Where metrics go; this base class is `tracking: none` and keeps nothing."""

    def log(self, metrics: dict, step: int) -> None:
        """Record the numeric `metrics` at training step `step`."""

    def log_final(self, metrics: dict) -> None:
        """Record the numeric metrics of the published stage."""

    def close(self, failed: bool) -> None:
        """Finish the stage's run, marked failed when its build raised."""


NONE = Tracker()


class TensorBoardTracker(Tracker):
    """Scalars in TensorBoard event files; final metrics under `final/`. Written with tensorboard's own event
    writer (the one `torch.utils.tensorboard` wraps), so tracking needs no torch where a stage has none."""

    def __init__(self, folder: Path):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self.writer = EventFileWriter(str(folder), flush_secs=30)

    def log(self, metrics: dict, step: int) -> None:
        values = [self._summary.Value(tag=key, simple_value=value) for key, value in _numbers(metrics).items()]
        self.writer.add_event(self._event(wall_time=time.time(), step=step, summary=self._summary(value=values)))

    def log_final(self, metrics: dict) -> None:
        self.log({f"final/{key}": value for key, value in metrics.items()}, 0)

    def close(self, failed: bool) -> None:
        self.writer.close()


class MlflowTracker(Tracker):
    """One MLflow run in a SQLite store; curves are metric histories, final metrics the run's last values.

    Processes open the store one at a time (a lock file beside it): the first makes its tables and the experiment,
    which MLflow does without a lock of its own, so that parallel students (`distill --jobs`) opening a new store
    at once failed in its migrations. Their later writes are SQLite's to serialise."""

    def __init__(self, folder: Path, experiment: str, run_name: str, tags: dict[str, str]):
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        folder.mkdir(parents=True, exist_ok=True)
        with locks.exclusive(folder / ".store.lock", "mlflow store"):
            self.client = MlflowClient(tracking_uri=f"sqlite:///{(folder / 'mlflow.db').resolve()}")
            found = self.client.get_experiment_by_name(experiment)
            if found is None:
                experiment_id = self.client.create_experiment(experiment, (folder / "artifacts").resolve().as_uri())
            else:
                experiment_id = found.experiment_id
            self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id

    def log(self, metrics: dict, step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(key, value, now, step) for key, value in _numbers(metrics).items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_final(self, metrics: dict) -> None:
        self.log(metrics, 0)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


class Guarded(Tracker):
    """The tracker of one build of `stage`, whose failures fail no build: the first prints one warning, after which
    the build logs nothing more (each call might wait on a locked store), though its run is still closed."""

    def __init__(self, stage: str, tracker: Tracker = NONE):
        self.stage, self.tracker, self.failed = stage, tracker, False

    @classmethod
    def opened(cls, recipe: Recipe, stage: str, config_hash: str) -> "Guarded":
        """`open_tracker`'s tracker; none where the store cannot be opened (one warning)."""
        guarded = cls(stage)
        guarded.tracker = guarded._call(open_tracker, recipe, stage, config_hash) or NONE
        return guarded

    def _call(self, call, *args):
        try:
            return call(*args)
        except Exception as err:
            if not self.failed:  # the first line: an SQL error goes on with its statement
                reason = next(iter(str(err).splitlines()), "")
                progress.write(
                    f"[{self.stage}] warning: tracking failed, the stage goes on untracked: "
                    f"{type(err).__name__}: {reason}"
                )
            self.failed = True
            return None

    def log(self, metrics: dict, step: int) -> None:
        if not self.failed:
            self._call(self.tracker.log, metrics, step)

    def log_final(self, metrics: dict) -> None:
        if not self.failed:
            self._call(self.tracker.log_final, metrics)

    def close(self, failed: bool) -> None:
        self._call(self.tracker.close, failed)


def require(backend: str) -> None:
    """Raise `TrackingUnavailable` naming the install command when `backend`'s library is missing."""
    for module in MODULES.get(backend, ()):
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise TrackingUnavailable(
                f"tracking: {backend} needs the {module} package, which is not installed ({err}): {INSTALL}, "
                "or set tracking: none"
            ) from err


def open_tracker(recipe: Recipe, stage: str, config_hash: str) -> Tracker:
    """The tracker for one build of `stage` (of the stage's `config_hash`) under the recipe's `tracking` backend: a
    run of its own, named for the build's start (UTC) and the config hash."""
    require(recipe.tracking)
    folder = run_dir(recipe) / FOLDER
    build = f"{datetime.now(UTC):%Y%m%dT%H%M%S.%fZ}-{config_hash[:8]}"
    if recipe.tracking == "tensorboard":
        return TensorBoardTracker(folder / "tensorboard" / stage / build)
    if recipe.tracking == "mlflow":
        tags = {"recipe": recipe.name, "stage": stage, "config_hash": config_hash}
        return MlflowTracker(folder / "mlruns", recipe.name, f"{stage}-{build}", tags)
    return NONE


_active: ContextVar[Tracker | None] = ContextVar("tracker", default=None)


def active() -> Tracker:
    """The tracker of the stage being built in this process (`NONE` outside a build)."""
    return _active.get() or NONE


@contextmanager
def stage_run(recipe: Recipe, stage: str, config_hash: str) -> Iterator[Tracker]:
    """Make the tracker of a build of `stage` `active()` for the block, `Guarded`; a worker rank of a distributed run
    tracks nothing. A backend whose library is missing raises `TrackingUnavailable`; a store that cannot be opened
    warns, as `Guarded` does, and the build goes on untracked."""
    require(recipe.tracking)
    tracker = Guarded.opened(recipe, stage, config_hash) if main_rank() else NONE
    token = _active.set(tracker)
    failed = True
    try:
        yield tracker
        failed = False
    finally:
        _active.reset(token)
        tracker.close(failed)
