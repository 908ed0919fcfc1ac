"""The stage contract: skip when current, rebuild on a change here or upstream, verify parents, publish whole."""

import contextlib
import io
import json
import os
import re
import shutil
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from edgedistill.common import atomic, tracking
from edgedistill.common import manifest as mf
from edgedistill.common.recipe import load_recipe, run_dir
from edgedistill.common.stage import FORCED, Artifact, Built, Stage, body, skip_all
from tqdm import tqdm

from tests.common.test_atomic import gone_pid

RECIPE = """
data: {train: a.tsv, dev: b.tsv, label_names: [negative, positive]}
model: {init: some/model}
finetune: {optim: {lr: 0.001}}
"""


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    return lambda **overrides: load_recipe(path, overrides)


def writer(name: str, text: str = "x"):
    """A build body that writes one file and counts its calls."""
    calls = []

    def build(inputs):
        calls.append(inputs)
        return Built(lambda folder: (folder / name).write_text(text), metrics={"m": 1}, line="built", size_of=name)

    build.calls = calls
    return build


def test_a_current_stage_is_skipped(recipe, capsys):
    body = writer("a.txt")
    stage = Stage("up", recipe(), ("data",), body)
    stage.run()
    stage.run()
    assert len(body.calls) == 1
    assert "[up] up to date" in capsys.readouterr().out


def test_a_stage_run_under_a_drawn_bar_draws_it_again_after_its_line(recipe, capsys):
    stage = Stage("up", recipe(), ("data",), writer("a.txt"))
    stage.run()
    with tqdm(total=2, desc="bundles", file=sys.stderr) as drawn:
        drawn.update(1)
        capsys.readouterr()
        stage.run()  # up to date: its line printed with the bar drawn
        assert "bundles:  50%" in capsys.readouterr().err  # drawn again after the line


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda file: file.write_text("y"), "does not match its sha256"),
        (lambda file: file.write_text("longer"), "has 6 bytes, the manifest says 1"),
        (lambda file: file.unlink(), "listed in the manifest but missing"),
    ],
    ids=["edited", "resized", "deleted"],
)
def test_a_stage_whose_files_were_damaged_is_built_again_saying_why(recipe, capsys, damage, reason):
    body = writer("a.txt")
    stage = Stage("up", recipe(), ("data",), body)
    stage.run()
    damage(stage.folder / "a.txt")
    stage.run()
    out = capsys.readouterr().out
    assert len(body.calls) == 2
    assert f"[up] building again: {stage.folder}: a.txt" in out
    assert reason in out
    assert (stage.folder / "a.txt").read_text() == "x"


@pytest.mark.parametrize(
    ("parent", "advice"),
    [("bench", "build it again: edgedistill bench models RECIPE"), ("notes", "run its stage again to rebuild it")],
)
def test_a_damaged_parent_is_refused_naming_the_command_that_builds_it_again(recipe, parent, advice):
    built = Stage(parent, recipe(), ("data",), writer("a.txt"))
    built.run()
    (built.folder / "a.txt").write_text("y")
    child = Stage("report", recipe(), ("data",), writer("r.txt"), (Artifact(parent, built.folder),))
    with pytest.raises(mf.ArtifactError, match=f"does not match its sha256 .*; {advice}$"):
        child.inputs()


def test_a_current_stage_removes_what_a_killed_publish_left(recipe):
    stage = Stage("up", recipe(), ("data",), writer("a.txt"))
    stage.run()
    orphan = atomic.temporary_name(stage.folder, pid=gone_pid())
    shutil.copytree(stage.folder, orphan)
    stage.run()
    assert not orphan.exists()


def test_a_stage_killed_between_the_renames_of_its_publish_gets_its_artifact_back_under_a_live_pid(recipe, capsys):
    stage = Stage("up", recipe(), ("data",), writer("a.txt"))
    stage.run()
    stage.folder.rename(atomic.temporary_name(stage.folder, "old", pid=os.getppid()))  # the pid is now another's
    capsys.readouterr()
    stage.run()
    assert "[up] up to date" in capsys.readouterr().out


def test_a_stage_killed_between_the_renames_of_its_publish_is_current_once_its_lock_is_held(recipe):
    stage = Stage("up", recipe(), ("data",), writer("a.txt"))
    stage.run()
    stage.folder.rename(atomic.temporary_name(stage.folder, "old", pid=os.getppid()))
    with stage.lock():  # what every rank under torchrun decides in, once rank 0 holds the lock
        assert stage.staleness() is None


def test_a_stage_removes_the_temporary_an_earlier_process_of_its_pid_left(recipe):
    stage = Stage("up", recipe(), ("data",), writer("a.txt"))
    stage.run()
    earlier = atomic.temporary_name(stage.folder)
    shutil.copytree(stage.folder, earlier)
    stage.run()
    assert not earlier.exists()


