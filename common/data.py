"""Labelled and unlabelled text from local files or the Hugging Face Hub, validated at load.

A source is a path (`.tsv`, `.csv`, `.jsonl` for labelled data; any text file, one text per line, for unlabelled
data), gzip-compressed if its name ends in `.gz`, or `hub:<dataset>[@<config>]:<split>[:<column>]` (`HubSource`).
"""

import csv
import difflib
import gzip
import hashlib
import itertools
import json
import re
import unicodedata
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from edgedistill.common import progress, settings
from edgedistill.common.config.training import LABELLED_FORMATS, DataConfig
from edgedistill.common.names import first_of
from edgedistill.common.text import NotUtf8, shows_nothing, stray_delimiter, utf8_lines
from edgedistill.common.textstyle import Style, as_served

GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)  # not gzip data, cut short, or corrupt
SIGNED = re.compile(r"[+-]?[0-9]+")  # a label name that reads as a number
# the key of a manifest's `info` that holds the `Examples.digest` of the dev examples its dev figures were measured on
DEV_EXAMPLES = "dev_examples"
FIELD_SIZE_LIMIT = 2**31 - 1  # characters in a CSV/TSV field: the csv module's C long, on every platform
# what to give a split that holds no labels: GLUE's test splits, whose labels are not published
LABELLED_ONLY = (
    "data.train, data.dev and data.test take labelled examples only: a labelled split, e.g. a slice of train held out"
)
# the second text's columns beside a first of these names: GLUE's and SuperGLUE's pair tasks, and the names of a
# Hugging Face tokenizer's arguments (`text`, `text_pair`), which datasets saved for one often keep
SECOND_TEXTS = {
    "premise": ("hypothesis",),
    "question": ("sentence", "passage"),
    "question1": ("question2",),
    "text": ("text_pair",),
}


class DataError(ValueError):
    """Data that cannot be used, with the file, the line and how to fix it."""


@dataclass(frozen=True)
class Examples:
    """Texts, their pairs (None: single texts), their gold label ids (None: unlabelled), and where they came from."""

    texts: list[str]
    pairs: list[str] | None
    labels: list[int] | None
    source: str

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, indices: list[int]) -> "Examples":
        """The examples at `indices`, in their order."""

        def pick(values):
            return None if values is None else [values[i] for i in indices]

        return replace(self, texts=pick(self.texts), pairs=pick(self.pairs), labels=pick(self.labels))

    def digest(self) -> dict[str, int | str]:
        """How many examples, and the sha256 of their texts, pairs and label ids in order: enough to tell whether two
        reads of a split hold the same examples."""
        content = json.dumps([self.texts, self.pairs, self.labels]).encode()
        return {"count": len(self), "sha256": hashlib.sha256(content).hexdigest()}

    def as_served(self, style: Style) -> "Examples":
        """The examples with their texts and pairs as a bundle of `style` serves them (`textstyle.as_served`)."""
        return replace(self, texts=as_served(self.texts, style), pairs=as_served(self.pairs, style))

    def batches(self, size: int) -> list["Examples"]:
        """Consecutive groups of at most `size`, in order, covering every example once."""
        return [self.take(list(range(start, min(start + size, len(self))))) for start in range(0, len(self), size)]

    def lengths(self) -> list[int]:
        """Each example's length in characters, a pair's both texts."""
        if self.pairs is None:
            return [len(text) for text in self.texts]
        return [len(text) + len(pair) for text, pair in zip(self.texts, self.pairs, strict=True)]

    def _labelled(self, what: str) -> list[int]:
        """The gold label ids, for `what` (a method that needs them); ValueError for unlabelled examples."""
        if self.labels is None:
            raise ValueError(f"{what} needs labelled examples; {self.source} has no labels")
        return self.labels

    def absent(self, names: list[str]) -> list[str]:
        """The label names no example carries."""
        seen = set(self._labelled("absent"))
        return [name for index, name in enumerate(names) if index not in seen]

    def f1_warning(self, cfg: DataConfig) -> str | None:
        """What the teacher stage warns of dev examples (these) that select on F1 (`data.metric: f1`) without one of
        `data.positive_label`: dev_f1 is 0 at every evaluation. None when they hold one, or select on another metric."""
        if cfg.metric != "f1" or cfg.positive_index in self._labelled("f1_warning"):
            return None
        return (
            f"no dev example is labelled {cfg.label_names[cfg.positive_index]!r} (data.positive_label), so dev_f1, "
            "the selection metric (data.metric), is 0 at every evaluation: the first checkpoint is kept, and training "
            "runs its whole budget for nothing, stopping early only where finetune.optim.patience is set; give "
            "data.dev examples of it (raise data.dev_limit, or name another split), or select on another data.metric"
        )

    def shared_with(self, other: "Examples") -> int:
        """How many of these examples (text, and pair) `other` holds too."""
        held = set(zip(other.texts, other.pairs or [None] * len(other), strict=True))
        return sum(example in held for example in zip(self.texts, self.pairs or [None] * len(self), strict=True))

    def both_ways(self) -> "Examples":
        """These pairs followed by each pair the other way round, with the same labels."""
        if self.pairs is None:
            raise ValueError("both_ways needs sentence pairs")
        labels = self._labelled("both_ways")
        return replace(self, texts=self.texts + self.pairs, pairs=self.pairs + self.texts, labels=labels * 2)


