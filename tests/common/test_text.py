"""What a text shows: control, zero-width, space and replacement characters show nothing."""

import pytest
from edgedistill.common.text import shows_nothing


@pytest.mark.parametrize(
    "text", ["", " \t\r\n", "\u00a0\u3000\u2028", "\x00\x1b\x7f\x96", "\u200b\u200d\ufeff\u202e", "\ufffd \ufffd"]
)
def test_control_format_space_and_replacement_characters_show_nothing(text):
    assert shows_nothing(text)


@pytest.mark.parametrize("text", ["a", "\u0301", "\U0001f3ac", "\ue000", "\u200b.\u200b", "東京"])
def test_a_letter_mark_symbol_or_private_use_character_shows_something(text):
    assert not shows_nothing(text)
