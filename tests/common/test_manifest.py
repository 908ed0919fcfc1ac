import json
import re
import shutil

import pytest
from edgedistill.common import manifest as mf


def publish(tmp_path, name="stage", payload=b"weights", parents=None):
    final = tmp_path / name
    with mf.stage_folder(final) as tmp:
        (tmp / "model.bin").write_bytes(payload)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "tok.json").write_text("{}")
        base = mf.Manifest(stage=name, recipe="r", recipe_hash="h", config_hash="c", parents=parents or {})
        return mf.commit(tmp, final, base.model_copy(update={"metrics": {"dev_accuracy": 0.5}}))


def test_round_trip_records_files_and_versions(tmp_path):
    written = publish(tmp_path)
    loaded = mf.load(tmp_path / "stage")
    assert loaded == written
    assert set(loaded.files) == {"model.bin", "sub/tok.json"}
    assert loaded.files["model.bin"].size_bytes == len(b"weights")
    assert "torch" in loaded.versions
    assert loaded.created
    assert not list(tmp_path.glob(".stage.*")), "temporary folders must not be left behind"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "model.bin").write_bytes(b"weightz"), "sha256"),
        (lambda d: (d / "model.bin").write_bytes(b"wei"), "truncated"),
        (lambda d: (d / "model.bin").unlink(), "missing"),
        (lambda d: (d / "manifest.json").unlink(), "not a finished artifact"),
        (lambda d: (d / "manifest.json").write_text("{"), "not a valid manifest"),
    ],
)
def test_damaged_artifact_is_refused(tmp_path, damage, message):
    publish(tmp_path)
    damage(tmp_path / "stage")
    with pytest.raises(mf.ArtifactError, match=message):
        mf.load(tmp_path / "stage")


def test_a_manifest_field_of_the_wrong_type_is_refused_naming_it(tmp_path):
    publish(tmp_path)
    path = tmp_path / "stage" / "manifest.json"
    data = json.loads(path.read_text())
    data["files"]["model.bin"]["size_bytes"] = "big"
    path.write_text(json.dumps(data))
    with pytest.raises(mf.ArtifactError, match="files.model.bin.size_bytes: Input should be a valid integer"):
        mf.load(tmp_path / "stage")


def list_outside_file(tmp_path, name_of) -> None:
    """Add to the stage's manifest a file outside its folder, listed with its true size and sha256, under the name
    `name_of(outside_path)`: verification by hash alone would accept it."""
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"not part of the artifact")
    path = tmp_path / "stage" / "manifest.json"
    data = json.loads(path.read_text())
    entry = {"sha256": mf.sha256_file(outside), "size_bytes": outside.stat().st_size}
    data["files"][name_of(outside)] = entry
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "name_of",
    [lambda outside: "../secret.bin", lambda outside: str(outside), lambda outside: "sub/../../secret.bin"],
    ids=["dot-dot", "absolute", "dot-dot inside a folder"],
)
def test_a_manifest_naming_a_file_outside_its_folder_is_refused(tmp_path, name_of):
    publish(tmp_path)
    list_outside_file(tmp_path, name_of)
    with pytest.raises(mf.ArtifactError, match="a path outside the artifact folder"):
        mf.load(tmp_path / "stage", verify=False)


def test_a_listed_symlink_leading_out_of_the_folder_is_refused(tmp_path):
    publish(tmp_path)
    list_outside_file(tmp_path, lambda outside: "linked.bin")
    (tmp_path / "stage" / "linked.bin").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(mf.ArtifactError, match="a symlink that leads out of the artifact folder"):
        mf.load(tmp_path / "stage")


def test_a_listed_file_under_a_symlinked_folder_leading_out_is_refused(tmp_path):
    publish(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "stage" / "linked").symlink_to(tmp_path / "elsewhere")
    list_outside_file(tmp_path, lambda outside: "linked/secret.bin")
    (tmp_path / "secret.bin").rename(tmp_path / "elsewhere" / "secret.bin")
    with pytest.raises(mf.ArtifactError, match="a symlink that leads out of the artifact folder"):
        mf.load(tmp_path / "stage")


def test_a_listed_file_that_became_a_symlink_loop_is_refused_naming_it(tmp_path):
    publish(tmp_path)
    folder = tmp_path / "stage"
    (folder / "model.bin").unlink()
    (folder / "model.bin").symlink_to(folder / "loop.bin")
    (folder / "loop.bin").symlink_to(folder / "model.bin")
    with pytest.raises(mf.ArtifactError, match="'model.bin', a path that cannot be followed"):
        mf.load(folder, verify=False)