def _require_file(path: Path) -> None:
    """Fail unless `path` is a file, saying where a relative one was looked for, or what a folder holds."""
    if path.is_dir():
        held = sorted(_file_names(path))
        holds = f"it holds {first_of(held)}" if held else "it holds no file"
        raise DataError(
            f"{path}: a folder, not a file ({holds}); name the file itself in the recipe, and in a list of text "
            "files each of them"
        )
    if not path.is_file():
        relative = (
            ""
            if path.is_absolute()
            else f", looked for from the working directory {Path.cwd()} (a recipe's path starting with ./ or ../ is "
            "read from the recipe's folder instead)"
        )
        near = difflib.get_close_matches(path.name, _file_names(path.parent), n=1, cutoff=0.8)
        nearest = f"; {path.parent} has {near[0]}" if near else ""
        raise DataError(f"{path}: file not found{relative}{nearest}; {_data_dir_fix(path)}")


def _data_dir_fix(path: Path) -> str:
    """How to fix a missing `path`: EDGEDISTILL_DATA_DIR where the path lies under it (as a recipe's
    `${EDGEDISTILL_DATA_DIR}/...` does), saying where it points; else the path itself, wherever it was given."""
    data_dir = Path(settings.variables()["EDGEDISTILL_DATA_DIR"])
    fix = "fix the path in the recipe, or in the override that gives it"
    if not path.absolute().is_relative_to(data_dir.absolute()):
        return fix
    points = f"{data_dir}, which does not exist" if not data_dir.is_dir() else str(data_dir)
    return f"set EDGEDISTILL_DATA_DIR (now {points}) to the folder holding the data, or {fix}"


def _file_names(folder: Path) -> list[str]:
    """The names of the files in `folder`; none where it cannot be listed."""
    try:
        return [item.name for item in folder.iterdir() if item.is_file()]
    except OSError:
        return []


def _not_utf8(path: Path, err: NotUtf8) -> DataError:
    """The error for a line of `path` that is not UTF-8 (`NotUtf8.as_error`); gzip data is a download saved without
    its .gz, or a .gz compressed twice."""
    gunzip = "it was compressed twice: gunzip it once" if _gzipped(path) else f"name it {path.name}.gz to read it so"
    return err.as_error(str(path), DataError, gunzip)


def _gzipped(path: Path) -> bool:
    return path.suffix.lower() == ".gz"


def _format(path: Path) -> str:
    """The suffix that names a file's format (`.csv`), under a `.gz` one."""
    return Path(path.stem).suffix.lower() if _gzipped(path) else path.suffix.lower()


def _cannot_decompress(where: str, err: Exception) -> DataError:
    return DataError(f"{where}: cannot decompress it ({err}); compress it again with gzip")


def _opened(path: Path) -> BinaryIO:
    """A local file opened for its bytes, gunzipped as they are read if its name ends in `.gz`; `DataError` for a
    missing one."""
    _require_file(path)
    return (gzip.open if _gzipped(path) else open)(path, "rb")


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(number, line) of a UTF-8 file (gzip-compressed if its name ends in `.gz`), line ends kept, decoded as they are
    taken (`common.text.utf8_lines`): a large file is never held whole. The ends are kept as csv wants them: they keep
    a quoted CSV field's own lines apart."""
    with _opened(path) as handle:
        number = 0
        try:
            for number, line in utf8_lines(handle):
                yield number, line
        except NotUtf8 as err:
            raise _not_utf8(path, err) from None
        except GZIP_ERRORS as err:
            raise _cannot_decompress(f"{path}:{number + 1}", err) from None


