"""Tokenizers: load a pretrained one, or train WordPiece (BERT) / byte-level BPE (GPT) from text."""

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from edgedistill.common import progress, segments
from edgedistill.common.recipe import RecipeError
from edgedistill.common.segments import PairSegments
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CONTINUATION = "##"  # WordPiece's prefix of a piece that continues a word
GPT_EOS, GPT_PAD = "<|endoftext|>", "<|pad|>"
ENCODE_CHUNK = 2_000  # texts per tokenizer call: its Python lists of ids, offsets and masks cost ~400 bytes a token
CUT_WARNING_SHARE = 0.05  # the share of examples cut at a length setting from which a stage warns of it
# The files a checkpoint folder's tokenizer is read from; without any, transformers builds an empty one from config.json
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "sentencepiece.model",
    "spm.model",
    "tokenizer.model",
)


def _bars() -> bool:
    """Whether tokenizers may draw its training bars: only where stages draw theirs (in a log it writes blank lines)."""
    return progress.mode() == "bar"


def _continuations(tok: Tokenizer, texts: Iterable[str]) -> list[str]:
    """`##c` for every character c that follows another inside a pre-tokenized word of `texts`, sorted."""
    inner = set()
    for text in texts:
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)):
            inner.update(word[1:])
    return [CONTINUATION + char for char in sorted(inner)]


def _wordpiece(texts: Sequence[str], vocab_size: int, max_length: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    # The trainer numbers the `##c` tokens in the order of a randomly seeded hash map, and breaks ties between
    # equally frequent merges by token id, so the same texts gave another vocabulary from run to run
    # (huggingface/tokenizers#1794). Given first, in sorted order, they get fixed ids; they are then made ordinary
    # vocabulary again, not special tokens.
    continuations = _continuations(tok, texts)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=BERT_SPECIALS + continuations, show_progress=_bars()
    )
    tok.train_from_iterator(texts, trainer)
    data = json.loads(tok.to_str())
    data["added_tokens"] = [token for token in data["added_tokens"] if token["content"] in BERT_SPECIALS]
    tok = Tokenizer.from_str(json.dumps(data))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],  # segment ids for sentence pairs
        model_max_length=max_length,
    )


def _byte_bpe(texts: Iterable[str], vocab_size: int, max_length: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()  # bytes of composed and decomposed accents would be other tokens
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[GPT_EOS, GPT_PAD],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=_bars(),
        ),
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=GPT_EOS,
        bos_token=GPT_EOS,
        unk_token=GPT_EOS,
        pad_token=GPT_PAD,
        model_max_length=max_length,
    )