def test_a_rebuilt_stage_names_the_setting_that_changed(recipe, capsys):
    body = writer("a.txt")
    Stage("up", recipe(), ("finetune",), body).run()
    Stage("up", recipe(**{"finetune.optim.lr": 0.1}), ("finetune",), body).run()
    assert "[up] building again: finetune.optim.lr 0.001 -> 0.1\n" in capsys.readouterr().out


def test_a_rebuilt_stage_names_a_data_file_whose_contents_changed(recipe, capsys, tmp_path):
    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\na\t0\n")
    Stage("up", recipe(**{"data.train": str(data), "data.dev": "b.tsv"}), ("data",), writer("a.txt")).run()
    data.write_text("sentence\tlabel\nb\t1\n")
    Stage("up", recipe(**{"data.train": str(data), "data.dev": "b.tsv"}), ("data",), writer("a.txt")).run()
    assert "[up] building again: data.train: its contents changed\n" in capsys.readouterr().out


def test_a_rebuilt_child_names_the_parent_whose_settings_changed(recipe, capsys):
    def child(r):
        return Stage("child", r, ("data",), writer("c.txt"), (Stage("teacher", r, ("finetune",), writer("p.txt")),))

    child(recipe()).parents[0].run()
    child(recipe()).run()
    changed = child(recipe(**{"finetune.optim.lr": 0.1}))
    changed.parents[0].run()
    changed.run()
    assert "[child] building again: parent teacher's settings changed\n" in capsys.readouterr().out


def test_a_rebuilt_child_names_a_parent_it_now_also_reads_as_new(recipe, capsys):
    teacher = Stage("teacher", recipe(), ("finetune",), writer("p.txt"))
    transfer = Stage("transfer", recipe(), ("data",), writer("t.txt"))
    for stage in (teacher, transfer, Stage("child", recipe(), ("data",), writer("c.txt"), (teacher,))):
        stage.run()
    Stage("child", recipe(), ("data",), writer("c.txt"), (teacher, transfer)).run()
    assert "[child] building again: now also built from transfer\n" in capsys.readouterr().out


def _teacher_and_child(r, body=None) -> Stage:
    teacher = Stage("teacher", r, ("finetune",), writer("p.txt"))
    return Stage("child", r, ("data",), body or writer("c.txt"), (teacher,))


def test_a_child_of_a_parent_built_from_other_settings_is_refused_naming_the_setting(recipe):
    _teacher_and_child(recipe()).parents[0].run()
    with pytest.raises(
        mf.ArtifactError,
        match=r"its parent \S*/teacher was built from other settings \(finetune\.optim\.lr 0\.001 -> 0\.1\)",
    ):
        _teacher_and_child(recipe(**{"finetune.optim.lr": 0.1})).run()


def test_a_child_of_a_parent_whose_data_file_is_gone_is_refused_naming_the_file(recipe, tmp_path):
    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\ngood\tpositive\n")
    teacher = Stage("teacher", recipe(**{"data.train": str(data), "data.dev": "b.tsv"}), ("data",), writer("p.txt"))
    teacher.run()
    data.unlink()
    built_on = recipe(**{"data.train": str(data), "data.dev": "b.tsv"})
    child = Stage(
        "child", built_on, ("finetune",), writer("c.txt"), (Stage("teacher", built_on, ("data",), writer("p.txt")),)
    )
    with pytest.raises(
        mf.ArtifactError, match=rf"cannot be told: data.train: {data} not found; set EDGEDISTILL_DATA_DIR"
    ):
        child.run()


def test_a_child_of_a_parent_built_from_other_settings_is_not_built(recipe):
    _teacher_and_child(recipe()).parents[0].run()
    body = writer("c.txt")
    with pytest.raises(mf.ArtifactError):
        _teacher_and_child(recipe(**{"finetune.optim.lr": 0.1}), body).run()
    assert body.calls == []


def test_a_measurement_of_another_artifact_says_so(recipe, capsys, tmp_path):
    bundles = [Stage(name, recipe(), ("data",), writer("model.onnx", name)) for name in ("onnx-a", "onnx-b")]
    for bundle in bundles:
        bundle.run()
    for bundle in bundles:
        Stage("bench", recipe(), (), writer("result.json"), (Artifact("bundle", bundle.folder),)).run()
    assert "[bench] building again: bundle is another artifact or was rebuilt\n" in capsys.readouterr().out


def test_a_stage_built_before_its_settings_were_recorded_is_rebuilt_saying_its_settings_changed(recipe, capsys):
    body = writer("a.txt")
    stage = Stage("up", recipe(), ("finetune",), body)
    stage.run()
    manifest = stage.folder / mf.MANIFEST
    manifest.write_text(manifest.read_text().replace('"hashed"', '"older_release"'))
    Stage("up", recipe(**{"finetune.optim.lr": 0.1}), ("finetune",), body).run()
    assert "[up] building again: its settings or a parent's changed" in capsys.readouterr().out