def _json_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(number, line) of a JSON Lines file (`_numbered_lines`), each line ended by LF alone (a CR within one is JSON's
    whitespace) and given as soon as its LF is read: the next line is not read before it is taken."""
    pieces = []
    for number, piece in _numbered_lines(path):
        pieces.append(piece)
        if piece.endswith("\n"):  # the pieces of a line before its last end in a CR
            yield number, "".join(pieces)
            pieces = []
    if pieces:  # a last line ended by a CR, or by the file's end
        yield number, "".join(pieces)


def _text_stream(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 file, line ends kept (`_numbered_lines`)."""
    return (line for _, line in _numbered_lines(path))


class _RepeatedKeys(ValueError):
    """The keys a JSON object names more than once."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's (key, value) pairs as a dict; `_RepeatedKeys` for a key named twice, of which `json` would keep
    the last value without a word (as the csv module keeps a header's last column of a name)."""
    keys = [key for key, _ in pairs]
    if twice := sorted({key for key in keys if keys.count(key) > 1}):
        raise _RepeatedKeys(twice)
    return dict(pairs)


def _rows(path: Path) -> Iterator[tuple[int, dict, int]]:
    """(line number, row, line naming its columns) of a TSV/CSV with a header (the header's line), or of a JSONL file
    (the row's own), either gzip-compressed (named `.gz`), read as they are taken."""
    _require_file(path)  # a folder or a missing file is named as such, whatever its name ends with
    suffix = _format(path)
    if suffix not in LABELLED_FORMATS:
        raise DataError(f"{path}: unsupported format {suffix!r}; use .tsv, .csv or .jsonl (or any of them .gz)")
    if suffix == ".jsonl":
        for number, line in _json_lines(path):
            if line.strip():
                try:
                    row = json.loads(line, object_pairs_hook=_unique_keys)
                except json.JSONDecodeError as err:
                    ends = (
                        "; its lines end in CR alone, where JSON Lines ends them in LF: tr '\\r' '\\n' converts them"
                        if "\r{" in line
                        else ""
                    )
                    raise DataError(
                        f"{path}:{number}: not valid JSON ({err.msg}); one JSON object per line{ends}"
                    ) from None
                except _RepeatedKeys as err:
                    raise DataError(
                        f"{path}:{number}: key(s) {err} named more than once in an object; rename them"
                    ) from None
                if not isinstance(row, dict):
                    raise DataError(
                        f"{path}:{number}: a JSON {type(row).__name__}, not an object; one JSON object per line"
                    )
                yield number, row, number
        return
    reader = csv.DictReader(
        _text_stream(path),
        delimiter="\t" if suffix == ".tsv" else ",",
        quoting=csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL,
        # a space after a comma is no part of the field: `a, "b, c"` is quoted, a header's `, label` is `label`
        skipinitialspace=suffix == ".csv",
        # a quote left open is an error, not a text that takes in every line up to the next quote
        strict=suffix == ".csv",
    )
    csv.field_size_limit(FIELD_SIZE_LIMIT)  # a long document is a text like any other
    last = 0
    try:
        # the header is the first line that is not blank: blank lines before it are skipped, as they are after it
        reader.fieldnames = header = next((cells for cells in reader.reader if not _blank(cells)), [])
        last = named = reader.reader.line_num
        # a file separated otherwise than its name says reads as one column: said before a row's fields are counted,
        # which a text holding the name's separator (a comma in a .csv file of semicolons) would make more
        if len(header) == 1 and (separator := next((sep for sep in ",;\t|" if sep in header[0]), None)):
            raise DataError(
                f"{path}:{named} (the header): found {header}, one column holding {separator!r}: a .csv file is "
                "separated by commas and a .tsv file by tabs; save it so, or give it the name of its format"
            )
        # columns without a name (a spreadsheet's empty ones, `a,b,,`) are read by no setting, however many
        if twice := sorted({name for name in header if name and header.count(name) > 1}):
            raise DataError(f"{path}:{named} (the header): column(s) {twice} named more than once; rename them")
        for row in reader:  # the line a row ends on: blank lines are skipped, not counted
            if _blank([cell for key, value in row.items() for cell in (value if key is None else [value])]):
                last = reader.line_num
                continue
            if None in row:  # fields beyond the header's: every column after a stray delimiter would be shifted
                raise DataError(
                    f"{path}:{reader.line_num}: {len(row[None])} field(s) more than the header's {len(header)}; "
                    f"{stray_delimiter(row[None], suffix == '.tsv')} splits it: remove it"
                )
            if None in row.values():  # fields short of the header's: the last columns would be read as missing
                lines_of = f"{last + 1}-{reader.line_num}" if reader.line_num > last + 1 else f"{reader.line_num}"
                cause = (
                    "a missing tab, or a line break inside a text,"
                    if suffix == ".tsv"
                    else "a missing comma, a quote left open, or a line break in an unquoted text"
                )
                raise DataError(
                    f"{path}:{lines_of}: {list(row.values()).count(None)} field(s) fewer than the header's "
                    f"{len(header)}; {cause} cuts the row short: fix it"
                )
            yield reader.line_num, row, named
            last = reader.line_num
    except csv.Error as err:  # strict quoting's
        raise _open_quote(path, last, reader.reader.line_num, err) from None


