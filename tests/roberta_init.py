"""A tiny RoBERTa checkpoint built locally: byte-level BPE whose pairs carry no token type ids, one token type."""

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast

from tests.conftest import save_initialised

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def byte_level_bpe(texts: list[str]) -> Tokenizer:
    """A byte-level BPE of 400 tokens trained on `texts`, `SPECIALS` first (`<s>` 0, `<pad>` 1, `</s>` 2), with no
    template yet."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, initial_alphabet=alphabet, show_progress=False),
    )
    return tok


def write_roberta(folder: Path, texts: list[str], separated: bool = True) -> Path:
    """A tiny RoBERTa checkpoint in `folder` (hidden 16, one layer), its tokenizer trained on `texts`: a pair is
    `<s> A </s> </s> B </s>` as roberta-base's, or with `separated=False` `<s> A B </s>`, which marks no boundary."""
    tok = byte_level_bpe(texts)
    if separated:
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        tokenizer = RobertaTokenizerFast(tokenizer_object=tok, pad_token="<pad>", mask_token="<mask>")
    else:  # RobertaTokenizerFast would put its own template back
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", mask_token="<mask>"
        )
    tokenizer.save_pretrained(folder)
    config = RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        type_vocab_size=1,
    )  # fmt: skip
    save_initialised(RobertaForMaskedLM, config, folder)
    return folder
