"""Reading a bundle's spec: what an older or edited manifest gets instead of a model served the wrong way."""

import json

import pytest
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import (
    TOKEN_INPUTS,
    VERSION_DIGITS,
    NotABundle,
    load_bundle,
    pad_value,
    read_bundle,
    tokenizer_json,
)
from tokenizers import Tokenizer

from tests.serve.conftest import pair_spec, spec, tiny_tokenizer, write_bundle, write_cascade


def edited_spec(folder, edit):
    """`folder`, its manifest's bundle spec changed by `edit(spec)` in place."""
    path = folder / mf.MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest["info"]["bundle"])
    path.write_text(json.dumps(manifest))
    return folder


def without_pad_id(folder):
    """`folder`'s manifest as a version before bundles recorded their padding id wrote it."""
    return edited_spec(folder, lambda spec: spec.pop("pad_token_id"))


def test_a_bundle_without_its_padding_id_is_refused_with_the_way_out(tmp_path):
    folder = without_pad_id(write_bundle(tmp_path / "bundle"))
    with pytest.raises(mf.ArtifactError, match="before bundles recorded their padding id: build it again"):
        load_bundle(folder, verify=False)


def test_reading_a_bundle_to_serve_refuses_one_without_its_padding_id(tmp_path):
    folder = without_pad_id(write_bundle(tmp_path / "bundle"))
    with pytest.raises(mf.ArtifactError, match="pad_token_id"):
        read_bundle(folder)


def with_bad_max_length(folder):
    """`folder`'s manifest with a spec field of the wrong type."""
    return edited_spec(folder, lambda spec: spec.update(max_length="long"))


def test_an_invalid_bundle_spec_is_refused_naming_the_key_and_its_problem(tmp_path):
    folder = with_bad_max_length(write_bundle(tmp_path / "bundle"))
    with pytest.raises(mf.ArtifactError, match="invalid bundle spec: max_length: Input should be a valid integer"):
        load_bundle(folder, verify=False)


def test_an_invalid_bundle_spec_is_refused_without_the_validators_dump_of_the_input(tmp_path):
    folder = with_bad_max_length(write_bundle(tmp_path / "bundle"))
    with pytest.raises(mf.ArtifactError, match="invalid bundle spec: max_length: ") as caught:
        load_bundle(folder, verify=False)
    assert "input_value" not in str(caught.value)


def test_a_bundle_spec_whose_model_file_its_runtime_does_not_load_is_refused(tmp_path):
    folder = edited_spec(write_bundle(tmp_path / "bundle"), lambda spec: spec.update(runtime="tensorrt"))
    with pytest.raises(mf.ArtifactError, match=r"model_file 'model.onnx' is not what runtime tensorrt loads"):
        load_bundle(folder, verify=False)


def test_the_padding_id_is_read_from_the_spec(tmp_path):
    assert load_bundle(write_bundle(tmp_path / "bundle", pad_token_id=4)).spec.pad_token_id == 4


def test_a_spec_that_splits_pairs_by_token_types_writes_no_pair_segments():
    assert "pair_segments" not in spec(**pair_spec()).model_dump()  # as every bundle built before the rule was named


def test_a_bundle_s_pair_segments_are_read_from_the_spec(tmp_path):
    bundle = write_bundle(tmp_path / "bundle", **pair_spec(pair_segments="sequence_ids"))
    assert load_bundle(bundle).spec.pair_segments == "sequence_ids"


def bundle_tokenizer(max_length: int) -> Tokenizer:
    """The tiny tokenizer (saved truncating and padding at its own length) as a bundle of `max_length` writes it."""
    data = json.loads(tiny_tokenizer().to_str())
    return Tokenizer.from_str(json.dumps(tokenizer_json(data, max_length)))


def test_a_bundles_tokenizer_json_truncates_at_the_bundles_max_length():
    assert len(bundle_tokenizer(5).encode("good " * 40).ids) == 5