def test_an_extra_a_later_release_hashes_is_named_once_as_not_recorded(recipe, capsys):
    body = writer("a.txt")
    Stage("up", recipe(), ("finetune",), body, extra={"texts": None}).run()
    Stage("up", recipe(), ("finetune",), body, extra={"texts": None, "server": {"port": 1, "threads": 2}}).run()
    assert "[up] building again: server: not recorded when it was built\n" in capsys.readouterr().out


def test_an_extra_given_no_longer_is_named_once_as_not_recorded_now(recipe, capsys):
    body = writer("a.txt")
    Stage("up", recipe(), ("finetune",), body, extra={"labeller": {"precision": "int8", "smooth": 0.85}}).run()
    Stage("up", recipe(), ("finetune",), body).run()
    assert "[up] building again: labeller: not recorded now\n" in capsys.readouterr().out


def test_the_manifest_lists_the_files_and_the_summary_line_is_printed(recipe, capsys):
    manifest = Stage("up", recipe(), ("data",), writer("a.txt")).run()
    assert set(manifest.files) == {"a.txt"}
    assert manifest.metrics["m"] == 1
    assert manifest.metrics["size_bytes"] == 1
    assert "[up] built, wall" in capsys.readouterr().out


def test_changing_a_declared_setting_rebuilds(recipe):
    body = writer("a.txt")
    Stage("up", recipe(), ("finetune",), body).run()
    Stage("up", recipe(**{"finetune.optim.lr": 0.1}), ("finetune",), body).run()
    assert len(body.calls) == 2


def test_changing_an_undeclared_setting_does_not_rebuild(recipe):
    body = writer("a.txt")
    Stage("up", recipe(), ("data",), body).run()
    Stage("up", recipe(**{"finetune.optim.lr": 0.1}), ("data",), body).run()
    assert len(body.calls) == 1


def test_a_dotted_setting_is_declared_alone(recipe):
    body = writer("a.txt")
    Stage("up", recipe(), ("finetune.optim.lr",), body).run()
    Stage("up", recipe(**{"finetune.optim.seed": 7}), ("finetune.optim.lr",), body).run()
    assert len(body.calls) == 1


def test_a_change_upstream_makes_the_child_stale(recipe):
    parent_body, child_body = writer("p.txt"), writer("c.txt")

    def child(r):
        return Stage("child", r, ("data",), child_body, (Stage("parent", r, ("finetune",), parent_body),))

    before = child(recipe())
    before.parents[0].run()
    before.run()
    assert not child(recipe(**{"finetune.optim.lr": 0.1})).is_current()


def test_a_rebuilt_parent_makes_the_child_stale(recipe):
    parent = Stage("parent", recipe(), ("data",), writer("p.txt"))
    child = Stage("child", recipe(), ("data",), writer("c.txt"), (parent,))
    parent.run()
    child.run()
    Stage("parent", recipe(), ("data",), writer("p.txt", "retrained")).run(force=True)
    assert not child.is_current()


def test_a_parent_built_again_with_the_same_settings_keeps_the_childs_work_from_being_resumed(recipe):
    parent = Stage("parent", recipe(), ("data",), writer("p.txt"))
    child = Stage("child", recipe(), ("data",), writer("c.txt"), (parent,))
    parent.run()
    before = child.inputs().work_key
    Stage("parent", recipe(), ("data",), writer("p.txt", "retrained")).run(force=True)
    assert child.inputs().work_key != before


class _AnHourLater(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz) + timedelta(hours=1)


def test_a_parent_built_again_to_the_same_artifact_lets_the_child_resume_its_work(recipe, monkeypatch):
    parent = Stage("parent", recipe(), ("data",), writer("p.txt"))
    child = Stage("child", recipe(), ("data",), writer("c.txt"), (parent,))
    parent.run()
    before = child.inputs().work_key
    monkeypatch.setattr(mf, "datetime", _AnHourLater)  # built again later: its manifest records another time
    Stage("parent", recipe(), ("data",), writer("p.txt")).run(force=True)
    assert child.inputs().work_key == before


def _parent_and_child(r, parent_text: str = "x") -> Stage:
    parent = Stage("parent", r, ("data",), writer("p.txt", parent_text))
    return Stage("child", r, ("data",), writer("c.txt"), (parent,))


def _built_parent_and_child(r) -> Stage:
    child = _parent_and_child(r)
    child.parents[0].run()
    child.run()
    return child


def test_a_moved_runs_folder_keeps_its_children_current(recipe, tmp_path, monkeypatch):
    _built_parent_and_child(recipe())
    shutil.move(tmp_path / "runs", tmp_path / "moved")
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "moved"))
    assert _parent_and_child(recipe()).is_current()


