"""The transfer set's texts, before labelling.

Examples come from unlabelled text (split into sentences; adjacent sentences for pair tasks), the labelled train
inputs, and Tang et al. augmentations of those inputs, all written in the recipe's `transfer.text_style`. They are
deduplicated and any that overlaps a held-out (dev or test) text is dropped; a train input that overlaps one is dropped
before it is augmented.
"""

import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from edgedistill.common import progress
from edgedistill.common.data import Examples, line_count, load_splits, load_test, unlabelled_lines, unreadable_files
from edgedistill.common.recipe import Recipe, RecipeError
from edgedistill.common.text import read_texts, write_texts
from edgedistill.common.textstyle import Style, as_served, styled
from edgedistill.distill.augment import (
    MIN_WORDS,
    augment_examples,
    normalise,
    split_sentences,
    split_words,
    vocab_replacer,
)

SOURCES = ("unlabelled", "train", "augmented")
LEAK_NGRAM = 8
MIN_CONTAINED = 5
OVERLAP_WARNING = 0.25  # the share of train examples overlapping a held-out text that says the splits are not apart


def held_out_texts(dev: Examples, test: Examples | None) -> list[str]:
    """Every text of the dev and (where the recipe has one) test splits, both sides of a pair: what no text the
    students train on may overlap."""
    return [text for split in (dev, test) if split is not None for text in split.texts + (split.pairs or [])]


def leak_filter(held_out: list[str], style: Style):
    """A predicate: True for text equal to a held-out sentence, containing a whole held-out sentence of 5 to 7
    words, or sharing 8 words in a row with a longer one (compared on `normalise`d `split_words`, each Chinese or
    Japanese character a word). A held-out sentence is compared as written and as `styled` in `style`, as the transfer
    texts are: without its tags and entities; and so is a `raw` text, as its train texts are written as served."""
    # a held-out text without words (`:-(`) is no key: every text without words would match it
    keys = {normalise(text) for held in held_out for text in (held, styled(held, style))} - {""}
    grams = set()
    for key in keys:
        words = tuple(split_words(key))
        if MIN_CONTAINED <= len(words) < LEAK_NGRAM:
            grams.add(words)
        grams.update(words[i : i + LEAK_NGRAM] for i in range(len(words) - LEAK_NGRAM + 1))
    starts = {gram[:MIN_CONTAINED] for gram in grams}  # a gram can start only where its first 5 words do

    def leaks(text: str) -> bool:
        return overlaps(text) or (style == "raw" and overlaps(styled(text, style)))

    def overlaps(text: str) -> bool:
        key = normalise(text)
        if key in keys:
            return True
        words = tuple(split_words(key))
        return any(
            words[i : i + MIN_CONTAINED] in starts
            and any(words[i : i + n] in grams for n in range(MIN_CONTAINED, LEAK_NGRAM + 1))
            for i in range(len(words) - MIN_CONTAINED + 1)
        )

    return leaks


@dataclass(frozen=True)
class TransferTexts:
    """The transfer set's inputs, before labelling: texts, their pairs (pair tasks), where each came from, gold
    labels (train examples) or -1, and the composition counts."""

    texts: list[str]
    pairs: list[str] | None
    sources: np.ndarray
    labels: np.ndarray
    composition: dict

    def write(self, folder: Path) -> None:
        """`texts.txt`, for pair tasks `pairs.txt`, `meta.npz` (`source`, `label`) and `composition.json` in
        `folder`."""
        write_texts(folder / "texts.txt", self.texts)
        if self.pairs is not None:
            write_texts(folder / "pairs.txt", self.pairs)
        np.savez(folder / "meta.npz", source=self.sources, label=self.labels)
        (folder / "composition.json").write_text(json.dumps(self.composition, indent=1))

    @classmethod
    def read(cls, folder: Path) -> "TransferTexts":
        """The texts `write` wrote into `folder`, as they were."""
        with np.load(folder / "meta.npz") as meta:
            sources, labels = meta["source"], meta["label"]
        pairs = folder / "pairs.txt"
        return cls(
            read_texts(folder / "texts.txt"),
            read_texts(pairs) if pairs.is_file() else None,
            sources,
            labels,
            json.loads((folder / "composition.json").read_text()),
        )


def adjacent(sentences: list[str]) -> list[tuple[str, str]]:
    """Unlabelled pairs: each sentence of a text with the next one (the cascade's calibration pairs them alike)."""
    return list(zip(sentences, sentences[1:], strict=False))


def _unlabelled(cfg, pairs: bool) -> list[tuple[str, ...]]:
    """Unlabelled examples of `cfg.unlabelled_files` (read line by line, never held whole): sentences, or adjacent
    sentence pairs for a pair task. Every local file is checked first (`unreadable_files`), as the teacher stage's
    warning promises: one past `unlabelled_max_lines` is never read, and would otherwise go unnoticed."""
    if unreadable := unreadable_files(cfg.unlabelled_files):
        raise unreadable[0]
    total = cfg.unlabelled_max_lines or line_count(cfg.unlabelled_files)  # a bar with an ETA on a large dump
    bar = progress.bar(total, desc="split", unit="line")
    examples = []
    for line in unlabelled_lines(cfg.unlabelled_files, cfg.unlabelled_max_lines):
        sentences = split_sentences(line, cfg.text_style)
        examples.extend(adjacent(sentences) if pairs else ((sentence,) for sentence in sentences))
        bar.update()
    bar.close()
    return examples


