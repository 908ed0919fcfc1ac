from pathlib import Path

import pytest

from common.recipe import RecipeError, load_recipe, parse_overrides

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, text, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


MINIMAL = "data: {train: a.tsv, dev: b.tsv}\nmodel: {init: some/model}\n"


def test_shipped_recipes_load():
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        recipe = load_recipe(path)
        assert recipe.name == path.stem
        assert "${" not in recipe.data.train


def test_default_recipe_reads_settings(monkeypatch):
    monkeypatch.setenv("DATA_DIR", "/data/here")
    monkeypatch.setenv("TEACHER_INIT", "org/model")
    recipe = load_recipe(ROOT / "recipes" / "sst2.yaml")
    assert recipe.data.train == "/data/here/sst2/train.tsv"
    assert recipe.model.init == "org/model"


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(RecipeError, match=r"finetune\.optim\.lrr: Extra inputs"):
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: {lrr: 1}}\n"))


def test_wrong_type_is_named(tmp_path):
    with pytest.raises(RecipeError, match=r"finetune\.optim\.batch_size"):
        load_recipe(write(tmp_path, MINIMAL + "finetune: {optim: {batch_size: many}}\n"))


def test_cross_field_rule(tmp_path):
    with pytest.raises(RecipeError, match="not divisible"):
        load_recipe(write(tmp_path, MINIMAL.replace("{init: some/model}", "{init: x, hidden_size: 10, num_heads: 3}")))
    with pytest.raises(RecipeError, match="no `pretrain` section"):
        load_recipe(write(tmp_path, MINIMAL.replace("init: some/model", "init: null")))


def test_overrides_parse_and_apply(tmp_path):
    overrides = parse_overrides(["--finetune.optim.lr=3e-5", "--model.family=gpt", "--name=other"])
    recipe = load_recipe(write(tmp_path, MINIMAL), overrides)
    assert recipe.finetune.optim.lr == 3e-5 and recipe.model.family == "gpt" and recipe.name == "other"
    with pytest.raises(RecipeError, match="must look like"):
        parse_overrides(["finetune.optim.lr"])


def test_extends_merges_sections(tmp_path):
    write(tmp_path, MINIMAL + "finetune: {optim: {lr: 0.1, epochs: 3}}\n", "base.yaml")
    recipe = load_recipe(write(tmp_path, "extends: base.yaml\nfinetune: {optim: {lr: 0.2}}\n"))
    assert recipe.name == "exp" and recipe.finetune.optim.lr == 0.2 and recipe.finetune.optim.epochs == 3
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(write(tmp_path, "extends: nope.yaml\n", "bad.yaml"))


def test_unknown_setting_and_missing_file(tmp_path):
    with pytest.raises(RecipeError, match=r"\$\{NOPE\}"):
        load_recipe(write(tmp_path, MINIMAL.replace("a.tsv", "${NOPE}/a.tsv")))
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "missing.yaml")


def test_section_hash_tracks_only_its_sections(tmp_path):
    a = load_recipe(write(tmp_path, MINIMAL))
    b = load_recipe(write(tmp_path, MINIMAL), {"finetune.optim.lr": 1e-3})
    assert a.section_hash("data", "model") == b.section_hash("data", "model")
    assert a.section_hash("finetune") != b.section_hash("finetune")


def test_section_hash_follows_the_data_contents_not_their_paths(tmp_path):
    for place in ("here", "there"):
        (tmp_path / place / "model").mkdir(parents=True)
        (tmp_path / place / "train.tsv").write_text("sentence\tlabel\ngood\t1\n")
        (tmp_path / place / "model" / "config.json").write_text("{}")

    def data_hash(place: str) -> str:
        folder = tmp_path / place
        text = f"data: {{train: {folder}/train.tsv, dev: {folder}/train.tsv}}\nmodel: {{init: {folder}/model}}\n"
        return load_recipe(write(tmp_path, text)).section_hash("data", "model")

    assert data_hash("here") == data_hash("there"), "moved data must keep artifacts current"
    before = data_hash("there")
    (tmp_path / "there" / "train.tsv").write_text("sentence\tlabel\nbad\t0\n")
    assert data_hash("there") != before, "edited data must make artifacts stale"
    (tmp_path / "there" / "model" / "config.json").write_text('{"hidden_size": 8}')
    assert data_hash("here") != data_hash("there"), "an edited model folder must make artifacts stale"