def train_tokenizer(
    family: str, texts: Sequence[str], vocab_size: int, max_length: int = VERY_LARGE_INTEGER
) -> PreTrainedTokenizerFast:
    """A fresh tokenizer for `family` ("bert" or "gpt") trained on `texts`; the same texts give the same one.
    `truncation=True` cuts a text to `max_length` tokens (its model's positions; by default none are cut), which its
    saved `tokenizer_config.json` keeps for whoever loads it."""
    train = _wordpiece if family == "bert" else _byte_bpe
    return train(texts, vocab_size, max_length)


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """A pretrained tokenizer; GPT-style ones without a pad token pad with their EOS token, and one with neither is
    a `RecipeError`. It pads and truncates on
    the right, whatever the checkpoint says, as every stage and the server do: a GPT reads positions from 0 and its
    classifier the last real token, so a left-padded text would not give the logits it gives alone. A checkpoint
    that cannot be found or read is a `RecipeError` naming it, not a traceback, as is a local folder without any of
    `TOKENIZER_FILES` (one `save_pretrained` of the model alone wrote), whose every word would be read as unknown."""
    folder = Path(name_or_path)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise RecipeError(
            f"{name_or_path}: holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); model.init "
            "(EDGEDISTILL_TEACHER_INIT) must name a checkpoint folder its tokenizer was saved into too (the "
            "tokenizer's save_pretrained into the model's folder)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:  # not found, offline, not a repo id, no tokenizer files
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RecipeError(
            f"{name_or_path}: cannot load a tokenizer from it ({reason}); model.init (EDGEDISTILL_TEACHER_INIT) "
            "must name a local checkpoint folder, or a Hub model where the Hub can be reached"
        ) from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.pad_token is None:  # batches of texts of unequal lengths need one
        raise RecipeError(
            f"{name_or_path}: its tokenizer has no pad token and no EOS token to pad with; add a pad token to the "
            "checkpoint (its tokenizer's add_special_tokens, the model's resize_token_embeddings)"
        )
    tokenizer.padding_side = tokenizer.truncation_side = "right"
    return tokenizer


def mask_token(tokenizer: PreTrainedTokenizerBase, p_mask: float) -> str | None:
    """The token augmentation puts in place of a masked word: the tokenizer's mask token, else its unknown token.
    With `p_mask` > 0, one that is also the pad token (a GPT-2 checkpoint's `<|endoftext|>`, which `load_tokenizer`
    pads with) or none at all is a `RecipeError`: a masked word would be read as padding, skipped by a GPT's
    classifier at the end of a text and held at zero by the students' embeddings."""
    token = tokenizer.mask_token or tokenizer.unk_token
    if p_mask == 0:
        return token
    if token is None:
        raise RecipeError(
            f"{tokenizer.name_or_path}: its tokenizer has neither a mask token nor an unknown token to mask words "
            f"with; set transfer.p_mask to 0 (it is {p_mask}) to augment without masking"
        )
    if tokenizer.convert_tokens_to_ids(token) == tokenizer.pad_token_id:
        raise RecipeError(
            f"{tokenizer.name_or_path}: its tokenizer would mask words with {token}, which is also its pad token, so "
            f"a masked word would be read as padding; set transfer.p_mask to 0 (it is {p_mask}) to augment without "
            "masking"
        )
    return token


def pair_segments(tokenizer: PreTrainedTokenizerBase, name: str) -> PairSegments:
    """How the pair students find sentence B in this tokenizer's pairs (`common.segments`): by its token type ids
    where it marks B with 1 (BERT, ELECTRA, DeBERTa, ALBERT), else by the sequence ids of a fast tokenizer whose
    pair holds a special token between the texts (RoBERTa, XLM-RoBERTa, DistilBERT). A tokenizer that gives
    neither (a slow tokenizer, a pair with no separator such as GPT-2's) is a `RecipeError`."""
    probe = tokenizer("a", "b")
    if 1 in probe.get("token_type_ids", []):
        return "token_types"
    if tokenizer.is_fast and segments.separated(probe.sequence_ids(0)):
        return "sequence_ids"
    if tokenizer.is_fast:
        why = "no token type 1, and no special token between the two texts"
    else:
        why = "no token type 1, and a slow tokenizer gives no sequence ids"
    raise RecipeError(
        f"{name}: its tokenizer does not mark sentence B of a pair ({why}), which the pair students split pairs by; "
        "use a checkpoint with a fast tokenizer that does in model.init for a pair task (BERT, ELECTRA, DeBERTa, "
        "ALBERT mark it with token types; RoBERTa, XLM-RoBERTa, DistilBERT with a separator)"
    )


class TokenRows(Sequence):
    """Rows of token ids in one flat int32 array cut at `offsets` (N + 1 of them): 4 bytes a token, where a list of
    Python ints holds ~36. A row reads as a list."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self.values, self.offsets = values, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> list[int]:
        index = range(len(self))[index]  # negative indices count from the end; out of range raises IndexError
        return self.values[self.offsets[index] : self.offsets[index + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        return (self[index] for index in range(len(self)))

    def lengths(self) -> np.ndarray:
        """Tokens per row, (N,)."""
        return np.diff(self.offsets)


def encode(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    max_length: int,
    student_segments: bool = False,
    desc: str | None = None,
) -> dict[str, TokenRows]:
    """Token ids (and token type ids where the model uses them) per example, unpadded, truncated; tokenized
    `ENCODE_CHUNK` texts at a time into `TokenRows`, so memory grows by 4 bytes a token. With `desc`, a progress bar
    of that name counts the texts tokenized (a whole transfer set takes minutes).

    With `student_segments`, the `token_type_ids` of pairs are the segment ids the pair students read
    (`pair_segments`): the tokenizer's own where it marks sentence B with them, else made from its sequence ids.
    Without, they are what the teacher takes: the tokenizer's own, or none where it gives none."""
    derive = (
        student_segments and pairs is not None and pair_segments(tokenizer, tokenizer.name_or_path) == "sequence_ids"
    )
    values: dict[str, list[np.ndarray]] = {}
    lengths = [np.zeros(1, dtype=np.int64)]
    bar = progress.bar(len(texts), desc=desc or "", unit="text", enabled=desc is not None)
    for start in range(0, len(texts), ENCODE_CHUNK):
        end = start + ENCODE_CHUNK
        enc = tokenizer(
            list(texts[start:end]),
            list(pairs[start:end]) if pairs is not None else None,
            truncation=True,
            max_length=max_length,
            padding=False,
        )
        if derive:
            types = (segments.from_sequence_ids(enc.sequence_ids(row)) for row in range(len(enc["input_ids"])))
            enc["token_type_ids"] = list(types)
        for key in ("input_ids", "token_type_ids"):
            if key in enc:
                values.setdefault(key, []).append(np.fromiter((i for row in enc[key] for i in row), dtype=np.int32))
        lengths.append(np.fromiter((len(row) for row in enc["input_ids"]), dtype=np.int64))
        bar.update(len(enc["input_ids"]))
    bar.close()
    offsets = np.cumsum(np.concatenate(lengths))
    if not values:  # no texts: the keys the tokenizer gives
        keys = [key for key in ("input_ids", "token_type_ids") if key in tokenizer("") or derive]
        values = {key: [np.zeros(0, dtype=np.int32)] for key in keys}
    return {key: TokenRows(np.concatenate(chunks), offsets) for key, chunks in values.items()}


def cut_share(rows: TokenRows, max_length: int) -> float:
    """The share of rows (0..1) that reach `max_length` tokens: those `encode` cut there, and any exactly that long."""
    return float((rows.lengths() >= max_length).mean()) if len(rows) else 0.0


def cut_warning(rows: TokenRows, setting: str, max_length: int, pairs: bool, examples: str) -> str | None:
    """What a stage warns of `examples` (their name: "train") that `encode` cut at `max_length` tokens (a pair's two
    texts together), the value of `setting`; None when fewer than `CUT_WARNING_SHARE` of them reach it."""
    share = cut_share(rows, max_length)
    if share < CUT_WARNING_SHARE:
        return None
    what = "pairs reach it with both texts" if pairs else "examples reach it"
    return f"{share:.0%} of the {examples} {what} ({setting}={max_length} tokens) and are cut there"