def test_failed_stage_leaves_old_artifact_untouched(tmp_path):
    publish(tmp_path, payload=b"old")
    with pytest.raises(RuntimeError), mf.stage_folder(tmp_path / "stage") as tmp:
        (tmp / "model.bin").write_bytes(b"half")
        raise RuntimeError("killed")
    assert (tmp_path / "stage" / "model.bin").read_bytes() == b"old"
    assert mf.load(tmp_path / "stage").files["model.bin"].size_bytes == 3
    assert [p.name for p in tmp_path.iterdir()] == ["stage"]


def test_a_manifest_of_an_earlier_release_with_its_wall_time_at_the_top_is_current(tmp_path):
    publish(tmp_path)
    path = tmp_path / "stage" / mf.MANIFEST
    path.write_text(json.dumps(json.loads(path.read_text()) | {"wall_seconds": 12.0}))
    assert mf.staleness(tmp_path / "stage", "c") is None


def publish_child(tmp_path) -> dict:
    """A parent artifact and a child built from it; the child's parents (name -> folder)."""
    publish(tmp_path, "parent")
    publish(tmp_path, "child", parents={"parent": mf.parent_of(tmp_path / "parent")})
    return {"parent": tmp_path / "parent"}


def test_a_child_built_from_the_same_config_and_parents_is_not_stale(tmp_path):
    parents = publish_child(tmp_path)
    assert mf.staleness(tmp_path / "child", "c", parents) is None


def test_a_child_of_another_config_is_stale(tmp_path):
    parents = publish_child(tmp_path)
    assert mf.staleness(tmp_path / "child", "other-config", parents) == "its settings or a parent's changed"


def test_a_child_whose_parent_was_rebuilt_is_stale(tmp_path):
    parents = publish_child(tmp_path)
    publish(tmp_path, "parent", payload=b"retrained")
    assert mf.staleness(tmp_path / "child", "c", parents) == "its parent parent was built again"


def test_a_missing_artifact_is_stale(tmp_path):
    assert mf.staleness(tmp_path / "missing", "c") == "not built yet"


RECORDED = {"settings": {"export.opset": 17, "export.min_fp16_agreement": 0.995}, "extra": {}, "parents": {}}


def recorded(hashed: dict) -> mf.Manifest:
    return mf.Manifest(stage="bundle", recipe="r", recipe_hash="h", config_hash="old", hashed=hashed)


def test_a_record_differing_only_by_an_unread_setting_is_of_the_same_config():
    now = {"settings": {"export.opset": 17}, "extra": {}, "parents": {}}
    assert mf.same_config(recorded(RECORDED), "new", now, unread=("export.min_fp16_agreement",))


def test_a_record_differing_by_a_setting_not_named_unread_is_not_of_the_same_config():
    now = {"settings": {"export.opset": 17}, "extra": {}, "parents": {}}
    assert not mf.same_config(recorded(RECORDED), "new", now)


def test_a_record_differing_beside_an_unread_setting_is_not_of_the_same_config():
    now = {"settings": {"export.opset": 18}, "extra": {}, "parents": {}}
    assert not mf.same_config(recorded(RECORDED), "new", now, unread=("export.min_fp16_agreement",))


def test_why_a_record_is_stale_leaves_its_unread_settings_unsaid(tmp_path):
    with mf.stage_folder(tmp_path / "bundle") as tmp:
        mf.commit(tmp, tmp_path / "bundle", recorded(RECORDED))
    now = {"settings": {"export.opset": 18}, "extra": {}, "parents": {}}
    why = mf.staleness(tmp_path / "bundle", "new", hashed=now, unread=("export.min_fp16_agreement",))
    assert why == "export.opset 17 -> 18"


def chain(tmp_path, *names: str) -> None:
    """Artifacts `names` in the run folder `tmp_path`, each built from the one before."""
    for parent, name in zip((None, *names[:-1]), names, strict=True):
        publish(tmp_path, name, parents={parent: mf.parent_of(tmp_path / parent)} if parent else None)


def test_an_artifact_built_on_one_out_of_date_is_built_from_others_naming_both(tmp_path):
    chain(tmp_path, "transfer", "student", "bundle")
    publish(tmp_path, "transfer", payload=b"labelled again")
    assert (
        mf.built_from_others(tmp_path / "bundle")
        == "its parent student is out of date (its parent transfer was built again)"
    )


def test_an_artifact_whose_ancestor_was_removed_is_not_out_of_date(tmp_path):
    chain(tmp_path, "pretrain", "teacher", "transfer")
    shutil.rmtree(tmp_path / "pretrain")
    assert mf.out_of_date(tmp_path / "transfer") is None