def _digest(key: tuple[str, ...]) -> bytes:
    """16 bytes that stand for a normalised example in the set of those seen, instead of a copy of its text."""
    return hashlib.blake2b("\0".join(key).encode(), digest_size=16).digest()


def build_texts(recipe: Recipe, mask_token: str | None) -> TransferTexts:
    """The transfer set's inputs, deterministic for the recipe's seed, every text in `transfer.text_style`; masked
    words become `mask_token` (`tokenization.mask_token`: None only where `transfer.p_mask` is 0); `RecipeError`
    where no text is left.

    Pair tasks get pairs from every source: the train pairs, augmented pairs (each side augmented on its own)
    and, from unlabelled text, adjacent sentences of the same line. Duplicates are found on both sides, and a
    pair is dropped when either side overlaps a dev or test text; a train pair that does is dropped before augmenting,
    as its augmented copies (a word or two masked or replaced) would mostly pass the check.
    """
    cfg = recipe.transfer
    rng = random.Random(cfg.seed)
    train, dev = load_splits(recipe.data)
    leaks = leak_filter(held_out_texts(dev, load_test(recipe.data)), cfg.text_style)
    columns = [train.texts] + ([train.pairs] if train.pairs is not None else [])
    # as the dev split is scored and the server reads them (`raw`: the words as written, `< .SPX >` tickers kept), on
    # one line each (a cell may hold a line break, which one text per line cannot)
    served = ([" ".join(text.split()) for text in as_served(column, cfg.text_style)] for column in columns)
    styled_train = zip(*served, strict=True)
    train_examples, train_labels, overlapping = [], [], 0
    for example, label in zip(styled_train, train.labels, strict=True):
        if any(leaks(side) for side in example):
            overlapping += 1
            continue
        train_examples.append(example)
        train_labels.append(label)
    if overlapping and overlapping >= OVERLAP_WARNING * len(train.texts):
        print(
            f"[transfer] warning: {overlapping} of {len(train.texts)} train examples share a sentence or "
            f"{LEAK_NGRAM} words in a row with a dev or test text, and are left out of the transfer set with their "
            "augmentations: are dev and test split apart from train? (the teacher and the label-only baselines "
            "train on every train example)"
        )
    unlabelled = _unlabelled(cfg, train.pairs is not None)
    if not unlabelled:
        need = "two sentences in a row" if train.pairs is not None else "a sentence"
        print(
            f"[transfer] warning: no line of transfer.unlabelled_files holds {need} of {MIN_WORDS} words or more "
            "(shorter ones are dropped): the transfer set has no unlabelled text"
        )
    rng.shuffle(unlabelled)
    # Unigram sampling over the train words stands in for Tang et al.'s same-POS unigram sampling.
    words = (w for example in train_examples for side in example for w in side.split())
    bar = progress.bar(len(train_examples), desc="augment", unit="example")
    augmented = augment_examples(
        train_examples,
        cfg.n_iter,
        rng,
        p_mask=cfg.p_mask,
        p_replace=cfg.p_replace,
        p_ngram=cfg.p_ngram,
        mask_token=mask_token,
        replace=vocab_replacer(words) if train_examples else None,  # none left to augment (all overlap dev or test)
        bar=bar,
    )
    bar.close()
    rng.shuffle(augmented)
    kept_train = [(t, 1, y) for t, y in zip(train_examples, train_labels, strict=True)] if cfg.include_train else []
    augmented = augmented[: cfg.max_augmented]
    # every unlabelled example is a candidate until max_unlabelled are kept: duplicates, held-out overlaps and texts
    # without words, dropped below, may be most of a repetitive dump
    candidates = itertools.chain(kept_train, ((t, 0, -1) for t in unlabelled), ((t, 2, -1) for t in augmented))
    seen, inputs, sources, labels = set(), [], [], []
    counts = dict.fromkeys(SOURCES, 0)
    removed = {"no_words": 0, "duplicates": 0, "held_out_overlap": overlapping}
    bar = progress.bar(len(kept_train) + len(unlabelled) + len(augmented), desc="filter", unit="text")
    for sides, source, label in candidates:
        bar.update()
        if source == 0 and cfg.max_unlabelled and counts["unlabelled"] >= cfg.max_unlabelled:
            continue
        key = tuple(normalise(side) for side in sides)
        if not all(key):  # no letter or digit on a side (an emoji, `:-(`): nothing to compare it on
            removed["no_words"] += 1
            continue
        if (digest := _digest(key)) in seen:
            removed["duplicates"] += 1
            continue
        if any(leaks(side) for side in sides):
            removed["held_out_overlap"] += 1
            continue
        seen.add(digest)
        counts[SOURCES[source]] += 1
        inputs.append(sides)
        sources.append(source)
        labels.append(label)
    bar.close()
    composition = {**counts, **{f"removed_{k}": v for k, v in removed.items()}, "total": len(inputs)}
    if not inputs:
        raise RecipeError(
            f"the transfer set is empty ({composition}): give it unlabelled text (transfer.unlabelled_files), the "
            "train inputs (transfer.include_train: true) or their augmentations (transfer.n_iter above 0)"
        )
    return TransferTexts(
        [sides[0] for sides in inputs],
        [sides[1] for sides in inputs] if train.pairs is not None else None,
        np.array(sources, dtype=np.int8),
        np.array(labels, dtype=np.int64),
        composition,
    )