def test_a_child_in_a_copied_runs_folder_follows_the_parent_beside_it(recipe, tmp_path, monkeypatch):
    _built_parent_and_child(recipe())
    shutil.copytree(tmp_path / "runs", tmp_path / "copy")
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "copy"))
    _parent_and_child(recipe(), "retrained").parents[0].run(force=True)
    assert not _parent_and_child(recipe()).is_current()


def _three_generations(recipe) -> tuple[Stage, Stage, Stage]:
    """A built grandparent, parent and child, each from the one before."""
    grandparent = Stage("grandparent", recipe, ("data",), writer("g.txt"))
    parent = Stage("parent", recipe, ("data",), writer("p.txt"), (grandparent,))
    child = Stage("child", recipe, ("data",), writer("c.txt"), (parent,))
    for stage in (grandparent, parent, child):
        stage.run()
    return grandparent, parent, child


def test_a_child_of_a_parent_built_on_an_artifact_built_again_since_is_stale_naming_both(recipe):
    grandparent, _, child = _three_generations(recipe())
    Stage("grandparent", recipe(), ("data",), writer("g.txt", "retrained")).run(force=True)
    assert child.staleness() == "its parent parent is out of date (its parent grandparent was built again)"


def test_an_out_of_date_parent_is_named_three_generations_up(recipe):
    great = Stage("great", recipe(), ("data",), writer("x.txt"))
    grandparent = Stage("grandparent", recipe(), ("data",), writer("g.txt"), (great,))
    parent = Stage("parent", recipe(), ("data",), writer("p.txt"), (grandparent,))
    child = Stage("child", recipe(), ("data",), writer("c.txt"), (parent,))
    for stage in (great, grandparent, parent, child):
        stage.run()
    Stage("great", recipe(), ("data",), writer("x.txt", "retrained")).run(force=True)
    assert child.staleness() == (
        "its parent parent is out of date (its parent grandparent is out of date (its parent great was built again))"
    )


def test_a_child_of_an_out_of_date_parent_is_refused_naming_the_command_that_builds_the_parent(recipe):
    _, parent, child = _three_generations(recipe())
    Stage("grandparent", recipe(), ("data",), writer("g.txt", "retrained")).run(force=True)
    with pytest.raises(
        mf.ArtifactError, match=f"its parent {parent.folder} is out of date .* first, or `edgedistill all"
    ):
        child.run(force=True)


def test_a_child_of_an_out_of_date_parent_is_not_built(recipe):
    _, _, child = _three_generations(recipe())
    Stage("grandparent", recipe(), ("data",), writer("g.txt", "retrained")).run(force=True)
    with pytest.raises(mf.ArtifactError):
        child.run()
    assert len(child.build.calls) == 1


def test_a_child_stays_current_when_its_grandparent_is_removed(recipe):
    grandparent, _, child = _three_generations(recipe())
    shutil.rmtree(grandparent.folder)
    assert child.is_current()


def test_a_child_whose_parent_was_removed_says_so(recipe, capsys):
    child = _built_parent_and_child(recipe())
    shutil.rmtree(child.parents[0].folder)
    with pytest.raises(mf.ArtifactError):
        child.run()
    assert (
        f"[child] building again: its parent parent is missing ({child.parents[0].folder})" in capsys.readouterr().out
    )


def _labelled_by(labeller: Stage):
    """A build body that chose to read `labeller`'s artifact and records it."""
    return lambda inputs: Built(
        lambda folder: (folder / "labels.txt").write_text("x"),
        parents={labeller.name: mf.parent_of(labeller.folder)},
    )


def test_a_stage_whose_build_read_an_artifact_built_again_since_is_stale_naming_it(recipe):
    labeller = Stage("labeller", recipe(), ("data",), writer("model.onnx"))
    labeller.run()
    stage = Stage("transfer", recipe(), ("data",), _labelled_by(labeller))
    stage.run()
    Stage("labeller", recipe(), ("data",), writer("model.onnx", "rebuilt")).run(force=True)
    assert stage.staleness() == "its parent labeller was built again"


def test_an_artifact_the_build_read_leaves_its_config_hash_as_it_is(recipe):
    labeller = Stage("labeller", recipe(), ("data",), writer("model.onnx"))
    labeller.run()
    stage = Stage("transfer", recipe(), ("data",), _labelled_by(labeller))
    assert stage.run().config_hash == Stage("transfer", recipe(), ("data",), writer("labels.txt")).config_hash


def test_a_current_stage_is_stale_for_the_reason_its_also_stale_check_gives(recipe):
    Stage("transfer", recipe(), ("data",), writer("labels.txt")).run()
    stage = Stage("transfer", recipe(), ("data",), writer("labels.txt"), also_stale=lambda folder: "labelled by x")
    assert stage.staleness() == "labelled by x"


def test_an_also_stale_check_leaves_the_config_hash_as_it_is(recipe):
    checked = Stage("transfer", recipe(), ("data",), writer("labels.txt"), also_stale=lambda folder: None)
    assert checked.config_hash == Stage("transfer", recipe(), ("data",), writer("labels.txt")).config_hash


