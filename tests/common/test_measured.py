import pytest
from edgedistill.common import measured
from edgedistill.common.manifest import ArtifactError


def test_the_runs_own_bundle_is_measured_into_its_ids_folder(tmp_path):
    (tmp_path / "runs" / "bundle-cnn").mkdir(parents=True)
    assert (
        measured.of_bundle(measured.SERVING, tmp_path / "runs" / "bundle-cnn", tmp_path / "runs") == "serve-bench-cnn"
    )


def test_a_bundle_of_another_folder_is_measured_into_its_ids_folder(tmp_path):
    (tmp_path / "runs").mkdir()
    assert measured.of_bundle(measured.SERVING, tmp_path / "elsewhere" / "bundle-cnn", tmp_path / "runs") == (
        "serve-bench-cnn"
    )


def test_a_bundle_named_as_one_of_the_runs_own_is_refused(tmp_path):
    (tmp_path / "runs" / "bundle-cnn").mkdir(parents=True)
    with pytest.raises(ArtifactError, match="has a bundle of that name of its own"):
        measured.of_bundle(measured.SERVING, tmp_path / "elsewhere" / "bundle-cnn", tmp_path / "runs")


def test_a_bundle_folder_without_the_prefix_named_as_one_of_the_runs_own_is_refused(tmp_path):
    (tmp_path / "runs" / "bundle-cnn").mkdir(parents=True)
    with pytest.raises(ArtifactError, match="serve-bench-cnn/ holds"):
        measured.of_bundle(measured.SERVING, tmp_path / "elsewhere" / "cnn", tmp_path / "runs")


def test_the_runs_own_bundle_reached_through_a_link_is_measured_into_its_ids_folder(tmp_path):
    (tmp_path / "runs" / "bundle-cnn").mkdir(parents=True)
    (tmp_path / "deployed").mkdir()
    (tmp_path / "deployed" / "bundle-cnn").symlink_to(tmp_path / "runs" / "bundle-cnn")
    assert measured.of_bundle(measured.ACCURACY, tmp_path / "deployed" / "bundle-cnn", tmp_path / "runs") == (
        "serve-accuracy-cnn"
    )
