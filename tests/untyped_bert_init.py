"""A tiny BERT checkpoint built locally whose tokenizer gives token type ids but marks no sentence B with 1: a
generic fast tokenizer whose pair template is `[CLS] A [SEP] B [SEP]`, all type 0, beside a model with two token
types."""

from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

from tests.conftest import save_initialised

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_untyped_bert(folder: Path, texts: list[str]) -> Path:
    """A tiny BERT checkpoint in `folder` (hidden 16, one layer, `type_vocab_size` 2), its WordPiece tokenizer
    trained on `texts`, whose pairs give token type ids of 0 throughout."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )  # fmt: skip
    tokenizer.save_pretrained(folder)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        type_vocab_size=2, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    save_initialised(BertForMaskedLM, config, folder)
    return folder