def _blank(cells: list[str | None]) -> bool:
    """Whether a TSV/CSV line's cells hold spaces and tabs alone (or nothing): a blank line, skipped."""
    return not "".join(cell or "" for cell in cells).strip()


def _open_quote(path: Path, last: int, found: int, err: csv.Error) -> DataError:
    """The error for a CSV row that opens a quote after line `last` and does not close it as CSV does, found on line
    `found`: it names the line the row starts on (blank lines skipped)."""
    start = next((number for number, line in _numbered_lines(path) if number > last and line.strip("\r\n")), last + 1)
    ends = (
        "is never closed (the file ends inside it)"
        if "end of data" in str(err)
        else f"closes before other characters on line {found} ({err})"
    )
    return DataError(
        f"{path}:{start}: a quote in the row that starts here {ends}; a text that starts with a quote must end with "
        'one, and a quote inside a quoted text is written twice (""): fix the quotes, or quote the whole text'
    )


@dataclass(frozen=True)
class HubSource:
    """A Hub split as a source names it: `hub:<dataset>[@<config>]:<split>[:<column>]`. The dataset is its Hub id,
    an organisation's included (`nyu-mll/glue`); the split may be sliced as `datasets` slices it (`train[:90%]`)."""

    dataset: str
    config: str | None
    split: str
    column: str | None

    @classmethod
    def parse(cls, spec: str) -> "HubSource":
        """The parts of `spec`; `DataError` for one that does not have them."""
        # a colon inside a slice's brackets (train[:90%]) separates nothing
        parts = re.split(r":(?![^\[]*\])", spec.removeprefix("hub:"))
        dataset, at, config = parts[0].partition("@")
        if len(parts) not in (2, 3) or not all([dataset, *parts[1:]]) or (at and not config):
            raise DataError(
                f"{spec}: a Hub source looks like hub:<dataset>[@<config>]:<split>[:<column>], e.g. "
                "hub:nyu-mll/glue@sst2:train"
            )
        return cls(dataset, config or None, parts[1], parts[2] if len(parts) == 3 else None)


def _from_hub(spec: str):
    """`hub:nyu-mll/glue@sst2:train[:column]` -> (dataset split, column or None)."""
    import datasets

    source = HubSource.parse(spec)
    try:
        split = datasets.load_dataset(source.dataset, source.config, split=source.split)
    except (OSError, ValueError) as err:  # no network or offline (ConnectionError), no such dataset, no such split
        owner, slash, name = source.dataset.partition("/")
        # a ValueError comes from a dataset that loaded: its split or config is what is wrong, not its name
        config = (
            f"; if {owner} is the dataset and {name} its config, write hub:{owner}@{name}:{source.split}"
            if owner and slash and source.config is None and not isinstance(err, ValueError)
            else ""
        )
        raise DataError(
            f"{spec}: cannot load it from the Hub ({err}); name a local file, or a Hub dataset where the Hub can be "
            f"reached (with HF_HUB_OFFLINE=1, one in the local cache){config}"
        ) from None
    return split, source.column


