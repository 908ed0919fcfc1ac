"""Which tokens of a tokenized sentence pair are sentence B: the segment ids the pair students read, made by the same
rule in training (`distill.tokenization.encode`) and in the server (`serve.encoding`). Torch- and transformers-free.

A tokenizer marks sentence B in one of two ways the pair students can read, and a bundle records which
(`BundleSpec.pair_segments`):

- `token_types`: its token type ids, 1 on `B [SEP]` (BERT, ELECTRA, DeBERTa, ALBERT);
- `sequence_ids`: no type 1 (RoBERTa, XLM-RoBERTa, DistilBERT give none), so the segment ids come from the
  sequence each token came from, which a fast tokenizer knows whatever its template (`from_sequence_ids`).
"""

from collections.abc import Sequence
from typing import Literal

PairSegments = Literal["token_types", "sequence_ids"]


def from_sequence_ids(sequence_ids: Sequence[int | None]) -> list[int]:
    """Segment ids of one pair's tokens from their sequence ids (0: text A, 1: text B, None: a special token): 0 up
    to B's first token, 1 from it to the end, so RoBERTa's `<s> A </s> </s> B </s>` splits where BERT's
    `[CLS] A [SEP] B [SEP]` does, before B. All 0 where no token is B's."""
    start = next((i for i, sequence in enumerate(sequence_ids) if sequence == 1), len(sequence_ids))
    return [0] * start + [1] * (len(sequence_ids) - start)


def separated(sequence_ids: Sequence[int | None]) -> bool:
    """Whether a pair's tokens hold both texts, A before B, with a special token between them: a pair a student
    can split by `from_sequence_ids` and whose model saw where A ends (GPT-2's pair, A's tokens then B's, has no
    separator)."""
    if 0 not in sequence_ids or 1 not in sequence_ids:
        return False
    last_a = len(sequence_ids) - 1 - list(reversed(sequence_ids)).index(0)
    first_b = list(sequence_ids).index(1)
    return last_a < first_b and None in sequence_ids[last_a + 1 : first_b]
