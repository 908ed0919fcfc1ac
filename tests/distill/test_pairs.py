"""Sentence pairs end to end: the smoke-size pair task through teacher, transfer set, every student and bundle."""

from pathlib import Path

import numpy as np
import pytest
import yaml
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import load_bundle
from edgedistill.common.data import load_splits
from edgedistill.common.recipe import RecipeError, load_recipe

from tests.conftest import build_stages
from tests.pair_task import pair_recipe, share_changed_by_another_b, write_pair_task

STUDENTS = tuple(
    yaml.safe_load(pair_recipe(dict.fromkeys(["train", "dev", "unlabelled"], Path())))["distill"]["students"]
)
MAJORITY = 0.5  # the task is balanced


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory):
    """The pair task's run folder after teacher, distill and bundles; and its recipe."""
    folder = tmp_path_factory.mktemp("pair-task")
    recipe = folder / "pairs.yaml"
    recipe.write_text(pair_recipe(write_pair_task(folder / "data")))
    build_stages(folder / "runs", recipe, ["distill", "teacher"], ["distill", "distill"], ["export", "bundles"])
    return folder / "runs" / "pairs", load_recipe(recipe)


@pytest.mark.slow
@pytest.mark.parametrize("name", STUDENTS)
def test_every_pair_student_beats_the_majority_class(pair_run, name):
    run, _ = pair_run
    assert mf.load(run / f"student-{name}").metrics["dev_accuracy"] > MAJORITY + 0.25


@pytest.mark.slow
@pytest.mark.parametrize("name", STUDENTS)
def test_every_pair_student_reads_sentence_b(pair_run, name):
    run, recipe = pair_run
    _, dev = load_splits(recipe.data)
    assert share_changed_by_another_b(run, name, dev.texts, dev.pairs, recipe.transfer.max_length) > 0.2


@pytest.mark.slow
def test_transfer_set_holds_a_sentence_b_for_every_text(pair_run):
    run, _ = pair_run
    texts = (run / "transfer" / "texts.txt").read_text(encoding="utf-8").splitlines()
    pairs = (run / "transfer" / "pairs.txt").read_text(encoding="utf-8").splitlines()
    assert len(pairs) == len(texts)


@pytest.mark.slow
def test_transfer_set_has_pairs_from_every_source(pair_run):
    run, _ = pair_run
    sources = np.load(run / "transfer" / "meta.npz")["source"]
    assert np.bincount(sources, minlength=3).min() > 0


@pytest.mark.slow
@pytest.mark.parametrize("bundle", ["teacher-fused", "bilstm-fp32", "cnn-folded", "transformer-int8"])
def test_pair_bundle_says_it_takes_pairs(pair_run, bundle):
    run, _ = pair_run
    assert load_bundle(run / f"bundle-{bundle}").spec.text_inputs == ["text", "text_pair"]


@pytest.mark.slow
@pytest.mark.parametrize("bundle", ["teacher-fused", "bilstm-fp32", "cnn-folded", "transformer-int8"])
def test_pair_bundle_reads_segment_ids(pair_run, bundle):
    run, _ = pair_run
    assert "token_type_ids" in load_bundle(run / f"bundle-{bundle}").spec.input_names


def test_pair_data_with_a_gpt_teacher_is_refused_at_load(tmp_path):
    paths = write_pair_task(tmp_path / "data", train=10, dev=4, unlabelled=5)
    recipe = tmp_path / "gpt.yaml"
    recipe.write_text(pair_recipe(paths).replace("family: bert", "family: gpt"))
    with pytest.raises(RecipeError, match="token_type_ids"):
        load_recipe(recipe)


@pytest.mark.slow
@pytest.mark.parametrize("bundle", ["bilstm-fp32", "cnn-folded", "transformer-int8"])
def test_a_bert_pair_bundle_records_no_segment_rule_but_the_token_types_bundles_always_had(pair_run, bundle):
    run, _ = pair_run
    assert "pair_segments" not in mf.load(run / f"bundle-{bundle}").info["bundle"]
