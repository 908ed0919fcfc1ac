"""Texts stored one per line, and what a text shows: control, zero-width, space and replacement characters show
nothing."""

import pytest
from edgedistill.common.text import read_texts, shows_nothing, write_texts


@pytest.mark.parametrize(
    "text", ["", " \t\r\n", "\u00a0\u3000\u2028", "\x00\x1b\x7f\x96", "\u200b\u200d\ufeff\u202e", "\ufffd \ufffd"]
)
def test_control_format_space_and_replacement_characters_show_nothing(text):
    assert shows_nothing(text)


@pytest.mark.parametrize("text", ["a", "\u0301", "\U0001f3ac", "\ue000", "\u200b.\u200b", "東京"])
def test_a_letter_mark_symbol_or_private_use_character_shows_something(text):
    assert not shows_nothing(text)


def test_texts_read_back_as_written(tmp_path):
    write_texts(tmp_path / "texts.txt", ["a fine film", "dull"])
    assert read_texts(tmp_path / "texts.txt") == ["a fine film", "dull"]


def test_read_texts_decodes_only_the_lines_it_returns(tmp_path):
    lines = b"a fine film\n" * 10_000  # past the first blocks a reader decodes at once
    (tmp_path / "texts.txt").write_bytes(lines + b"caf\xe9\n")  # reading the last line would raise
    assert read_texts(tmp_path / "texts.txt", 2) == ["a fine film"] * 2


def test_texts_keep_the_line_separators_other_than_lf_they_hold(tmp_path):
    texts = ["first\u2028second", "next\x85line", "form\x0cfeed", "carriage\rreturn", "group\x1dsplit"]
    write_texts(tmp_path / "texts.txt", texts)
    assert read_texts(tmp_path / "texts.txt") == texts


def test_a_text_holding_a_line_feed_is_refused(tmp_path):
    with pytest.raises(ValueError, match="holds a line break"):
        write_texts(tmp_path / "texts.txt", ["line one\nline two"])