def test_the_child_records_its_parents_manifest(recipe):
    parent = Stage("parent", recipe(), ("data",), writer("p.txt"))
    parent.run()
    manifest = Stage("child", recipe(), ("data",), writer("c.txt"), (parent,)).run()
    assert manifest.parents["parent"] == mf.parent_of(parent.folder)


def test_a_build_reads_its_parent_through_inputs(recipe):
    parent = Stage("parent", recipe(), ("data",), writer("p.txt", "from parent"))
    parent.run()
    seen = []

    def build(inputs):
        seen.append((inputs.parent("parent") / "p.txt").read_text())
        return Built(lambda folder: None)

    Stage("child", recipe(), ("data",), build, (parent,)).run()
    assert seen == ["from parent"]


def test_an_undeclared_parent_is_refused(recipe):
    def build(inputs):
        inputs.parent("teacher")

    with pytest.raises(mf.ArtifactError, match="not a declared parent"):
        Stage("child", recipe(), ("data",), build).run()


def test_an_altered_parent_is_refused_before_the_build(recipe):
    parent = Stage("parent", recipe(), ("data",), writer("p.txt"))
    parent.run()
    (parent.folder / "p.txt").write_text("y")
    body = writer("c.txt")
    with pytest.raises(mf.ArtifactError, match="p.txt does not match its sha256"):
        Stage("child", recipe(), ("data",), body, (parent,)).run()
    assert body.calls == []


def test_an_altered_parent_is_refused_saying_how_to_rebuild_it(recipe):
    parent = Stage("parent", recipe(), ("data",), writer("p.txt"))
    parent.run()
    (parent.folder / "p.txt").unlink()
    with pytest.raises(mf.ArtifactError, match="p.txt is listed in the manifest but missing; run its stage again"):
        Stage("child", recipe(), ("data",), writer("c.txt"), (parent,)).run()


def test_a_missing_parent_is_refused(recipe):
    parent = Stage("parent", recipe(), ("data",), writer("p.txt"))
    with pytest.raises(mf.ArtifactError, match="manifest.json is missing"):
        Stage("child", recipe(), ("data",), writer("c.txt"), (parent,)).run()


def test_a_stage_whose_parent_is_missing_leaves_no_lock_file(recipe, tmp_path):
    child = Stage("bench-typo", recipe(), (), writer("c.txt"), (Artifact("bundle", tmp_path / "bundle-typo"),))
    with pytest.raises(mf.ArtifactError):
        child.run()
    assert not child.work.with_name("bench-typo.lock").exists()


def test_a_failed_build_leaves_no_artifact_and_keeps_the_old_one(recipe):
    stage = Stage("up", recipe(), ("data",), writer("a.txt", "old"))
    stage.run()

    def fail(folder: Path):
        (folder / "a.txt").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        Stage("up", recipe(), ("data",), lambda inputs: Built(fail)).run(force=True)
    assert (stage.folder / "a.txt").read_text() == "old"
    assert sorted(p.name for p in stage.folder.parent.iterdir()) == [".work", "up"]
    assert [p.name for p in stage.work.parent.iterdir()] == ["up.lock"]  # the stage's lock file alone


def test_a_worker_rank_publishes_nothing(recipe):
    stage = Stage("up", recipe(), ("data",), lambda inputs: None)
    assert stage.run() is None
    assert not stage.folder.exists()


def test_the_work_folder_is_removed_once_published(recipe):
    def build(inputs):
        inputs.work.mkdir(parents=True)
        (inputs.work / "checkpoint.pt").write_text("x")
        return Built(lambda folder: None)

    stage = Stage("up", recipe(), ("data",), build)
    stage.run()
    assert not stage.work.exists()


def test_a_work_folder_a_killed_publish_left_holding_an_artifact_is_removed_by_the_next_run(recipe):
    def build(inputs):
        (inputs.fresh_work() / "model.bin").write_text("v1")
        return Built(None)

    stage = Stage("up", recipe(), ("data",), build)
    stage.run()
    shutil.copytree(stage.folder, stage.work)  # the old artifact, swapped into the work folder's name
    stage.run()
    assert not stage.work.exists()


class _FailingTracker(tracking.Tracker):
    def log_final(self, metrics: dict) -> None:
        raise OSError("tracking store unreachable")


def test_the_work_folder_is_removed_before_the_tracker_records_the_published_metrics(recipe, monkeypatch):
    def build(inputs):
        (inputs.resumable_work() / "checkpoint.pt").write_text("final")
        return Built(lambda folder: (folder / "a.txt").write_text("x"))

    monkeypatch.setattr(tracking, "open_tracker", lambda recipe, stage, config_hash: _FailingTracker())
    stage = Stage("up", recipe(), ("data",), build)
    stage.run(force=True)
    assert not stage.work.exists()


