"""Experiment tracking: a training stage's curves and final metrics in TensorBoard event files and an MLflow store,
nothing for `tracking: none`, and a clear error when the recipe's backend is not installed."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common import tracking
from edgedistill.common.config.training import OptimConfig, RuntimeConfig
from edgedistill.common.recipe import load_recipe, run_dir
from edgedistill.common.stage import Built, Stage
from edgedistill.distill.device import resolve
from edgedistill.distill.trainer import LOG_EVERY, Trainer

RECIPE = """
data: {train: a.tsv, dev: b.tsv, label_names: [negative, positive]}
model: {init: some/model}
"""
STEPS = 2 * LOG_EVERY
X = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
Y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0])


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    return lambda backend: load_recipe(path, {"tracking": backend})


def broken(inputs):
    raise RuntimeError("the build failed")


def tracked(folder, backend: str) -> Path:
    """`runs/r/` after the stage `tiny` (a tiny training loop) and the failing stage `broken` ran under `backend`."""
    (folder / "r.yaml").write_text(RECIPE)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EDGEDISTILL_RUNS_DIR", str(folder / "runs"))
        chosen = load_recipe(folder / "r.yaml", {"tracking": backend})
        Stage("tiny", chosen, ("data",), train).run()
        with pytest.raises(RuntimeError):
            Stage("broken", chosen, ("data",), broken).run()
        return run_dir(chosen)


def train(inputs) -> Built:
    """A stage body: a linear model trained for STEPS steps, evaluated every LOG_EVERY steps."""
    torch.manual_seed(0)
    cfg = OptimConfig(lr=0.1, batch_size=16, max_steps=STEPS, eval_every=LOG_EVERY)
    placement = resolve(RuntimeConfig(device="cpu", precision="fp32"))
    trainer = Trainer(torch.nn.Linear(4, 1), cfg, inputs.work, inputs.work_key, "tiny", placement)
    trainer.fit(
        batches_for_epoch=lambda epoch: [list(range(16))] * STEPS,
        make_batch=lambda idx: (X[idx], Y[idx]),
        loss_fn=lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1]),
        evaluate=lambda m: {"score": 0.5},
        metric="score",
        on_best=lambda m, _: None,
    )
    return Built(lambda folder: (folder / "a.txt").write_text("x"), metrics={"score": 0.5, "steps": STEPS})


@pytest.fixture(scope="module")
def tensorboard_run(tmp_path_factory):
    """The scalars the stage `tiny` tracked with `tracking: tensorboard`, by tag: [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = tracked(tmp_path_factory.mktemp("tensorboard"), "tensorboard")
    (build,) = (runs / "tracking" / "tensorboard" / "tiny").iterdir()
    events = EventAccumulator(str(build)).Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_holds_the_training_loss_curve(tensorboard_run):
    assert [step for step, _ in tensorboard_run["train/loss"]] == [LOG_EVERY, STEPS]


def test_tensorboard_holds_the_learning_rate_and_throughput(tensorboard_run):
    assert {"train/lr", "train/examples_per_s"} <= set(tensorboard_run)


def test_tensorboard_holds_each_evaluation(tensorboard_run):
    assert tensorboard_run["eval/score"] == [(LOG_EVERY, 0.5), (STEPS, 0.5)]


def test_tensorboard_holds_the_published_metrics(tensorboard_run):
    assert tensorboard_run["final/steps"] == [(0, STEPS)]


def test_each_build_of_a_stage_is_a_tensorboard_run_of_its_own(recipe):
    # TensorBoard reads the event files of one folder as one run: a rebuild's curves would draw over the first's
    chosen = recipe("tensorboard")
    Stage("tiny", chosen, ("data",), train).run()
    Stage("tiny", chosen, ("data",), train).run(force=True)
    events = (run_dir(chosen) / "tracking" / "tensorboard" / "tiny").rglob("events.out.tfevents.*")
    assert len({event.parent for event in events}) == 2


@pytest.fixture(scope="module")
def mlflow_runs(tmp_path_factory):
    """The MLflow client on the store of `tracked` with `tracking: mlflow`, its runs by stage, and the run folder."""
    from mlflow.tracking import MlflowClient

    runs = tracked(tmp_path_factory.mktemp("mlflow"), "mlflow")
    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'tracking' / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(runs.name)
    return client, {run.data.tags["stage"]: run for run in client.search_runs([experiment.experiment_id])}, runs


def test_mlflow_holds_a_finished_run_of_the_stage(mlflow_runs):
    _, runs, _ = mlflow_runs
    assert runs["tiny"].info.status == "FINISHED"


def test_an_mlflow_run_is_tagged_with_the_config_hash_of_the_artifact_it_built(mlflow_runs):
    _, runs, folder = mlflow_runs
    assert runs["tiny"].data.tags["config_hash"] == mf.load(folder / "tiny", verify=False).config_hash


def test_an_mlflow_run_is_tagged_with_its_recipe(mlflow_runs):
    _, runs, _ = mlflow_runs
    assert runs["tiny"].data.tags["recipe"] == "r"


def test_an_mlflow_run_is_named_for_its_stage_start_and_config_hash(mlflow_runs):
    _, runs, _ = mlflow_runs
    run = runs["tiny"]
    assert re.fullmatch(rf"tiny-\d{{8}}T\d{{6}}\.\d{{6}}Z-{run.data.tags['config_hash'][:8]}", run.info.run_name)


def test_each_build_of_a_stage_is_an_mlflow_run_of_its_own_name(recipe):
    from mlflow.tracking import MlflowClient

    chosen = recipe("mlflow")
    Stage("tiny", chosen, ("data",), train).run()
    Stage("tiny", chosen, ("data",), train).run(force=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir(chosen) / 'tracking' / 'mlruns' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("r").experiment_id])
    assert len({run.info.run_name for run in runs}) == 2


