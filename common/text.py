"""What a text shows: the characters tokenizers drop (control, format such as zero-width, and space characters)."""

import unicodedata

INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # Unicode categories of control, format and space characters


def shows_nothing(text: str) -> bool:
    """True for a text of control, zero-width and space characters only (the empty text too)."""
    return all(unicodedata.category(char) in INVISIBLE for char in text)
