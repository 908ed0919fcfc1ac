"""What a text shows: tokenizers drop control, format (such as zero-width) and space characters, and U+FFFD, the
replacement character a decoder writes for bytes it could not read."""

import unicodedata

INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # Unicode categories of control, format and space characters
REPLACEMENT = "\ufffd"


def shows_nothing(text: str) -> bool:
    """True for a text of control, zero-width, space and replacement characters only (the empty text too)."""
    return all(char == REPLACEMENT or unicodedata.category(char) in INVISIBLE for char in text)