def test_a_failed_build_is_a_failed_mlflow_run(mlflow_runs):
    _, runs, _ = mlflow_runs
    assert runs["broken"].info.status == "FAILED"


def test_mlflow_holds_the_training_loss_curve(mlflow_runs):
    client, runs, _ = mlflow_runs
    assert [m.step for m in client.get_metric_history(runs["tiny"].info.run_id, "train/loss")] == [LOG_EVERY, STEPS]


def test_mlflow_holds_the_published_metrics(mlflow_runs):
    _, runs, _ = mlflow_runs
    assert runs["tiny"].data.metrics["steps"] == STEPS


OPEN_RUN = """
import sys
from pathlib import Path
from edgedistill.common.tracking import MlflowTracker

tracker = MlflowTracker(Path(sys.argv[1]), "r", sys.argv[2], {})
tracker.log({"loss": 1.0}, 1)
tracker.close(False)
"""
AT_ONCE = 4


@pytest.fixture(scope="module")
def opened_at_once(tmp_path_factory):
    """Processes that opened one new MLflow store at once, as parallel students do: (their exit statuses, the
    names of the store's finished runs)."""
    from mlflow.tracking import MlflowClient

    store = tmp_path_factory.mktemp("at-once") / "mlruns"
    procs = [
        subprocess.Popen([sys.executable, "-c", OPEN_RUN, str(store), f"student-{i}"], stderr=subprocess.DEVNULL)
        for i in range(AT_ONCE)
    ]
    statuses = [proc.wait(timeout=300) for proc in procs]
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("r").experiment_id])
    return statuses, sorted(run.info.run_name for run in runs if run.info.status == "FINISHED")


def test_processes_opening_a_new_mlflow_store_at_once_all_succeed(opened_at_once):
    statuses, _ = opened_at_once
    assert statuses == [0] * AT_ONCE


def test_processes_opening_a_new_mlflow_store_at_once_each_finish_a_run(opened_at_once):
    _, names = opened_at_once
    assert names == [f"student-{i}" for i in range(AT_ONCE)]


class FailingTracker(tracking.Tracker):
    """A tracker whose store fails every call: the calls it was given, by name."""

    def __init__(self):
        self.calls = []

    def log(self, metrics: dict, step: int) -> None:
        self.calls.append("log")
        raise OSError("disk full")

    def close(self, failed: bool) -> None:
        self.calls.append("close")
        raise OSError("disk full")


def test_a_tracker_that_failed_logs_nothing_more_of_the_build():
    failing = FailingTracker()
    guarded = tracking.Guarded("tiny", failing)
    guarded.log({"loss": 1.0}, 10)
    guarded.log({"loss": 0.5}, 20)
    assert failing.calls == ["log"]


def test_a_tracker_that_failed_still_closes_its_run():
    failing = FailingTracker()
    guarded = tracking.Guarded("tiny", failing)
    guarded.log({"loss": 1.0}, 10)
    guarded.close(False)
    assert failing.calls == ["log", "close"]


def test_a_tracker_that_fails_warns_once(capsys):
    guarded = tracking.Guarded("tiny", FailingTracker())
    guarded.log({"loss": 1.0}, 10)
    guarded.close(False)
    assert (
        capsys.readouterr().out == "[tiny] warning: tracking failed, the stage goes on untracked: OSError: disk full\n"
    )


def test_a_tracker_failing_in_training_fails_no_build(recipe, monkeypatch):
    monkeypatch.setattr(tracking, "open_tracker", lambda recipe, stage, config_hash: FailingTracker())
    chosen = recipe("mlflow")
    Stage("tiny", chosen, ("data",), train).run()
    assert (run_dir(chosen) / "tiny" / "a.txt").is_file()


def test_tracking_none_writes_no_tracking_folder(recipe):
    chosen = recipe("none")
    Stage("tiny", chosen, ("data",), train).run()
    assert not (run_dir(chosen) / "tracking").exists()


@pytest.mark.parametrize("backend", ["tensorboard", "mlflow"])
def test_a_missing_backend_names_the_install_command(recipe, monkeypatch, backend):
    monkeypatch.setitem(sys.modules, backend, None)  # makes `import <backend>` raise ImportError
    with pytest.raises(tracking.TrackingUnavailable, match=r"pip install 'edgedistill\[tracking\]'"):
        Stage("tiny", recipe(backend), ("data",), train).run()


def test_a_missing_backend_fails_before_the_build(recipe, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    calls = []
    with pytest.raises(tracking.TrackingUnavailable):
        Stage("tiny", recipe("mlflow"), ("data",), lambda inputs: calls.append(inputs)).run()
    assert calls == []


def test_tracking_leaves_the_recipe_hash_alone(recipe):
    assert recipe("tensorboard").hash == recipe("none").hash