def _label_index(cell, names: dict[str, int], where: str) -> int:
    """A label cell as its index: one of the label names (`names` in NFC), else an integer index in range."""
    if isinstance(cell, str):
        text = unicodedata.normalize("NFC", cell.strip())  # "é" typed as e and U+0301 is the name's "é"
        if text in names:
            return names[text]
        index = int(text) if text.isascii() and text.isdigit() else None
    else:
        index = cell if isinstance(cell, int) and not isinstance(cell, bool) else None
    if index is None or not 0 <= index < len(names):
        near = _near_name(text, list(names)) if isinstance(cell, str) else None
        meant = f" (did you mean {near!r}? a name matches as written, case included)" if near else ""
        # a JSON or Hub true/false or 1.0 is neither: its type says why, where its repr looks like a name or an index
        kind = (
            ""
            if isinstance(cell, str | int) and not isinstance(cell, bool)
            else f" (a {type(cell).__name__}, not text or an integer)"
        )
        raise DataError(
            f"{where}: label {cell!r}{kind} is neither one of data.label_names {list(names)} nor an index "
            f"0..{len(names) - 1}{meant}; if it is a label of the task, add it to data.label_names in the recipe, "
            "else fix the file"
        )
    # where a name is the number of another index (a signed one too: -1/0/1 sentiment), a number is read as a name,
    # so a cell read as an index would put two numbers on one label (star ratings named 1..5 in a file of indices
    # 0..4: 0 and 1 both the first)
    numbered = next((name for name, at in names.items() if SIGNED.fullmatch(name) and int(name) != at), None)
    if isinstance(cell, str) and numbered is not None:
        raise DataError(
            f"{where}: label {cell!r} is no name of data.label_names {list(names)}, and cannot be an index there: "
            f"{numbered!r} names label {names[numbered]}, so a number is read as a name; write the file's labels as "
            "the names, or name the labels in data.label_names as the file writes them"
        )
    return index


def _near_name(text: str, names: list[str]) -> str | None:
    """The label name `text` differs from only in case, else the closest name, if any is close enough to be a typo of
    it (not a label of its own one letter away from a short name: TREC's NUM and HUM)."""
    same = [name for name in names if name.casefold() == text.casefold()]
    return same[0] if same else next(iter(difflib.get_close_matches(text, names, n=1, cutoff=0.75)), None)


def _missing_columns(
    source: str, line: tuple[int, dict, int], first: int, missing: list[str], cfg: DataConfig
) -> DataError:
    """The error for a row (`_rows`' line) without the recipe's columns: on the first row the recipe names the wrong
    ones, at the line naming them (or a TSV/CSV file has no header: a label among the names, none of the recipe's),
    later the row lacks what the first one holds."""
    number, row, named = line
    found = f"found {list(row)}"  # in the file's order
    if number != first:
        return DataError(
            f"{source}:{number}: missing {missing} ({found}), which line {first} has; every line needs them"
        )
    delimited = _format(Path(source)) in (".tsv", ".csv")
    where = f"{source}:{named}" + (" (the header)" if delimited else "")
    settings = "data.text_column / data.label_column" + (" / data.text_pair_column" if cfg.text_pair_column else "")
    label = next((cell for cell in row if _is_label(cell, cfg.label_names)), None)
    if delimited and label is not None and not {cfg.text_column, cfg.label_column, cfg.text_pair_column} & set(row):
        return DataError(
            f"{source}:{named}: missing column(s) {missing}; {found}, and {label!r} is a label: the line read as the "
            f"header looks like an example; add a header line naming the columns, as {settings} in the recipe name them"
        )
    near = [f"{name!r} for {column!r}" for column in missing for name in difflib.get_close_matches(column, row, n=1)]
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    if missing == [cfg.label_column] and not near and label is None:
        return DataError(
            f"{where}: missing column(s) {missing}; {found}: the split holds no labels (as GLUE's test files do); "
            f"{LABELLED_ONLY}, or its examples labelled. If its labels are in another column, set data.label_column "
            "in the recipe"
        )
    return DataError(f"{where}: missing column(s) {missing}; {found}{hint}. Set {settings} in the recipe")


def _is_label(cell: str, names: list[str]) -> bool:
    """Whether a cell, stripped, reads as a label: one of `names` (in NFC) or a whole number below their number."""
    text = unicodedata.normalize("NFC", cell.strip())
    return text in {unicodedata.normalize("NFC", name) for name in names} or (
        text.isascii() and text.isdigit() and int(text) < len(names)
    )