def broken_store(recipe) -> None:
    """Overwrite the recipe's MLflow store in place, as a disk error would: every call on it then fails."""
    store = run_dir(recipe) / tracking.FOLDER / "mlruns" / "mlflow.db"
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_bytes(b"not a database" * 1000)


def model_breaking_the_store(inputs) -> Built:
    """A model's build body that breaks the tracking store as it writes the artifact: the store fails from then on,
    once the artifact is published too."""

    def write(folder):
        (folder / "model.safetensors").write_text("x")
        broken_store(inputs.recipe)

    return Built(write, metrics={"dev_accuracy": 0.9}, line="dev_accuracy=0.9")


@pytest.fixture(scope="module")
def store_broken_after_publish(tmp_path_factory) -> dict:
    """A teacher built with `tracking: mlflow` whose store broke before it published: its config hash, its folder,
    what its run returned and what it printed."""
    runs = tmp_path_factory.mktemp("broken-store")
    (runs / "r.yaml").write_text(RECIPE)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EDGEDISTILL_RUNS_DIR", str(runs / "runs"))
        recipe = load_recipe(runs / "r.yaml", {"tracking": "mlflow"})
        stage = Stage("teacher", recipe, ("data",), model_breaking_the_store)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            manifest = stage.run()
        return {"config_hash": stage.config_hash, "folder": stage.folder, "manifest": manifest, "out": out.getvalue()}


def test_a_tracking_store_failing_after_publish_fails_no_stage(store_broken_after_publish):
    built = store_broken_after_publish
    assert built["manifest"].config_hash == built["config_hash"]


def test_a_tracking_store_failing_after_publish_says_so_in_one_warning(store_broken_after_publish):
    warned = [line for line in store_broken_after_publish["out"].splitlines() if "warning" in line]
    assert warned == [
        "[teacher] warning: tracking failed, the stage goes on untracked: "
        "MlflowException: (sqlite3.DatabaseError) file is not a database"
    ]


def test_a_tracking_store_failing_after_publish_leaves_the_model_its_card(store_broken_after_publish):
    assert (store_broken_after_publish["folder"] / mf.CARD).is_file()


def test_a_tracking_store_failing_after_publish_leaves_the_stages_summary_line(store_broken_after_publish):
    built = store_broken_after_publish
    summary = rf"^\[teacher\] dev_accuracy=0\.9, wall [\d.]+ min -> {re.escape(str(built['folder']))}$"
    assert re.search(summary, built["out"], re.MULTILINE)


def test_a_tracking_store_that_cannot_be_opened_fails_no_build(recipe, capsys):
    chosen = recipe(tracking="mlflow")
    broken_store(chosen)
    stage = Stage("up", chosen, ("data",), writer("a.txt"))
    stage.run()
    assert stage.is_current()


def test_a_tracking_store_that_cannot_be_opened_says_so(recipe, capsys):
    chosen = recipe(tracking="mlflow")
    broken_store(chosen)
    Stage("up", chosen, ("data",), writer("a.txt")).run()
    assert "[up] warning: tracking failed, the stage goes on untracked: " in capsys.readouterr().out


def test_an_up_to_date_model_whose_card_is_missing_gets_it(recipe):
    # a run killed between publishing the model and writing its card: the manifest does not hash the card
    stage = Stage("teacher", recipe(), ("data",), writer("model.safetensors"))
    stage.run()
    (stage.folder / mf.CARD).unlink()
    stage.run()
    assert (stage.folder / mf.CARD).is_file()


def test_an_up_to_date_model_whose_card_is_missing_gets_it_when_a_command_skips_it(recipe):
    stage = Stage("teacher", recipe(), ("data",), writer("model.safetensors"))
    stage.run()
    (stage.folder / mf.CARD).unlink()
    skip_all([stage])
    assert (stage.folder / mf.CARD).is_file()


def failing_after(work: str):
    """A build body that writes into its scratch folder (`work`: "fresh" or "resumable"), then fails."""

    def build(inputs):
        folder = inputs.fresh_work() if work == "fresh" else inputs.resumable_work()
        (folder / "model.onnx").write_text("half")
        raise RuntimeError("the export failed")

    return build


def test_a_failed_build_removes_the_scratch_folder_it_took_fresh(recipe):
    stage = Stage("up", recipe(), ("data",), failing_after("fresh"))
    with pytest.raises(RuntimeError, match="the export failed"):
        stage.run()
    assert not stage.work.exists()


def test_a_failed_build_keeps_its_resumable_work(recipe):
    stage = Stage("up", recipe(), ("data",), failing_after("resumable"))
    with pytest.raises(RuntimeError, match="the export failed"):
        stage.run(force=True)
    assert (stage.work / "model.onnx").read_text() == "half"


