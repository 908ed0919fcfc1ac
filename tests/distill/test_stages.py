"""The training stages' hashes and what else makes one of them build again."""

import pytest
from edgedistill.common import manifest as mf
from edgedistill.common.recipe import load_command_recipe, parse_overrides
from edgedistill.distill import stages

from tests.conftest import ROOT


def teacher_of(style: str):
    """The teacher stage of recipes/trec.yaml with `transfer.text_style` set to `style`."""
    recipe = load_command_recipe(
        ROOT / "recipes" / "trec.yaml", parse_overrides([f"--transfer.text_style={style}"]), "teacher", "trec.yaml"
    )
    return stages.teacher(recipe)


@pytest.fixture
def teacher_scored_raw(tmp_path, monkeypatch):
    """The raw teacher stage of trec, its folder holding a manifest of the teacher it built."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    stage = teacher_of("raw")
    stage.folder.mkdir(parents=True)
    manifest = mf.Manifest(
        stage="teacher",
        recipe="trec",
        recipe_hash=stage.recipe.hash,
        config_hash=stage.config_hash,
        hashed=stage.hashed,
        info={"text_style": "raw"},
    )
    (stage.folder / mf.MANIFEST).write_text(manifest.model_dump_json())
    return stage


def test_the_teachers_hash_leaves_out_the_text_style(teacher_scored_raw):
    assert teacher_of("ptb_lower").config_hash == teacher_scored_raw.config_hash


def test_a_teacher_scored_on_texts_of_the_recipes_text_style_is_current(teacher_scored_raw):
    assert teacher_scored_raw.staleness() is None


def test_a_teacher_scored_on_texts_of_another_text_style_is_stale_naming_both(teacher_scored_raw):
    assert teacher_of("ptb_lower").staleness() == (
        "its dev and test texts were written raw (info.text_style), and transfer.text_style is ptb_lower"
    )