def _second_text(source: str, line: tuple[int, dict, int], cfg: DataConfig) -> DataError | None:
    """The error for a file of sentence pairs read as single texts: the recipe sets no `data.text_pair_column` (null
    given on purpose reads the first text alone) and the first row has the text column's evident second, its name
    with 2 for 1 (`sentence1`, `#1 String`), b for a last a (`text_a`), or a pair task's second (`hypothesis`,
    `text_pair`), in any case (`Hypothesis` beside `Premise`), named at the line naming the columns (`_rows`' line)."""
    if cfg.text_pair_column is not None or "text_pair_column" in cfg.model_fields_set:
        return None
    _, row, named = line
    column = cfg.text_column
    seconds = (
        re.sub(r"(?<!\d)1(?!\d)", "2", column),
        re.sub(r"(?<=[_\- ])([aA])$", lambda letter: "b" if letter[1] == "a" else "B", column),
        *SECOND_TEXTS.get(column.casefold(), ()),
    )
    second = next(
        (found for name in seconds for found in row if found != column and found.casefold() == name.casefold()), None
    )
    if second is None:
        return None
    where = f"{source}:{named}" + (" (the header)" if _format(Path(source)) in (".tsv", ".csv") else "")
    quoted = json.dumps(second, ensure_ascii=False)  # as YAML reads it, a name starting with # included
    return DataError(
        f"{where}: column {second!r} reads as the second text of a pair beside {column!r}, and data.text_pair_column "
        f"is not set, so each example would be {column!r} alone: set data.text_pair_column: {quoted}, or "
        f"data.text_pair_column: null to train on {column!r} alone"
    )


def _text(cell, where: str, column: str, fix: str) -> str:
    """A text cell, stripped. One that shows nothing (`shows_nothing`: characters tokenizers drop) is empty; a lone
    surrogate (a JSON escape such as \\ud83d without its pair) is refused, as no tokenizer takes it."""
    text = "" if cell is None else str(cell).strip()
    if shows_nothing(text):
        shown = " (only control, zero-width, space or replacement characters)" if text else ""
        raise DataError(f"{where}: empty {column!r}{shown}; {fix}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DataError(
            f"{where}: {column!r} holds a lone surrogate ({text[err.start]!r} at character {err.start}), half of a "
            "character's JSON escape: write the character itself, or both halves of its escape"
        ) from None
    return text


def _check_class_names(source: str, feature, cfg: DataConfig) -> None:
    """Refuse a Hub label column whose class label names `cfg.label_names` lists at other indices: its labels reach
    the reader as indices into the dataset's own names, so each would be read as another label. A recipe name is the
    dataset's name it equals with accents composed, else the one it equals but for case (`Positive` for
    `positive`); names of the recipe's own for the classes are the recipe's choice."""
    theirs = [unicodedata.normalize("NFC", name) for name in getattr(feature, "names", None) or []]
    folded: dict[str, list[int]] = {}
    for index, name in enumerate(theirs):
        folded.setdefault(name.casefold(), []).append(index)

    def index_in_theirs(name: str) -> int | None:
        name = unicodedata.normalize("NFC", name)
        if name in theirs:
            return theirs.index(name)
        found = folded.get(name.casefold(), [])
        return found[0] if len(found) == 1 else None

    moved = [
        f"{name!r} at {index} (the dataset's at {at})"
        for index, name in enumerate(cfg.label_names)
        if (at := index_in_theirs(name)) is not None and at != index
    ]
    if moved:
        raise DataError(
            f"{source}: its {cfg.label_column!r} column is a class label named {theirs} in index order, and "
            f"data.label_names {cfg.label_names} lists {', '.join(moved)}: each label would be read as another; "
            "list them in the dataset's order"
        )


def _without_label(where: str, label, class_label: bool) -> DataError:
    """The error for a label that marks an example without one: -1 or None in a Hub class label, or -1 (as `datasets`
    writes such a label to a file: GLUE's test splits saved with to_json or to_csv) where no label is named so."""
    marked = "a Hub class label" if class_label else "a split `datasets` saved"
    named = "" if class_label else "; if -1 is a label of the task, write data.label_names as the split names them"
    return DataError(
        f"{where}: label {label!r}, which marks an example without a label in {marked}: the split is unlabelled (as "
        f"GLUE's test splits are) or holds such examples (as a few of SNLI's do); {LABELLED_ONLY} (train[90%:]), or "
        f"the split without those examples saved as a file{named}"
    )