def test_a_folder_without_an_artifact_is_not_out_of_date(tmp_path):
    assert mf.out_of_date(tmp_path / "missing") is None


def test_an_artifact_with_an_edited_file_is_not_current(tmp_path):
    publish(tmp_path)
    (tmp_path / "stage" / "model.bin").write_bytes(b"edited")
    assert "model.bin has 6 bytes" in mf.staleness(tmp_path / "stage", "c")


def test_manifest_is_plain_json(tmp_path):
    publish(tmp_path)
    raw = json.loads((tmp_path / "stage" / "manifest.json").read_text())
    assert raw["stage"] == "stage"
    assert raw["metrics"]["dev_accuracy"] == 0.5


def test_a_file_that_grew_is_not_called_truncated(tmp_path):
    publish(tmp_path)
    with open(tmp_path / "stage" / "model.bin", "ab") as handle:
        handle.write(b"++")
    with pytest.raises(mf.ArtifactError, match=r"has 9 bytes, the manifest says 7 \(written to since\?\)"):
        mf.load(tmp_path / "stage")


def test_a_file_that_shrank_is_called_truncated(tmp_path):
    publish(tmp_path)
    (tmp_path / "stage" / "model.bin").write_bytes(b"we")
    with pytest.raises(mf.ArtifactError, match=r"has 2 bytes, the manifest says 7 \(truncated\?\)"):
        mf.load(tmp_path / "stage")


def test_the_finished_artifacts_leave_out_what_a_killed_publish_left(tmp_path):
    publish(tmp_path)
    shutil.copytree(tmp_path / "stage", tmp_path / ".stage.tmp-999")
    assert mf.finished(tmp_path) == [tmp_path / "stage"]


@pytest.mark.parametrize(
    ("folder", "command"),
    [("teacher", "teacher"), ("student-cnn", "distill"), ("baseline-cnn", "distill"), ("bundle-cnn-int8", "bundles")],
)
def test_a_missing_artifact_names_the_command_that_builds_it(tmp_path, folder, command):
    with pytest.raises(
        mf.ArtifactError,
        match=rf"manifest\.json is missing, as the folder does not exist \(build it: edgedistill {command} RECIPE\)",
    ):
        mf.load(tmp_path / folder)


def test_a_missing_artifact_of_no_known_stage_says_to_run_its_stage(tmp_path):
    with pytest.raises(mf.ArtifactError, match=r"the folder does not exist \(run its stage first\)"):
        mf.load(tmp_path / "models" / "bundle")


@pytest.mark.parametrize("name", [mf.MANIFEST, "model.bin"])
def test_a_file_named_for_its_artifact_is_refused_naming_its_folder(tmp_path, name):
    publish(tmp_path)
    folder = tmp_path / "stage"
    refusal = f"{folder / name} is a file, not an artifact folder: give its folder, {folder}"
    with pytest.raises(mf.ArtifactError, match=re.escape(refusal)):
        mf.load(folder / name)


def test_a_folder_without_its_manifest_names_the_command_that_builds_it(tmp_path):
    (tmp_path / "bundle-cnn-int8").mkdir()
    with pytest.raises(mf.ArtifactError, match=r"manifest\.json is missing \(build it: edgedistill bundles RECIPE\)"):
        mf.load(tmp_path / "bundle-cnn-int8")


def test_a_run_folder_given_for_an_artifact_is_answered_with_the_artifacts_it_holds(tmp_path):
    publish(tmp_path)  # tmp_path/stage
    with pytest.raises(mf.ArtifactError, match=r"it holds finished artifacts \(stage\): name one of them"):
        mf.load(tmp_path)


def test_a_misspelt_artifact_folder_is_answered_with_the_finished_one_beside_it(tmp_path):
    publish(tmp_path)  # tmp_path/stage
    with pytest.raises(mf.ArtifactError, match=rf"did you mean {tmp_path / 'stage'}\? else run its stage first"):
        mf.load(tmp_path / "stag")


@pytest.mark.parametrize(("typed", "meant"), [("techer", "teacher"), ("bundel-bilstm-int8", "bundle-bilstm-int8")])
def test_a_misspelt_kind_of_artifact_is_answered_with_the_nearest_finished_one(tmp_path, typed, meant):
    for name in ("teacher", "student-bilstm", "bundle-bilstm-int8"):
        publish(tmp_path, name)
    with pytest.raises(mf.ArtifactError, match=rf"did you mean {tmp_path / meant}\?"):
        mf.load(tmp_path / typed)


