"""Text -> model rows: each text written in the bundle's `text_style`, then tokenized with its `tokenizer.json` (the
`tokenizers` library, no transformers)."""

from pathlib import Path

import numpy as np
from edgedistill.common import segments
from edgedistill.common.bundle import TOKEN_INPUTS, Bundle, pad_value
from edgedistill.common.segments import PairSegments
from edgedistill.common.textstyle import Style, as_served
from edgedistill.serve.errors import BundleRejected, UnreadableText
from tokenizers import Tokenizer

_NUMPY_DTYPES = {"int64": np.int64, "int32": np.int32}


class TextEncoder:
    """Tokenizes texts (or text pairs) into one row per text: `{input name: 1-D int array}`, unpadded."""

    def __init__(
        self,
        path: Path,
        max_length: int,
        inputs: dict[str, str],
        pad_id: int,
        tokenizer_json: str | None = None,
        text_style: Style = "raw",
        pair_segments: PairSegments = "token_types",
    ):
        """`inputs` maps each model input name to its dtype, `pad_id` pads `input_ids`, `text_style` says how each
        text is written before tokenizing, `pair_segments` how a pair's `token_type_ids` are made (all from the bundle
        spec). With `tokenizer_json` (the text of `path`, already read and verified) the file is not read again;
        `path` names it in messages."""
        unknown = set(inputs) - set(TOKEN_INPUTS)
        if unknown or "input_ids" not in inputs:
            raise BundleRejected(
                f"the model's inputs {sorted(inputs)} are not text inputs: expected input_ids and optionally "
                f"{', '.join(TOKEN_INPUTS[1:])}"
            )
        try:
            if tokenizer_json is None:
                self.tokenizer = Tokenizer.from_file(str(path))
            else:
                self.tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as err:
            raise BundleRejected(f"{path} is not a tokenizers tokenizer.json: {err}") from err
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length)
        self.max_length = max_length
        self.dtypes = {name: _NUMPY_DTYPES.get(dtype, np.int64) for name, dtype in inputs.items()}
        self.pad_id = pad_id
        self.text_style = text_style
        self.pair_segments = pair_segments
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        if not 0 <= pad_id < self.vocab_size:
            raise BundleRejected(f"pad_token_id {pad_id} is outside the tokenizer's {self.vocab_size} ids")

    @classmethod
    def for_bundle(
        cls, bundle: Bundle, tokenizer_json: str | None = None, max_length: int | None = None
    ) -> "TextEncoder":
        """The encoder a bundle's spec describes; `tokenizer_json` as read and verified by `read_bundle`; `max_length`
        cuts texts shorter than the spec's (the model benchmark's lengths)."""
        spec = bundle.spec
        inputs = {t.name: t.dtype for t in spec.inputs}
        return cls(
            bundle.tokenizer_path,
            spec.max_length if max_length is None else max_length,
            inputs,
            spec.pad_token_id,
            tokenizer_json,
            spec.text_style,
            spec.pair_segments,
        )

    @property
    def _markup_note(self) -> str:
        return ", or HTML markup, which the text style removes" if self.text_style == "ptb_lower" else ""

    @property
    def pad_values(self) -> dict[str, int]:
        return {name: pad_value(name, self.pad_id) for name in TOKEN_INPUTS}

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> list[dict[str, np.ndarray]]:
        """One row per text (and pair), written in the text style first; a text or pair that gives no token but the
        special ones is `UnreadableText`."""
        texts, pairs = as_served(texts, self.text_style), as_served(pairs, self.text_style)
        batch = texts if pairs is None else list(zip(texts, pairs, strict=True))
        rows = []
        for i, enc in enumerate(self.tokenizer.encode_batch_fast(batch)):  # _fast: no character offsets
            for side, kind in enumerate(("text", "text pair")[: 1 if pairs is None else 2]):
                if side not in enc.sequence_ids:  # e.g. only the control or zero-width characters BERT drops
                    raise UnreadableText(i, kind, self._markup_note)
            types = enc.type_ids
            if pairs is not None and self.pair_segments == "sequence_ids":
                types = segments.from_sequence_ids(enc.sequence_ids)
            fields = {"input_ids": enc.ids, "attention_mask": enc.attention_mask, "token_type_ids": types}
            rows.append({name: np.asarray(fields[name], dtype=dtype) for name, dtype in self.dtypes.items()})
        return rows