def left_by_a_killed_run(stage: Stage, text: str) -> Path:
    """A checkpoint in `stage`'s scratch folder, as a killed run leaves it."""
    stage.work.mkdir(parents=True, exist_ok=True)
    checkpoint = stage.work / "checkpoint.pt"
    checkpoint.write_text(text)
    return checkpoint


def test_a_forced_run_starts_over_from_work_a_plain_run_left(recipe):
    stage = Stage("s", recipe(), ("data",), writer("a.txt"))
    checkpoint = left_by_a_killed_run(stage, "plain")
    stage.inputs(force=True).resumable_work()
    assert not checkpoint.exists()


def test_a_forced_run_run_again_goes_on_from_the_work_the_first_left(recipe):
    stage = Stage("s", recipe(), ("data",), writer("a.txt"))
    stage.inputs(force=True).resumable_work()
    checkpoint = left_by_a_killed_run(stage, "forced")
    stage.inputs(force=True).resumable_work()
    assert checkpoint.read_text() == "forced"


def test_a_forced_run_starts_over_from_work_a_forced_run_of_other_work_left(recipe):
    stage = Stage("s", recipe(), ("data",), writer("a.txt"))
    stage.inputs(force=True).resumable_work("labelled in fp32")
    checkpoint = left_by_a_killed_run(stage, "forced")
    stage.inputs(force=True).resumable_work("labelled in int8")
    assert not checkpoint.exists()


def test_a_plain_run_leaves_the_work_a_killed_run_left_for_the_stage_to_check(recipe):
    stage = Stage("s", recipe(), ("data",), writer("a.txt"))
    checkpoint = left_by_a_killed_run(stage, "plain")
    stage.inputs().resumable_work()
    assert checkpoint.read_text() == "plain"


def test_a_forced_run_starts_over_from_work_a_forced_run_left_after_publishing_it(recipe):
    stage = Stage("s", recipe(), ("data",), writer("a.txt"))
    stage.run()
    stage.inputs(force=True).resumable_work()
    checkpoint = left_by_a_killed_run(stage, "final")
    published = (stage.folder / mf.MANIFEST).stat().st_mtime_ns
    os.utime(stage.work / FORCED, ns=(published - 10**9, published - 10**9))  # marked when it started, before
    stage.inputs(force=True).resumable_work()
    assert not checkpoint.exists()


@pytest.fixture
def body_module(tmp_path, monkeypatch) -> str:
    """The name of a module not yet imported whose `build_stage(inputs, text)` writes `text` to body.txt."""
    name = f"stage_body_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(
        "from edgedistill.common.stage import Built\n\n\n"
        "def build_stage(inputs, text):\n"
        "    return Built(lambda folder: (folder / 'body.txt').write_text(text), line='built')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_body_builds_through_its_modules_build_stage(recipe, body_module):
    stage = Stage("lazy", recipe(), ("data",), body(body_module, text="made"))
    stage.run()
    assert (stage.folder / "body.txt").read_text() == "made"


def test_a_body_imports_its_module_only_once_the_stage_builds(recipe, body_module):
    stage = Stage("lazy", recipe(), ("data",), body(body_module, text="made"))
    stage.is_current()
    assert body_module not in sys.modules


def test_skip_says_a_current_stage_is_up_to_date(recipe, capsys):
    stage = Stage("up", recipe(), ("data",), writer("a.txt"))
    stage.run()
    capsys.readouterr()
    stage.skip()
    assert capsys.readouterr().out == f"[up] up to date: {stage.folder}\n"


def test_skip_of_a_stale_stage_is_false(recipe):
    assert not Stage("up", recipe(), ("data",), writer("a.txt")).skip()


def test_skip_builds_no_stale_stage(recipe):
    build = writer("a.txt")
    Stage("up", recipe(), ("data",), build).skip()
    assert build.calls == []


def test_skip_all_of_current_stages_is_true(recipe):
    stages = [Stage(name, recipe(), ("data",), writer("a.txt")) for name in ("a", "b")]
    for stage in stages:
        stage.run()
    assert skip_all(stages)


def test_skip_all_is_false_where_a_later_stage_is_stale(recipe):
    current, stale = (Stage(name, recipe(), ("data",), writer("a.txt")) for name in ("a", "b"))
    current.run()
    assert not skip_all([current, stale])


def test_skip_all_says_nothing_where_a_later_stage_is_stale(recipe, capsys):
    current, stale = (Stage(name, recipe(), ("data",), writer("a.txt")) for name in ("a", "b"))
    current.run()
    capsys.readouterr()
    skip_all([current, stale])
    assert capsys.readouterr().out == ""


def test_skip_all_under_torchrun_leaves_the_ranks_to_decide_together(recipe, monkeypatch):
    stage = Stage("up", recipe(), ("data",), writer("a.txt"))
    stage.run()
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not skip_all([stage])