def test_a_bundles_tokenizer_json_pads_nothing():
    assert len(bundle_tokenizer(5).encode("good").ids) == 3


def another_stages_artifact(folder):
    """A finished artifact of another stage than the bundles' (a teacher's) in `folder`."""
    with mf.stage_folder(folder) as tmp:
        (tmp / "weights.bin").write_bytes(b"weights")
        mf.commit(tmp, folder, mf.Manifest(stage="teacher", recipe="tests", recipe_hash="0", config_hash="0"))
    return folder


def test_another_stages_artifact_is_refused_as_no_bundle(tmp_path):
    with pytest.raises(NotABundle, match="is a 'teacher' artifact, not a bundle"):
        load_bundle(another_stages_artifact(tmp_path / "teacher"))


def test_a_cascade_is_refused_as_a_bundle_with_where_its_members_are(tmp_path):
    small, big = write_bundle(tmp_path / "small"), write_bundle(tmp_path / "big")
    folder = write_cascade(tmp_path / "cascade", {"small": small, "big": big}, [0.9])
    with pytest.raises(NotABundle, match="is a confidence cascade, not a bundle: its members are bundles, in"):
        load_bundle(folder)


MODEL_SHA256 = "ab" * 32


def test_a_content_version_differs_for_another_model_file():
    assert spec().content_versioned(MODEL_SHA256).version != spec().content_versioned("cd" * 32).version


def test_a_content_version_differs_for_another_spec():
    other = spec(max_length=8).content_versioned(MODEL_SHA256)
    assert other.version != spec().content_versioned(MODEL_SHA256).version


def test_a_content_version_leaves_the_version_it_replaces_out():
    assert spec(version="7").content_versioned(MODEL_SHA256) == spec().content_versioned(MODEL_SHA256)


def test_a_content_version_has_its_number_of_hex_digits():
    assert len(spec().content_versioned(MODEL_SHA256).version) == VERSION_DIGITS


def test_reading_a_bundle_to_serve_refuses_a_file_its_manifest_does_not_list(tmp_path):
    folder = write_bundle(tmp_path / "bundle")
    (folder / "special_tokens_map.json").write_text('{"pad_token": "[UNK]"}')
    with pytest.raises(mf.ArtifactError, match=r"special_tokens_map\.json is in the folder but not in its manifest"):
        read_bundle(folder)


def add_file(folder):
    (folder / "special_tokens_map.json").write_text("{}")


def replace_by_folder(folder):
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").mkdir()


def remove(folder):
    (folder / "tokenizer.json").unlink()


def edit(folder):
    model = folder / "model.onnx"
    model.write_bytes(model.read_bytes()[:-1] + b"!")


def grow(folder):
    with open(folder / "model.onnx", "ab") as handle:
        handle.write(b"+")


@pytest.mark.parametrize("damage", [add_file, replace_by_folder, remove, edit, grow])
def test_reading_a_bundle_to_serve_refuses_a_damaged_one_as_loading_its_manifest_does(tmp_path, damage):
    folder = write_bundle(tmp_path / "bundle")
    damage(folder)
    with pytest.raises(mf.ArtifactError) as loading:
        mf.load(folder)
    with pytest.raises(mf.ArtifactError) as serving:
        read_bundle(folder)
    assert str(serving.value) == str(loading.value)


def test_reading_a_bundle_to_serve_lets_its_card_be(tmp_path):
    folder = write_bundle(tmp_path / "bundle")
    (folder / mf.CARD).write_text("# bundle")
    assert read_bundle(folder)[0].folder == folder


def test_a_shorter_rows_input_ids_are_padded_with_the_pad_id():
    assert pad_value("input_ids", 50256) == 50256


@pytest.mark.parametrize("name", TOKEN_INPUTS[1:])
def test_a_shorter_rows_other_token_inputs_are_padded_with_zero_whatever_the_pad_id(name):
    assert pad_value(name, 50256) == 0
