"""A tiny DistilBERT masked-LM checkpoint folder, as `model.init` names one: a model whose config names its head's
dropout otherwise than `classifier_dropout`."""

from pathlib import Path

from edgedistill.distill.tokenization import train_tokenizer
from transformers import DistilBertConfig, DistilBertForMaskedLM

from tests.conftest import save_initialised


def write_distilbert(init: Path, texts: list[str]) -> Path:
    """The checkpoint (one layer of width 16, a WordPiece tokenizer trained on `texts`), saved into `init`."""
    tokenizer = train_tokenizer("bert", texts, 120)
    tokenizer.save_pretrained(init)
    config = DistilBertConfig(vocab_size=len(tokenizer), dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    save_initialised(DistilBertForMaskedLM, config, init)
    return init
