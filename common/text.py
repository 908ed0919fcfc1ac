"""Text as files hold it and tokenizers read it: what starts UTF-16 text, and what a text shows (tokenizers drop
control, format such as zero-width, and space characters, and U+FFFD, the replacement character a decoder writes
for bytes it could not read)."""

import unicodedata

UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # what starts UTF-16 text, such as a spreadsheet's "Unicode text" export

INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # Unicode categories of control, format and space characters
REPLACEMENT = "\ufffd"


def shows_nothing(text: str) -> bool:
    """True for a text of control, zero-width, space and replacement characters only (the empty text too)."""
    return all(char == REPLACEMENT or unicodedata.category(char) in INVISIBLE for char in text)
