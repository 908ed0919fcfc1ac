"""Texts (and text pairs) to classify, from arguments, files and stdin, as `edgedistill call` and the benchmarks read
them: UTF-8, one text per line or `text<TAB>pair` per line (or named columns), each refused with its file and line
where the server would refuse it."""

import argparse
import io
import sys
from pathlib import Path
from typing import BinaryIO, TextIO

from edgedistill.common.text import NotUtf8, shows_nothing, stray_delimiter, utf8_lines

# Where each text and each pair is in the input, by the server's name for its kind: "text" and "text pair"
Origins = dict[str, list[str]]


class UsageError(ValueError):
    """Arguments or input files the CLI cannot use; the message says why."""


def lines_of(path: Path, stdin: TextIO, layout: str = "one text per line") -> list[str]:
    """The lines of `path` ('-': stdin), as `_read` reads them."""
    return [line for _, line in _read(path, stdin, layout)]


def _read(path: Path, stdin: TextIO, layout: str = "one text per line") -> list[tuple[int, str]]:
    """(number, line) of `path` ('-': stdin's bytes, whatever the locale's encoding), line ends dropped, read as the
    data loader reads a file (`common.text.utf8_lines`: UTF-8, a leading byte-order mark dropped, a line ended by LF,
    CR LF or CR alone and numbered by the LFs before it, plus one); `UsageError` saying why it cannot be read."""
    if str(path) != "-":
        try:
            with path.open("rb") as handle:
                return _utf8_lines(handle, str(path))
        except OSError as err:
            raise UsageError(f"cannot read {path}: {err}") from err
    if stdin is None:  # started with stdin closed (`<&-`)
        raise UsageError("stdin is closed: give the texts as arguments, --file or --tsv")
    if stdin.isatty():  # else a call without texts would seem to hang
        print(f"reading from the terminal, {layout}; end with Ctrl-D", file=sys.stderr, flush=True)
    if hasattr(stdin, "buffer"):
        return _utf8_lines(stdin.buffer, "stdin")
    # a text stream over no bytes (io.StringIO): a lone surrogate, as a C locale's text stdin reads a byte that is
    # not UTF-8, is encoded as bytes that are not UTF-8 either, and refused as they are
    return _utf8_lines(io.BytesIO(stdin.read().encode("utf-8", "surrogatepass")), "stdin")


def _utf8_lines(handle: BinaryIO, source: str) -> list[tuple[int, str]]:
    """(number, line) of `handle`, read from `source` by `utf8_lines`, line ends dropped."""
    try:
        return [(number, line.rstrip("\r\n")) for number, line in utf8_lines(handle)]
    except NotUtf8 as err:
        raise err.as_error(source, UsageError, "give it gunzipped (zcat)") from None


def _comma_separated(line: str, option: str) -> str:
    """For the error about a line `option` (`--tsv`) cannot split: what it says where the line looks like CSV (a
    recipe's data may be CSV, and `--columns` takes its column names)."""
    if "\t" in line or "," not in line:
        return ""
    return f" (separated by commas: a CSV file? {option} reads tab-separated fields only: save the file as TSV)"


def add_columns_arguments(parser: argparse.ArgumentParser, files: str) -> None:
    """`--header` and `--columns TEXT PAIR`: how `read_tsv` reads `files` ("each --tsv file"), for every command that
    takes text pairs from such files (`check_columns` checks them)."""
    parser.add_argument(
        "--header", action="store_true", help=f"skip the header of {files}: its first line that is not blank"
    )
    parser.add_argument(
        "--columns",
        nargs=2,
        metavar=("TEXT", "PAIR"),
        help=f"the text and pair columns of {files}, named as in its header (a recipe's data.text_column and "
        "data.text_pair_column); default: the first two fields, whatever the header says",
    )


def check_columns(columns: list[str] | None, header: bool, files_given: bool, option: str) -> None:
    """`UsageError` for `--columns` or `--header` without a file of `option` to read them in (either would do
    nothing), or `--columns` naming one column twice."""
    if columns and not files_given:
        raise UsageError(f"--columns names the columns of {option} files: give one")
    if header and not files_given:
        raise UsageError(f"--header skips the first line of {option} files: give one, or drop --header")
    if columns and columns[0] == columns[1]:
        raise UsageError(f"--columns names {columns[0]!r} twice: name the text's column, then the pair's")


def read_tsv(
    path: Path, header: bool, stdin: TextIO, columns: tuple[str, str] | None = None, option: str = "--tsv"
) -> tuple[list[str], list[str]]:
    """Texts and their pairs, as `numbered_pairs` reads them."""
    rows = numbered_pairs(path, header, stdin, columns, option)
    return [text for _, text, _ in rows], [pair for _, _, pair in rows]


