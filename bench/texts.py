"""The texts that the serving benchmark, the served-accuracy check and the load tests send: the recipe's dev split
(texts and their pairs, for a pair task), unless a file is given.

The dev split is read through `common.data` (torch-free: measuring a bundle needs no training code), as the
training and export stages read it: the recipe's `text_column`, `text_pair_column` and `label_column`, cut to
`dev_limit` as the export stage cut it.
"""

import argparse
import random
import statistics
import sys
from pathlib import Path

from edgedistill.bench import BenchError
from edgedistill.common.config.training import DataConfig
from edgedistill.common.data import DataError, Examples, load_labelled
from edgedistill.serve.client import UsageError, read_lines, read_tsv

TEXT_COUNT = 512


def dev_split(data: DataConfig) -> Examples:
    """The recipe's dev split, in file order, cut to `dev_limit`: texts, pairs for a pair task, label ids (read as
    the training stages read it)."""
    try:
        return load_labelled(data.dev, data, data.dev_limit)
    except DataError as err:
        raise BenchError(str(err)) from None


def read_texts_file(path: Path) -> Examples:
    """Single texts, one per line, stripped (as the client's --file reads them: blank lines skipped, one that shows
    nothing refused)."""
    try:
        lines = read_lines(path, stdin=sys.stdin)
    except UsageError as err:
        raise BenchError(str(err)) from err
    return Examples([line.strip() for line in lines], None, None, str(path))


def read_pairs_file(path: Path) -> Examples:
    """Text pairs, text<TAB>pair on each line (as the client's --tsv, without a header)."""
    try:
        texts, pairs = read_tsv(path, header=False, stdin=sys.stdin)
    except UsageError as err:
        raise BenchError(str(err)) from err
    return Examples(texts, pairs, None, str(path))


def add_texts_arguments(parser: argparse.ArgumentParser) -> None:
    """`--texts FILE` or `--pairs FILE` (for `load_texts`), on every command that sends texts."""
    texts = parser.add_mutually_exclusive_group()
    texts.add_argument(
        "--texts", type=Path, help="single texts to send, one per line (default: the recipe's dev split)"
    )
    texts.add_argument(
        "--pairs",
        type=Path,
        help="text pairs for a pair model, text<TAB>pair per line (default: the recipe's dev split)",
    )


def load_texts(
    data: DataConfig,
    pairs: bool,
    texts_file: Path | None = None,
    pairs_file: Path | None = None,
    count: int = TEXT_COUNT,
    seed: int = 0,
) -> Examples:
    """Up to `count` shuffled examples from `texts_file` (one text per line) or `pairs_file` (text<TAB>pair), else
    from the recipe's dev split. `pairs`: whether the served model takes pairs; examples of the other kind are
    refused."""
    if texts_file is not None and pairs_file is not None:
        raise BenchError("give a texts file or a pairs file, not both")
    if texts_file is not None:
        examples = read_texts_file(texts_file)
    elif pairs_file is not None:
        examples = read_pairs_file(pairs_file)
    else:
        examples = dev_split(data)
    if not examples.texts:
        raise BenchError(f"{examples.source} holds no texts")
    check_kind(examples, pairs)
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return examples.take(order[:count])


def check_kind(examples: Examples, pairs: bool) -> None:
    """`BenchError` unless the examples are pairs exactly when the model takes pairs."""
    if pairs and examples.pairs is None:
        raise BenchError(
            f"the model takes text pairs, and {examples.source} holds single texts: pass a pairs file "
            "(text<TAB>pair on each line), or use the recipe of its task (data.text_pair_column set)"
        )
    if not pairs and examples.pairs is not None:
        raise BenchError(
            f"the model takes single texts, and {examples.source} holds text pairs: pass a texts file (one per line)"
        )


def batches_of(values: list, size: int) -> list[list]:
    """Consecutive groups of `size` values, wrapping around so that there is at least one full group."""
    return [[values[(k * size + j) % len(values)] for j in range(size)] for k in range(max(1, len(values) // size))]


def load_groups(examples: Examples, size: int) -> list[Examples]:
    """Groups of exactly `size` examples to send as load (`batches_of`: at least one, wrapping round)."""
    return [examples.take(indices) for indices in batches_of(list(range(len(examples))), size)]


def texts_info(examples: Examples) -> dict:
    """Where the texts came from, how many, whether pairs, and their lengths in characters (a pair's both texts)."""
    lengths = examples.lengths()
    return {
        "source": examples.source,
        "count": len(examples),
        "pairs": examples.pairs is not None,
        "chars": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
    }