def test_a_misspelt_bundle_folder_beside_no_bundle_is_not_answered_with_a_student(tmp_path):
    publish(tmp_path, "student-bilstm")
    with pytest.raises(mf.ArtifactError) as refused:
        mf.load(tmp_path / "bundle-bilstm-int9")
    assert "did you mean" not in str(refused.value)


def test_a_setting_given_is_said_before_the_values_that_changed_with_it():
    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "num_layers": 2}
    was = {"settings": {"model": {"init": None} | sizes}}
    now = {"settings": {"model": {"init": "minilm"} | {key: value * 4 for key, value in sizes.items()}}}
    assert mf.changes(was, now).startswith('model.init null -> "minilm"; ')


def test_a_setting_whose_file_is_gone_is_said_to_be_not_found(tmp_path):
    was = {"settings": {"data": {"train": "sha256:0"}}}
    now = {"settings": {"data": {"train": str(tmp_path / "train.tsv")}}}
    assert mf.changes(was, now).startswith(f"data.train: {tmp_path / 'train.tsv'} not found (set EDGEDISTILL_DATA_DIR")


def test_a_data_file_in_a_list_whose_contents_changed_is_said_so_by_its_key_in_the_list():
    was = {"settings": {"pretrain": {"train_files": ["sha256:0"]}}}
    now = {"settings": {"pretrain": {"train_files": ["sha256:1"]}}}
    assert mf.changes(was, now) == "pretrain.train_files[0]: its contents changed"


def test_a_file_added_to_a_list_is_said_by_its_key_in_the_list():
    was = {"settings": {"transfer": {"unlabelled_files": ["sha256:0"]}}}
    now = {"settings": {"transfer": {"unlabelled_files": ["sha256:0", "sha256:1"]}}}
    assert mf.changes(was, now) == 'transfer.unlabelled_files[1] null -> "sha256:1"'


@pytest.mark.parametrize("value", ["/no/such/file.tsv", "./no-such.tsv", "runs/no-run/teacher", "~/no-such-folder"])
def test_a_local_path_that_does_not_exist_is_gone(value):
    assert mf.gone(value)


@pytest.mark.parametrize("value", ["org/model", "bert-base-uncased", "hub:glue/sst2:train", 0.001])
def test_a_hub_name_or_another_setting_is_not_gone(value):
    assert not mf.gone(value)


def test_a_file_that_is_gone_is_named_by_its_key_in_a_list(tmp_path):
    settings = {"transfer": {"unlabelled_files": [str(tmp_path), str(tmp_path / "wiki.raw")]}}
    assert mf.gone_paths(settings) == [f"transfer.unlabelled_files[1]: {tmp_path / 'wiki.raw'}"]


def test_a_file_added_to_an_artifact_is_refused_naming_it(tmp_path):
    publish(tmp_path)
    folder = tmp_path / "stage"
    (folder / "special_tokens_map.json").write_text('{"pad_token": "[UNK]"}')
    with pytest.raises(mf.ArtifactError, match=r"special_tokens_map\.json is in the folder but not in its manifest"):
        mf.load(folder)


@pytest.mark.parametrize("name", [mf.CARD, ".DS_Store", ".ipynb_checkpoints/notes.json"])
def test_an_artifacts_card_and_hidden_files_are_not_refused(tmp_path, name):
    publish(tmp_path)
    folder = tmp_path / "stage"
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("x")
    assert mf.load(folder).stage == "stage"


def publish_with_hidden_file(tmp_path) -> mf.Manifest:
    """An artifact published while a `.DS_Store` lay in its folder (Finder, or an editor, looking in as it was built)."""
    final = tmp_path / "stage"
    with mf.stage_folder(final) as tmp:
        (tmp / "model.bin").write_bytes(b"weights")
        (tmp / ".DS_Store").write_bytes(b"finder")
        return mf.commit(tmp, final, mf.Manifest(stage="stage", recipe="r", recipe_hash="h", config_hash="c"))


def test_a_hidden_file_in_an_artifact_at_publish_is_not_listed(tmp_path):
    assert set(publish_with_hidden_file(tmp_path).files) == {"model.bin"}


def test_an_artifact_whose_hidden_file_was_removed_since_it_was_published_loads(tmp_path):
    publish_with_hidden_file(tmp_path)
    (tmp_path / "stage" / ".DS_Store").unlink()
    assert mf.load(tmp_path / "stage").stage == "stage"


def test_verifying_an_artifact_gives_the_bytes_of_the_files_kept(tmp_path):
    manifest = publish(tmp_path)
    assert mf.verified(tmp_path / "stage", manifest, keep=["sub/tok.json"]) == {"sub/tok.json": b"{}"}
