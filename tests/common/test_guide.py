from pathlib import Path

from edgedistill.common import guide

ROOT = Path(__file__).resolve().parents[2]


def test_a_page_is_named_from_the_checkout_as_docs_and_its_name(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert guide.page("settings.md") == "docs/settings.md"


def test_a_page_is_named_by_its_full_path_outside_the_checkout(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert guide.page("settings.md") == str(ROOT / "docs" / "settings.md")


def test_an_anchor_follows_the_page_after_a_hash(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert guide.page("export.md", "fusion-by-model-type") == "docs/export.md#fusion-by-model-type"


def test_a_page_is_named_by_its_full_path_from_a_folder_above_the_checkout(monkeypatch):
    monkeypatch.chdir(ROOT.parent)
    assert guide.page("settings.md") == str(ROOT / "docs" / "settings.md")


def test_a_page_is_named_by_its_full_path_from_a_working_directory_since_deleted(monkeypatch, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert guide.page("settings.md") == str(ROOT / "docs" / "settings.md")
