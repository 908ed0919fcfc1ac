"""A tiny BERT classifier checkpoint folder, as `model.init` names one: a WordPiece tokenizer trained on the smoke
recipe's text and one layer of width 16."""

from pathlib import Path

from edgedistill.common.data import load_unlabelled
from edgedistill.common.recipe import load_recipe
from edgedistill.distill.tokenization import train_tokenizer
from transformers import BertConfig, BertForSequenceClassification

from tests.conftest import ROOT, save_initialised


def tiny_bert(init: Path, num_labels: int) -> Path:
    """The checkpoint with a head of `num_labels` labels, saved into `init`."""
    texts = load_unlabelled(load_recipe(ROOT / "recipes" / "smoke.yaml").transfer.unlabelled_files, 300)
    tokenizer = train_tokenizer("bert", texts, 400)
    tokenizer.save_pretrained(init)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_labels=num_labels, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    save_initialised(BertForSequenceClassification, config, init)
    return init
