"""Text as files hold it and tokenizers read it: the lines of a UTF-8 file (and the one message for a file that is not
one), what starts UTF-16 text, texts stored one per line, and what a text shows (tokenizers drop control, format such
as zero-width, and space characters, and U+FFFD, the replacement character a decoder writes for bytes it could not
read)."""

import itertools
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # what starts UTF-16 text, such as a spreadsheet's "Unicode text" export
GZIP_MAGIC = b"\x1f\x8b"  # what starts gzip-compressed data
BOM = "\ufeff"  # the byte-order mark that spreadsheet and Windows tools put before UTF-8 text; not part of it
# just after a CR that no LF follows: the end of a line, as old Mac tools end it
CR_ALONE = re.compile(r"(?<=\r)(?!\n)")

INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # Unicode categories of control, format and space characters
REPLACEMENT = "\ufffd"
READ_AHEAD = 4096  # the bytes of a file's start read to tell UTF-16 text by, where UTF-8 fails within them
Error = TypeVar("Error", bound=Exception)


class NotUtf8(ValueError):
    """A line that is not UTF-8 text: its `line` number and the file's `byte` where decoding fails; `utf16` says how the
    first line shows UTF-16 text ('' where it does not); `gzip`, whether the data starts as gzip-compressed data
    does."""

    def __init__(self, line: int, byte: int, utf16: str = "", gzip: bool = False):
        super().__init__(f"line {line}: not valid UTF-8 (byte {byte})")
        self.line, self.byte, self.utf16, self.gzip = line, byte, utf16, gzip

    def as_error(self, source: str, error: type[Error], gunzip: str) -> Error:
        """The caller's `error` naming `source` ('stdin', a path), the line and how to fix it: re-encode UTF-16 text,
        `gunzip` gzip-compressed data (how depends on what the caller reads), re-encode (or drop) a byte."""
        if self.utf16:
            return error(f"{source}:1: UTF-16 text ({self.utf16}), not UTF-8; re-encode the file as UTF-8")
        if self.gzip:
            return error(
                f"{source}:1: gzip-compressed data (it starts with gzip's bytes 1f 8b), not UTF-8 text; {gunzip}"
            )
        return error(
            f"{source}:{self.line}: not valid UTF-8 (byte {self.byte}); re-encode the file as UTF-8 (from its "
            "encoding, e.g. iconv -f cp1252 -t utf-8), or, if only a few stray bytes are not UTF-8, drop them: "
            "iconv -f utf-8 -t utf-8 -c"
        )


def utf16_sign(first: bytes) -> str:
    """How a file's `first` line (its end kept) shows UTF-16 text: a UTF-16 byte-order mark, or, without one, a NUL at
    every other byte, as text of Latin letters has in UTF-16 (and a text file's lines never do), or tabs or commas
    of UTF-16 among other characters (`_delimited_utf16`); '' where it shows none."""
    if first.startswith(UTF16_BOMS):
        return "it starts with a UTF-16 byte-order mark, as a spreadsheet's Unicode text export does"
    body = first.removesuffix(b"\n")
    if len(body) >= 2 and not (body[0::2].strip(b"\0") and body[1::2].strip(b"\0")):
        return "every other byte of its first line is NUL, as in UTF-16 text without a byte-order mark"
    if _delimited_utf16(first):
        return "its first line reads as UTF-16 text without a byte-order mark, its tabs or commas each a byte and a NUL"
    return ""


def _delimited_utf16(first: bytes) -> bool:
    """Whether a file's `first` line reads as UTF-16 text (either byte order) of printable characters holding a tab or
    a comma: text without Latin letters (Chinese, say) has no NUL at every other byte, but its delimiters have one.
    The NUL of a little-endian line's LF begins the next line, so it is put back."""
    little = first + b"\0" if first.endswith(b"\n") and len(first) % 2 else first
    for codec, line in (("utf-16-le", little), ("utf-16-be", first)):
        try:
            text = line.decode(codec)
        except UnicodeDecodeError:
            continue
        if ("\t" in text or "," in text) and all(char.isprintable() or char in "\t\r\n" for char in text):
            return True
    return False


def utf8_lines(handle: BinaryIO) -> Iterator[tuple[int, str]]:
    """(number, line) of a binary file read as UTF-8, each line decoded as it is taken, so that a large file is never
    held whole and a line never taken is never decoded; its end kept. A line ends at LF, CR LF, or CR alone, never at
    what `str.splitlines` also ends one at (U+2028, U+0085, a form feed: characters a text may hold); `number` counts
    the LFs before it, plus one. A byte-order mark before the first line is dropped; `NotUtf8` for a line that does
    not decode (saying where the data is gzip-compressed, and how the file's start shows UTF-16 text where it fails
    within it), and for a first line that shows UTF-16 text (`utf16_sign`)."""
    offset, head = 0, b""
    for number, raw in enumerate(handle, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            # a UTF-16 character whose low byte is 0x0A (`上`) ends a line early: the file's start shows its text
            start = head + raw + handle.read(READ_AHEAD) if offset < READ_AHEAD else b""
            raise NotUtf8(
                number,
                offset + err.start,
                utf16_sign(start[: len(start) // 2 * 2]),
                number == 1 and raw.startswith(GZIP_MAGIC),
            ) from None
        if number == 1:
            if utf16 := utf16_sign(raw):  # decodes as UTF-8, NULs and all, without a byte-order mark
                raise NotUtf8(number, raw.index(b"\0"), utf16)
            text = text.removeprefix(BOM)
        if "\r" in text:
            yield from ((number, line) for line in CR_ALONE.split(text) if line)
        elif text:
            yield number, text
        head += raw if offset < READ_AHEAD else b""
        offset += len(raw)


def stray_delimiter(extra: list[str], tsv: bool) -> str:
    """What most likely split a line into the `extra` fields beyond its header's: a delimiter ending the line where
    they are empty, else one inside a text (`tsv`: a tab, which TSV cannot quote; else an unquoted comma)."""
    inside = "a tab inside a text (TSV has no quoting)" if tsv else "an unquoted comma in a text"
    if not any(extra):
        return f"{'a tab' if tsv else 'a comma'} at the line's end, or {inside},"
    return inside


def shows_nothing(text: str) -> bool:
    """True for a text of control, zero-width, space and replacement characters only (the empty text too)."""
    return all(char == REPLACEMENT or unicodedata.category(char) in INVISIBLE for char in text)


def write_texts(path: Path, texts: list[str]) -> None:
    """`texts` one per line, each ended by LF, written as they go (never joined into one string); `ValueError` for a
    text that holds an LF itself, which would read back as two."""
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for text in texts:
            if "\n" in text:
                raise ValueError(f"the text {text[:80]!r} holds a line break (LF), which one text per line cannot hold")
            handle.write(text + "\n")


def read_texts(path: Path, count: int | None = None) -> list[str]:
    """The first `count` texts (all, without it) of a file `write_texts` wrote, read line by line: only LF ends a
    line, so that a text keeps the CR, form feed, U+0085 or U+2028 it holds (`str.splitlines` would end one there)."""
    with path.open(encoding="utf-8", newline="\n") as handle:
        return [line.removesuffix("\n") for line in itertools.islice(handle, count)]
