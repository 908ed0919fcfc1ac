"""A tiny BART checkpoint built locally: an encoder-decoder whose classifier reads the decoder's state at the last
`</s>`, with a byte-level BPE tokenizer as facebook/bart-base's (`<s> A </s>`, a pair `<s> A </s></s> B </s>`)."""

from pathlib import Path

from tokenizers import processors
from transformers import BartConfig, BartForConditionalGeneration, PreTrainedTokenizerFast, RobertaTokenizerFast

from tests.conftest import save_initialised
from tests.roberta_init import byte_level_bpe


def bart_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE of 400 tokens trained on `texts`, writing texts and pairs as BART's does."""
    tok = byte_level_bpe(texts)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return RobertaTokenizerFast(tokenizer_object=tok, pad_token="<pad>", mask_token="<mask>")


def write_bart(folder: Path, texts: list[str]) -> Path:
    """A tiny BART checkpoint in `folder` (d_model 16, one encoder and one decoder layer), its tokenizer trained on
    `texts`."""
    tokenizer = bart_tokenizer(texts)
    tokenizer.save_pretrained(folder)
    config = BartConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128,
    )  # fmt: skip
    save_initialised(BartForConditionalGeneration, config, folder)
    return folder
