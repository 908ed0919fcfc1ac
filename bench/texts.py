"""The texts that the serving benchmark, the served-accuracy check and the load tests send: the recipe's dev split
(texts and their pairs, for a pair task), unless a file is given.

The dev split is read through `common.data` (torch-free: measuring a bundle needs no training code), as the
training and export stages read it: the recipe's `text_column`, `text_pair_column` and `label_column`, cut to
`dev_limit` as the export stage cut it.
"""

import argparse
import functools
import hashlib
import io
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from edgedistill.bench import BenchError
from edgedistill.common.arguments import readable_file
from edgedistill.common.config.training import DataConfig
from edgedistill.common.data import DataError, Examples, load_dev
from edgedistill.serve.textfiles import (
    UsageError,
    add_columns_arguments,
    check_columns,
    lines_of,
    read_lines,
    read_tsv,
)

TEXT_COUNT = 512


def dev_split(data: DataConfig) -> Examples:
    """The recipe's dev split (`load_dev`, as the training stages read it), its errors as `BenchError`."""
    try:
        return load_dev(data)
    except DataError as err:
        raise BenchError(str(err)) from None


@functools.cache
def _read_once(stream: TextIO) -> str:
    """The lines of `stream` (standard input), read as the client reads `-`, each ended by a line feed (the bytes of
    a file of LF-ended lines, which `hashed_path` hashes alike): read once per stream."""
    try:
        return "".join(f"{line}\n" for line in lines_of(Path("-"), stream))
    except UsageError as err:
        raise BenchError(str(err)) from err


def stdin_for(path: Path) -> TextIO:
    """What `path` reads as stdin: for `-`, a copy of standard input, which is read once, so that a stage can hash
    what it held (`hashed_path`) before its build reads it; else `sys.stdin`, unread."""
    return io.StringIO(_read_once(sys.stdin)) if str(path) == "-" else sys.stdin


def read_texts_file(path: Path) -> Examples:
    """Single texts, one per line, stripped (as the client's --file reads them: blank lines skipped, one that shows
    nothing refused)."""
    try:
        lines = read_lines(path, stdin=stdin_for(path))
    except UsageError as err:
        raise BenchError(str(err)) from err
    return Examples([line.strip() for line in lines], None, None, str(path))


@dataclass(frozen=True)
class PairsFile:
    """A file of text pairs and how its lines are read: the first two tab-separated fields, or the `columns` named in
    its first line, after a `header` line skipped, as `edgedistill call --tsv` reads them (`serve.textfiles.read_tsv`)."""

    path: Path
    header: bool = False
    columns: tuple[str, str] | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> "PairsFile | None":
        """The `--pairs`, `--header` and `--columns` of `add_texts_arguments`, checked as the client checks its own;
        None without `--pairs`."""
        try:
            check_columns(args.columns, args.header, args.pairs is not None, "--pairs")
        except UsageError as err:
            raise BenchError(str(err)) from None
        if args.pairs is None:
            return None
        return cls(args.pairs, args.header, None if args.columns is None else tuple(args.columns))

    def hashed(self) -> dict:
        """What a measurement's stage hashes: the file (by its contents, `hashed_path`) and how it is read."""
        columns = None if self.columns is None else list(self.columns)
        return {"path": hashed_path(self.path), "header": self.header, "columns": columns}


def hashed_path(path: Path) -> str:
    """A `--texts` or `--pairs` file as a measurement's stage hashes it: by its absolute path, which the stage hashes
    by the file's contents (`common.recipe.by_content`), the same wherever it is run from. `-` (stdin) by the digest
    of what it held, in the form `by_content` gives a file's."""
    if str(path) == "-":
        return f"sha256:{hashlib.sha256(_read_once(sys.stdin).encode()).hexdigest()}"
    return str(path.absolute())


def read_pairs_file(pairs: PairsFile) -> Examples:
    """The text pairs of `pairs`, read as the client's --tsv reads a file."""
    try:
        texts, pairs_read = read_tsv(pairs.path, pairs.header, stdin_for(pairs.path), pairs.columns, option="--pairs")
    except UsageError as err:
        raise BenchError(str(err)) from err
    return Examples(texts, pairs_read, None, str(pairs.path))


def add_texts_arguments(parser: argparse.ArgumentParser) -> None:
    """`--texts FILE` or `--pairs FILE` with `--header` and `--columns` (for `load_texts`, the pairs file by
    `PairsFile.of`), on every command that sends texts."""
    texts = parser.add_mutually_exclusive_group()
    texts.add_argument(
        "--texts", type=readable_file, help="single texts to send, one per line (default: the recipe's dev split)"
    )
    texts.add_argument(
        "--pairs",
        type=readable_file,
        help="text pairs for a pair model, text<TAB>pair per line or the --columns, read as `call --tsv` reads them "
        "(default: the recipe's dev split)",
    )
    add_columns_arguments(parser, "the --pairs file")


def load_texts(
    data: DataConfig,
    pairs: bool,
    texts_file: Path | None = None,
    pairs_file: PairsFile | None = None,
    count: int = TEXT_COUNT,
    seed: int = 0,
    takes_files: bool = False,
) -> Examples:
    """Up to `count` shuffled examples from `texts_file` (one text per line) or `pairs_file` (`read_pairs_file`),
    else from the recipe's dev split. `pairs`: whether the served model takes pairs; examples of the other kind are
    refused (`check_kind`; `takes_files`: the command has `--texts` and `--pairs`)."""
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
    check_kind(examples, pairs, takes_files)
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    return examples.take(order[:count])


def check_kind(examples: Examples, pairs: bool, takes_files: bool = False) -> None:
    """`BenchError` unless the examples are pairs exactly when the model takes pairs, naming the files to pass
    instead where the command takes them (`takes_files`: `add_texts_arguments`)."""
    if pairs and examples.pairs is None:
        file = ", or pass a pairs file (--pairs: text<TAB>pair on each line)" if takes_files else ""
        raise BenchError(
            f"the model takes text pairs, and {examples.source} holds single texts: use the recipe of its task "
            f"(data.text_pair_column set){file}"
        )
    if not pairs and examples.pairs is not None:
        file = ", or pass a texts file (--texts: one per line)" if takes_files else ""
        raise BenchError(
            f"the model takes single texts, and {examples.source} holds text pairs: use the recipe of its task "
            f"(data.text_pair_column unset){file}"
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
