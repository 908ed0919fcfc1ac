"""Sentence pairs with a teacher whose tokenizer gives token type ids but marks no sentence B with 1, beside a model
with two token types: the teacher's bundle is checked and served with the type ids it was trained with (all 0), its
students' with segment ids made from the tokenizer's sequence ids."""

import numpy as np
import pytest
import torch
from edgedistill.bench import models
from edgedistill.common.bundle import load_bundle, read_bundle
from edgedistill.distill import heads
from edgedistill.distill.finetune import hf_logits, predict_logits
from edgedistill.distill.student_stage import load_student, student_logits
from edgedistill.distill.tokenization import encode, load_tokenizer
from edgedistill.export.bundle_stage import SourceCache
from edgedistill.export.cascade import Member

from tests.distill.test_roberta_pairs import roberta_pair_recipe
from tests.pair_task import dev_pairs, run_pair_stages
from tests.serve.conftest import served_probabilities
from tests.untyped_bert_init import write_untyped_bert

BUNDLES = {"teacher-onnx": "teacher", "bilstm-fp32": "bilstm"}


def untyped_pair_recipe(paths, init) -> str:
    """A smoke-size pair recipe fine-tuning the checkpoint `init`, with a BiLSTM student, and a bundle of each."""
    head = roberta_pair_recipe(paths, init).split("distill:\n", 1)[0]
    return (
        head
        + """\
distill:
  deploy: bilstm
  students:
    bilstm:
      model: {arch: bilstm, embed_dim: 32, hidden_size: 32}
      optim: {lr: 3.0e-3, epochs: 3, batch_size: 64}
export:
  deploy: bilstm-fp32
  bundles:
"""
        + "".join(f"    {bundle}: {{source: {source}}}\n" for bundle, source in BUNDLES.items())
    )


@pytest.fixture(scope="module")
def untyped_run(tmp_path_factory):
    """The run folder of the pair task after teacher, student (no baseline) and bundles; its recipe."""
    folder = tmp_path_factory.mktemp("untyped-pairs")
    return run_pair_stages(folder, write_untyped_bert, untyped_pair_recipe)


def trained_logits(run, recipe, source: str, texts: list[str], pairs: list[str]) -> np.ndarray:
    """The PyTorch teacher's or student's logits on the pairs as its training tokenized them, (N, C)."""
    tokenizer = load_tokenizer(str(run / "teacher"))
    if source == "teacher":
        model = heads.load_teacher(run / "teacher").eval()
        feats = encode(tokenizer, texts, pairs, recipe.model.max_length)
        with torch.no_grad():
            return predict_logits(hf_logits(model), feats, tokenizer.pad_token_id)
    student, _ = load_student(run / f"student-{source}")
    feats = encode(tokenizer, texts, pairs, recipe.transfer.max_length, student_segments=True)
    return student_logits(student, feats, tokenizer.pad_token_id)


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def test_the_untyped_checkpoint_gives_token_type_ids_of_zero_to_a_pair(tmp_path):
    tokenizer = load_tokenizer(str(write_untyped_bert(tmp_path / "bert", ["a text", "its pair"])))
    assert set(tokenizer("a text", "its pair")["token_type_ids"]) == {0}


@pytest.mark.slow
def test_an_untyped_teacher_bundle_takes_token_type_ids(untyped_run):
    run, _ = untyped_run
    assert "token_type_ids" in load_bundle(run / "bundle-teacher-onnx").spec.input_names


@pytest.mark.slow
@pytest.mark.parametrize(("bundle", "rule"), [("teacher-onnx", "token_types"), ("bilstm-fp32", "sequence_ids")])
def test_an_untyped_pair_bundle_makes_token_type_ids_as_its_model_was_trained(untyped_run, bundle, rule):
    run, _ = untyped_run
    assert load_bundle(run / f"bundle-{bundle}").spec.pair_segments == rule


@pytest.mark.slow
def test_the_untyped_teacher_bundle_is_checked_against_the_teacher_on_its_training_inputs(untyped_run, tmp_path):
    run, recipe = untyped_run
    _, _, checked = SourceCache(recipe, tmp_path / "scratch").get("teacher", run / "teacher", run / "teacher")
    np.testing.assert_allclose(checked, trained_logits(run, recipe, "teacher", *dev_pairs(recipe)), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("bundle", BUNDLES)
def test_a_cascade_member_runs_an_untyped_pair_bundle_as_its_model_was_trained(untyped_run, bundle):
    run, recipe = untyped_run
    texts, pairs = dev_pairs(recipe)
    tokenizer = load_tokenizer(str(run / "teacher"))
    got = Member(run / f"bundle-{bundle}").logits(tokenizer, texts, pairs)
    np.testing.assert_allclose(got, trained_logits(run, recipe, BUNDLES[bundle], texts, pairs), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("bundle", BUNDLES)
def test_a_served_untyped_pair_gets_the_pytorch_model_s_prediction(untyped_run, bundle):
    run, recipe = untyped_run
    texts, pairs = dev_pairs(recipe, 16)
    want = softmax(trained_logits(run, recipe, BUNDLES[bundle], texts, pairs))
    np.testing.assert_allclose(served_probabilities(run / f"bundle-{bundle}", texts, pairs), want, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("bundle", "types"), [("teacher-onnx", [0] * 16), ("bilstm-fp32", [0] * 8 + [1] * 8)])
def test_the_model_benchmark_times_an_untyped_pair_bundle_on_the_segment_ids_it_is_served(untyped_run, bundle, types):
    run, _ = untyped_run
    loaded, files = read_bundle(run / f"bundle-{bundle}")
    assert models.bundle_feed(loaded, files.tokenizer, batch=1, length=16)["token_type_ids"].tolist() == [types]