def load_labelled(source: str, cfg: DataConfig, limit: int | None = None) -> Examples:
    """Read `(text, [pair], label)` examples, checking columns; a label is a name in `label_names` or its index.
    With `limit`, the first `limit` examples, reading no further."""
    columns = [cfg.text_column, cfg.label_column] + ([cfg.text_pair_column] if cfg.text_pair_column else [])
    if source.startswith("hub:"):
        if HubSource.parse(source).column is not None:  # an unlabelled source's: here data.*_column say them
            raise DataError(
                f"{source}: a labelled Hub source is hub:<dataset>[@<config>]:<split>; name its columns "
                "in data.text_column / data.label_column"
            )
        import datasets

        split, _ = _from_hub(source)
        feature = split.features.get(cfg.label_column)
        _check_class_names(source, feature, cfg)
        class_label = isinstance(feature, datasets.ClassLabel)
        rows = ((i + 1, row, i + 1) for i, row in enumerate(split))
    else:
        class_label, rows = False, _rows(Path(source))
    names = {unicodedata.normalize("NFC", name): index for index, name in enumerate(cfg.label_names)}
    texts, pairs, labels, first = [], [], [], None
    for number, row, named in rows:  # every row: a JSONL line may lack a key that the lines before it have
        first = first or number
        if missing := [c for c in columns if c not in row]:
            raise _missing_columns(source, (number, row, named), first, missing, cfg)
        if number == first and (unread := _second_text(source, (number, row, named), cfg)):
            raise unread
        for column in columns[:1] + columns[2:]:  # the texts: a JSON list or object would be read as its repr
            if not isinstance(row[column], str | None):
                raise DataError(
                    f"{source}:{number}: {column!r} is a JSON {type(row[column]).__name__}, not a string; "
                    "write the text as a JSON string"
                )
        where = f"{source}:{number}"
        texts.append(_text(row[cfg.text_column], where, cfg.text_column, "remove the line"))
        label = row[cfg.label_column]
        if label in (-1, None) if class_label else (str(label).strip() == "-1" and "-1" not in names):
            raise _without_label(where, label, class_label)
        if label is None or isinstance(label, str) and not label.strip():
            raise DataError(f"{where}: empty {cfg.label_column!r}; give the example its label, or remove the line")
        if isinstance(label, int) and not isinstance(label, bool) and not class_label:
            label = str(label)  # an integer reads as its digits, as a TSV cell does; a Hub class label is an index
        labels.append(_label_index(label, names, where))
        if cfg.text_pair_column:
            pairs.append(_text(row[cfg.text_pair_column], where, cfg.text_pair_column, "every text needs its pair"))
        if len(texts) == limit:  # before the next row is read, which may not even parse
            break
    if not texts:
        raise DataError(f"{source}: no examples (the file is empty or holds only a header)")
    return Examples(texts, pairs if cfg.text_pair_column else None, labels, source)


def _split(cfg: DataConfig, key: str, limit: int | None = None) -> Examples:
    """The split the setting `data.<key>` names, its first `limit` examples; its errors name the setting first."""
    try:
        return load_labelled(getattr(cfg, key), cfg, limit)
    except DataError as err:
        raise DataError(f"data.{key}: {err}") from None


def load_dev(cfg: DataConfig) -> Examples:
    """The recipe's dev split, in file order, cut to `dev_limit`."""
    return _split(cfg, "dev", cfg.dev_limit)


def load_splits(cfg: DataConfig) -> tuple[Examples, Examples]:
    """The recipe's train and dev splits, cut to `train_limit` / `dev_limit`; train pairs both ways if
    `symmetric_pairs`."""
    train = _split(cfg, "train", cfg.train_limit)
    return train.both_ways() if cfg.symmetric_pairs else train, load_dev(cfg)