class WorkClock:
    """`time` for the stages' stopwatch: it moves only by the seconds a build works (`work`), so that a wall time is
    that of the runs it counts however slowly a loaded machine runs the rest."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def work(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> WorkClock:
    clock = WorkClock()
    monkeypatch.setattr(mf, "time", clock)
    return clock


def stopped_after(clock: WorkClock, seconds: float, times: int = 1):
    """A build body whose first `times` runs each work `seconds` in its resumable work, then are stopped by Ctrl-C;
    the run after them publishes at once."""
    runs = []

    def build(inputs):
        runs.append(work := inputs.resumable_work())
        if len(runs) <= times:
            work.mkdir(parents=True, exist_ok=True)
            (work / "checkpoint.pt").write_text("step 1")
            clock.work(seconds)
            raise KeyboardInterrupt
        return Built(lambda folder: (folder / "a.txt").write_text("x"))

    return build


def test_a_resumed_build_records_the_wall_time_of_its_runs_together(recipe, clock):
    stage = Stage("up", recipe(), ("data",), stopped_after(clock, 0.5))
    with pytest.raises(KeyboardInterrupt):
        stage.run()
    assert stage.run().metrics["wall_seconds"] == 0.5


def test_a_build_stopped_twice_records_the_wall_time_of_its_three_runs_together(recipe, clock):
    stage = Stage("up", recipe(), ("data",), stopped_after(clock, 0.3, times=2))
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            stage.run()
    assert stage.run().metrics["wall_seconds"] == 0.6


def test_the_wall_time_kept_for_another_config_is_not_added(recipe, clock):
    stage = Stage("up", recipe(), ("data",), stopped_after(clock, 0.5))
    with pytest.raises(KeyboardInterrupt):
        stage.run()
    assert Stage("up", recipe(**{"data.dev": "other"}), ("data",), writer("a.txt")).run().metrics["wall_seconds"] == 0


def test_a_forced_run_leaves_out_the_wall_time_of_the_work_it_started_over_from(recipe, clock):
    stage = Stage("up", recipe(), ("data",), stopped_after(clock, 0.5))
    with pytest.raises(KeyboardInterrupt):
        stage.run()
    assert stage.run(force=True).metrics["wall_seconds"] == 0


def test_the_wall_time_kept_for_work_on_a_parent_built_again_since_is_not_added(recipe, clock):
    parent = Stage("parent", recipe(), ("data",), writer("p.txt"))
    child = Stage("child", recipe(), ("data",), stopped_after(clock, 0.5), (parent,))
    parent.run()
    with pytest.raises(KeyboardInterrupt):
        child.run()
    Stage("parent", recipe(), ("data",), writer("p.txt", "retrained")).run(force=True)
    assert child.run().metrics["wall_seconds"] == 0


def test_a_published_manifest_records_its_wall_time_among_its_metrics_alone(recipe):
    stage = Stage("up", recipe(), ("data",), writer("a.txt"))
    stage.run()
    assert "wall_seconds" not in json.loads((stage.folder / mf.MANIFEST).read_text())


def filled(folder: Path) -> None:
    """Take every free block of `folder`'s device."""
    with open(folder / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"x" * 65536)


def stopped_on_a_full_device(error: BaseException | None = None):
    """A build body that fills its device while it works in its resumable work, then raises `error`, or, without
    one, writes its checkpoint."""

    def build(inputs):
        work = inputs.resumable_work()
        work.mkdir(parents=True, exist_ok=True)
        filled(run_dir(inputs.recipe))
        if error is not None:
            raise error
        atomic.atomic_write(work / "checkpoint.pt", b"x" * 8192)

    return build


def test_a_checkpoint_write_on_a_full_device_is_reported_as_that_write(recipe, small_fs, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(small_fs))
    stage = Stage("up", recipe(), ("data",), stopped_on_a_full_device())
    with pytest.raises(atomic.DiskFull, match=r"\(writing checkpoint\.pt\)"):
        stage.run()


def test_ctrl_c_on_a_full_device_stays_an_interrupt(recipe, small_fs, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(small_fs))
    stage = Stage("up", recipe(), ("data",), stopped_on_a_full_device(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        stage.run()


@pytest.fixture
def linked(recipe, tmp_path) -> Stage:
    """A built stage whose artifact folder was moved to another disk and linked back in its place."""
    stage = Stage("up", recipe(), ("data",), writer("a.txt"))
    stage.run()
    moved = tmp_path / "bigger-disk" / "up"
    moved.parent.mkdir()
    stage.folder.rename(moved)
    stage.folder.symlink_to(moved)
    return stage


def test_an_artifact_folder_that_is_a_link_is_refused_before_it_is_built_again(linked):
    with pytest.raises(mf.ArtifactError, match=r"is a link .*link the run folder or the runs folder instead"):
        linked.run(force=True)


def test_an_artifact_folder_that_is_a_link_is_read_where_current(linked):
    assert linked.run().stage == "up"
