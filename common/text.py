"""Text as files hold it and tokenizers read it: what starts UTF-16 text, texts stored one per line, and what a text
shows (tokenizers drop control, format such as zero-width, and space characters, and U+FFFD, the replacement
character a decoder writes for bytes it could not read)."""

import itertools
import unicodedata
from pathlib import Path

UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # what starts UTF-16 text, such as a spreadsheet's "Unicode text" export

INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # Unicode categories of control, format and space characters
REPLACEMENT = "\ufffd"


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
