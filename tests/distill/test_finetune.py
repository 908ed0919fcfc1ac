"""Fine-tuning's own steps: the top layers and pooler drawn afresh, and the settings refused before training."""

import torch
from edgedistill.distill.finetune import reinit_top_layers
from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

from tests.conftest import ROOT, run_here
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