def numbered_pairs(
    path: Path, header: bool, stdin: TextIO, columns: tuple[str, str] | None = None, option: str = "--tsv"
) -> list[tuple[int, str, str]]:
    """(line number, text, pair): the first two tab-separated fields of each line, or with `columns` the fields under
    those two names of the header; no quoting, other fields such as a label ignored, neither text may be empty;
    blank lines skipped, and with `header` or `columns` the first other line, the header, as the data loader reads
    it (a line of more fields than the header's is refused). Errors name the file's `option`."""
    rows = []
    where = (0, 1)
    wants = "text<TAB>pair on each line"
    layout = "text<TAB>pair on each line" if columns is None else "the header line, then tab-separated fields"
    lines = _read(path, stdin, layout)
    header_due = header or columns is not None
    width = None  # the header's number of fields: a line with more was split by a stray tab
    for index, (number, line) in enumerate(lines):
        if not line.strip():
            continue
        if header_due:
            header_due = False
            width = line.count("\t") + 1
            if columns:
                names = [name.strip() for name in line.split("\t")]
                if missing := [name for name in columns if name not in names]:
                    raise UsageError(
                        f"{path}:{number} (the header): no column {missing}; found {names}"
                        f"{_comma_separated(line, option)}"
                    )
                where = (names.index(columns[0]), names.index(columns[1]))
                wants = f"the columns {list(columns)} on each line"
            continue
        fields = line.split("\t")
        if width is not None and len(fields) > width:  # every field after the stray tab would be shifted
            raise UsageError(
                f"{path}:{number}: {len(fields) - width} field(s) more than the header's {width}; "
                f"{stray_delimiter(fields[width:], tsv=True)} splits it: remove it"
            )
        if len(fields) <= max(where):
            short = "no tab" if len(fields) < 2 else f"{len(fields)} fields"
            # after a line holding a tab (a header too, skipped or split into the columns), the file is TSV and a
            # comma the text's own
            tabbed = any("\t" in before for _, before in lines[:index])
            csv = "" if tabbed else _comma_separated(line, option)
            raise UsageError(f"{path}:{number}: {short}; {option} wants {wants}{csv}")
        text, pair = fields[where[0]], fields[where[1]]
        if shows_nothing(text) or shows_nothing(pair):  # the server would name its place in a call
            raise UsageError(
                f"{path}:{number}: an empty text or pair (or one of control, zero-width or replacement characters "
                f"only); {option} wants {wants}"
            )
        rows.append((number, text, pair))
    return rows


def read_lines(path: Path, stdin: TextIO) -> list[str]:
    """The lines of `path` ('-': stdin) that are not blank, as `numbered_lines` reads them."""
    return [line for _, line in numbered_lines(path, stdin)]


def numbered_lines(path: Path, stdin: TextIO) -> list[tuple[int, str]]:
    """(line number, line) of the lines of `path` ('-': stdin) that are not blank. One that shows nothing
    (`shows_nothing`) is refused, naming its line: the server would refuse it too (the model reads it as nothing),
    naming its place in one call."""
    texts = []
    for number, line in _read(path, stdin):
        if line.strip():
            if shows_nothing(line):
                raise UsageError(
                    f"{path}:{number}: only control, zero-width or replacement (U+FFFD) characters, which the model "
                    "reads as nothing; remove them or the line"
                )
            texts.append((number, line))
    return texts


def read_texts(args: argparse.Namespace, stdin: TextIO) -> tuple[list[str], list[str] | None, Origins]:
    """Texts, their pairs (None: single texts) and where each is (`Origins`: 'reviews.txt:70', 'argument 2', '--pair
    2'): from each `--tsv`; else the arguments, then each `--file` (one per line; `-` is stdin), else stdin, blank
    lines skipped, with the `--pair` values."""
    check_columns(args.columns, args.header, bool(args.tsv), "--tsv")
    if [str(path) for path in args.tsv or args.file or []].count("-") > 1:
        raise UsageError("stdin (-) is named twice: it is read once, so the second would read nothing; name it once")
    if args.tsv:
        if args.texts or args.file or args.pair:
            raise UsageError("give texts either in --tsv files or as arguments, --file and --pair, not both")
        texts, pairs, origins = [], [], []
        for path in args.tsv:
            for number, text, pair in numbered_pairs(path, args.header, stdin, args.columns):
                texts.append(text)
                pairs.append(pair)
                origins.append(f"{path}:{number}")
        pair_origins = origins  # a pair is on its text's line
    else:
        texts = list(args.texts)
        origins = [f"argument {i}" for i in range(1, len(texts) + 1)]
        pair_origins = [f"--pair {i}" for i in range(1, len(args.pair or []) + 1)]
        for where, value in zip(origins + pair_origins, texts + (args.pair or []), strict=True):
            if shows_nothing(value):  # refused before any call, as a file's line is
                raise UsageError(
                    f"{where}: empty, or only control, zero-width or replacement (U+FFFD) characters, which the "
                    "model reads as nothing; give it a text"
                )
        paths = args.file or ([] if texts else [Path("-")])
        for path in paths:
            for number, line in numbered_lines(path, stdin):
                texts.append(line)
                origins.append(f"{path}:{number}")
        pairs = args.pair
    if not texts:
        raise UsageError("no texts (give them as arguments, --file, --tsv or on stdin)")
    if pairs is not None and len(pairs) != len(texts):
        raise UsageError(
            f"{len(pairs)} --pair values for {len(texts)} texts: give one per text (none to a model of single texts)"
        )
    return texts, pairs, {"text": origins, "text pair": pair_origins}
