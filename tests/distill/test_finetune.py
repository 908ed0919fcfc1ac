"""Fine-tuning's own steps: the teacher's start after continued pretraining, the top layers and pooler drawn
afresh, and the settings refused before training."""

import pytest
import torch
from edgedistill.common.recipe import load_recipe
from edgedistill.distill.finetune import reinit_top_layers, start_teacher
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertForMaskedLM, DebertaV2Config, DebertaV2ForSequenceClassification

from tests.conftest import ROOT, run_here
from tests.distill.bert_init import tiny_bert
from tests.distill.distilbert_init import write_distilbert

TEXTS = ["unbelievably wonderful storytelling everywhere", "remarkably unwatchable screenplays"] * 50


def test_reinit_layers_draws_afresh_the_pooler_deberta_holds_beside_its_encoder():
    config = DebertaV2Config(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        pooler_hidden_size=16,
    )  # fmt: skip
    model = DebertaV2ForSequenceClassification(config)
    torch.nn.init.constant_(model.pooler.dense.weight, 0.5)  # as pretrained: no fresh draw gives it
    reinit_top_layers(model, 1)
    assert not model.pooler.dense.weight.eq(0.5).any()


def test_classifier_dropout_for_an_init_without_the_field_is_refused_before_fine_tuning(tmp_path):
    init = write_distilbert(tmp_path / "distilbert", TEXTS)
    args = ["--pretrain=null", f"--model.init={init}", "--finetune.classifier_dropout=0.1"]
    result = run_here("distill", "finetune", ROOT / "recipes" / "smoke.yaml", *args)
    assert f"error: finetune.classifier_dropout=0.1, but {init} is a distilbert, whose config has" in result.stderr


def continued(tmp_path_factory, num_labels: int):
    """A tiny BERT `model.init` with a head of `num_labels` labels, and the teacher the smoke recipe (two labels)
    starts from the folder pretraining continued from it saves (its masked-LM model: no pooler, no head)."""
    folder = tmp_path_factory.mktemp("continued")
    init = tiny_bert(folder / "init", num_labels)
    BertForMaskedLM.from_pretrained(init).save_pretrained(folder / "pretrain")
    tokenizer = AutoTokenizer.from_pretrained(init)
    tokenizer.save_pretrained(folder / "pretrain")
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"model.init": str(init)})
    return load_file(init / "model.safetensors"), start_teacher(
        recipe, str(folder / "pretrain"), tokenizer.pad_token_id
    )


@pytest.fixture(scope="module")
def from_a_two_label_init(tmp_path_factory):
    return continued(tmp_path_factory, num_labels=2)


def test_after_continued_pretraining_the_teacher_starts_from_the_init_s_pooler(from_a_two_label_init):
    init, (teacher, _) = from_a_two_label_init
    assert torch.equal(teacher.bert.pooler.dense.weight, init["bert.pooler.dense.weight"])


def test_after_continued_pretraining_the_teacher_starts_from_the_init_s_head_of_as_many_labels(from_a_two_label_init):
    init, (teacher, _) = from_a_two_label_init
    assert torch.equal(teacher.classifier.weight, init["classifier.weight"])


def test_after_continued_pretraining_an_init_no_longer_readable_is_warned_of(tmp_path, capsys):
    init = tiny_bert(tmp_path / "init", 2)
    BertForMaskedLM.from_pretrained(init).save_pretrained(tmp_path / "pretrain")
    tokenizer = AutoTokenizer.from_pretrained(init)
    tokenizer.save_pretrained(tmp_path / "pretrain")
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"model.init": str(tmp_path / "moved")})
    start_teacher(recipe, str(tmp_path / "pretrain"), tokenizer.pad_token_id)
    assert f"[teacher] warning: model.init {tmp_path / 'moved'} cannot be read now" in capsys.readouterr().out


def test_after_continued_pretraining_an_init_head_for_other_labels_is_told_drawn_afresh(tmp_path_factory):
    _, (_, mismatched) = continued(tmp_path_factory, num_labels=3)
    assert sorted(key for key, *_ in mismatched) == ["classifier.bias", "classifier.weight"]