def limits_note(cfg: DataConfig, train: Examples, dev: Examples) -> str | None:
    """Which of `load_splits`' splits `train_limit` / `dev_limit` cut, as a sentence: those read up to the limit (the
    file may hold more: it is read no further), or None."""
    read = {"train": len(train) // (2 if cfg.symmetric_pairs else 1), "dev": len(dev)}
    cut = [
        f"{count:,} {split} examples, data.{split}_limit"
        for split, count in read.items()
        if getattr(cfg, f"{split}_limit") == count
    ]
    return (
        f"read up to the limits: {' and '.join(cut)} (the files may hold more; null reads a split whole)"
        if cut
        else None
    )


def load_test(cfg: DataConfig) -> Examples | None:
    """The recipe's test split, or None without one."""
    return None if cfg.test is None else _split(cfg, "test")


def _text_lines(path: Path) -> Iterator[str]:
    """Stripped lines of a UTF-8 text file (`_text_stream`) that show something (`shows_text`), read as they are
    taken."""
    return (stripped for line in _text_stream(path) if shows_text(stripped := line.strip()))


def shows_text(line: str) -> bool:
    """Whether a stripped unlabelled `line` is a text: not blank, and not of characters tokenizers drop alone
    (`shows_nothing`: a zero-width space), which would make an example of special tokens only."""
    return bool(line) and not shows_nothing(line)


def unreadable_files(sources: list[str], lines: int = 1000) -> list[DataError]:
    """Why each local file among `sources` (Hub sources aside) cannot be read, found in its first `lines` text lines
    as `unlabelled_lines` reads them: missing, not UTF-8, not gzip data, or empty."""
    errors = []
    for source in sources:
        if not source.startswith("hub:"):
            try:
                load_unlabelled([source], lines)
            except DataError as err:
                errors.append(err)
    return errors


def _hub_lines(source: str) -> Iterator[str]:
    """The stripped texts that show something (`shows_text`) of a Hub source's text column (`text` unless the source
    names one); a missing value (None) is skipped as a blank line is. `DataError` for a column the dataset lacks or
    that holds no text."""
    split, column = _from_hub(source)
    column = column or "text"
    feature = split.features.get(column)
    kind = None if feature is None else getattr(feature, "dtype", type(feature).__name__)
    if kind not in ("string", "large_string"):
        what = f"no column {column!r}" if feature is None else f"column {column!r} holds {kind}, not text"
        raise DataError(
            f"{source}: {what}; its columns are {split.column_names}: name its text column in the recipe's "
            "source, as hub:<dataset>[@<config>]:<split>:<column>"
        )
    return (line for text in split[column] if text is not None and shows_text(line := text.strip()))


def unlabelled_lines(sources: list[str], max_lines: int | None = None) -> Iterator[str]:
    """The lines of text files (or a Hub text column) that show something (`shows_text`), up to `max_lines` in all,
    read as they are taken: a multi-million-line dump is never held whole."""
    left = max_lines
    for source in sources:
        found = _hub_lines(source) if source.startswith("hub:") else _text_lines(Path(source))
        taken = 0
        for line in itertools.islice(found, left):
            taken += 1
            yield line
        if not taken:
            raise DataError(f"{source}: no text (the file is empty, or its lines show nothing)")
        if left is not None:
            left -= taken
            if not left:
                return


def line_count(sources: list[str]) -> int | None:
    """Lines in the local text files `sources`, ended by LF, CR LF or CR alone as `unlabelled_lines` reads them, or by
    the file's end (blank ones too: at least as many as it gives), read in blocks; None with a Hub source. `DataError`
    for a file missing or not gzip data, as `unlabelled_lines` gives."""
    if any(source.startswith("hub:") for source in sources):
        return None
    count = 0
    for source in map(Path, sources):
        with _opened(source) as handle:
            try:
                count += _lines_in(iter(lambda: handle.read(1 << 20), b""))
            except GZIP_ERRORS as err:
                raise _cannot_decompress(str(source), err) from None
    return count


def _lines_in(blocks: Iterator[bytes]) -> int:
    """The lines in `blocks` of a file: one for each LF, each CR not followed by an LF (a CR LF split between two
    blocks counted once), and a last line without a line end."""
    count, tail = 0, b""
    for block in blocks:
        lone_crs = block.count(b"\r") - block.count(b"\r\n") - block.endswith(b"\r")
        count += block.count(b"\n") + lone_crs + (tail == b"\r" and not block.startswith(b"\n"))
        tail = block[-1:]
    return count + (tail not in (b"", b"\n"))  # a last CR ends a line; any other byte, one without its end


def load_unlabelled(sources: list[str], max_lines: int | None = None, desc: str | None = None) -> list[str]:
    """`unlabelled_lines` as a list; with `desc`, read under a progress bar of that name (a large dump takes
    minutes)."""
    if desc is None:
        return list(unlabelled_lines(sources, max_lines))
    bar = progress.bar(max_lines or line_count(sources), desc=desc, unit="line")
    lines = []
    for line in unlabelled_lines(sources, max_lines):
        lines.append(line)
        bar.update()
    bar.close()
    return lines
