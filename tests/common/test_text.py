"""Texts stored one per line, and what a text shows: control, zero-width, space and replacement characters show
nothing; the lines of a UTF-8 file."""

import gzip
import io

import pytest
from edgedistill.common.text import NotUtf8, read_texts, shows_nothing, utf8_lines, write_texts


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


def lines_of(data: bytes) -> list[tuple[int, str]]:
    return list(utf8_lines(io.BytesIO(data)))


def test_utf8_lines_keep_each_lines_end():
    assert lines_of(b"one\r\ntwo\n") == [(1, "one\r\n"), (2, "two\n")]


def test_utf8_lines_end_a_line_at_a_carriage_return_alone():
    assert lines_of(b"one\rtwo\r") == [(1, "one\r"), (1, "two\r")]


def test_utf8_lines_keep_the_separators_splitlines_would_end_a_line_at():
    assert lines_of("first\u2028second\x85third\x0cfourth\n".encode()) == [
        (1, "first\u2028second\x85third\x0cfourth\n")
    ]


def test_utf8_lines_drop_the_byte_order_mark_before_the_first_line():
    assert lines_of(b"\xef\xbb\xbfone\n\xef\xbb\xbftwo\n") == [(1, "one\n"), (2, "\ufefftwo\n")]


def test_utf8_lines_name_the_line_that_is_not_utf8():
    with pytest.raises(NotUtf8) as err:
        lines_of(b"ok\nbad \xff\n")
    assert err.value.line == 2


def test_utf8_lines_name_the_files_byte_that_is_not_utf8():
    with pytest.raises(NotUtf8) as err:
        lines_of(b"ok\nbad \xff\n")
    assert err.value.byte == 7


def test_utf8_lines_name_utf16_text_by_its_byte_order_mark():
    with pytest.raises(NotUtf8) as err:
        lines_of("one\n".encode("utf-16"))
    assert err.value.utf16


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf8_lines_name_utf16_text_without_a_byte_order_mark_by_its_nuls(encoding):
    with pytest.raises(NotUtf8) as err:
        lines_of("sentence\tlabel\ngood\t1\n".encode(encoding))
    assert "every other byte of its first line is NUL" in err.value.utf16


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("delimiter", ["\t", ","])
def test_utf8_lines_name_utf16_text_of_chinese_without_a_byte_order_mark_by_its_delimiters(encoding, delimiter):
    with pytest.raises(NotUtf8) as err:
        lines_of(f"文本{delimiter}标签\n你好{delimiter}正面\n".encode(encoding))
    assert "reads as UTF-16 text without a byte-order mark" in err.value.utf16


@pytest.mark.parametrize("delimiter", ["\t", ","])
def test_utf8_lines_name_utf16_text_whose_first_line_a_0a_byte_cuts_by_its_delimiters(delimiter):
    with pytest.raises(NotUtf8) as err:
        lines_of(f"上文{delimiter}标签\n你好{delimiter}正面\n".encode("utf-16-le"))  # 上 is the bytes 0A 4E
    assert "reads as UTF-16 text without a byte-order mark" in err.value.utf16


def test_utf8_lines_do_not_take_cp1252_text_for_utf16():
    with pytest.raises(NotUtf8) as err:
        lines_of("café,crème\tlabel\n".encode("cp1252"))
    assert err.value.utf16 == ""


def test_utf8_lines_say_gzip_data_is_gzip_data():
    with pytest.raises(NotUtf8) as err:
        lines_of(gzip.compress(b"one\n"))
    assert err.value.gzip


def test_utf8_lines_say_a_later_stray_byte_is_no_gzip_data():
    with pytest.raises(NotUtf8) as err:
        lines_of(b"ok\n\x1f\x8b\n")
    assert not err.value.gzip


def test_utf8_lines_take_a_first_line_of_two_letters_as_utf8():
    assert lines_of(b"ab\ncd\n") == [(1, "ab\n"), (2, "cd\n")]


def test_utf8_lines_decode_only_the_lines_taken():
    assert next(utf8_lines(io.BytesIO(b"first\n\xff\n"))) == (1, "first\n")


def test_a_line_that_is_not_utf8_is_reported_as_the_callers_error():
    assert isinstance(NotUtf8(2, 7).as_error("u.txt", LookupError, "gunzip it"), LookupError)


def test_a_line_that_is_not_utf8_is_reported_naming_the_source_line_and_byte():
    assert str(NotUtf8(2, 7).as_error("u.txt", ValueError, "gunzip it")).startswith(
        "u.txt:2: not valid UTF-8 (byte 7);"
    )


def test_gzip_data_is_reported_with_the_callers_way_to_read_it():
    reported = NotUtf8(1, 1, gzip=True).as_error("u.txt", ValueError, "zcat it")
    assert str(reported).endswith("not UTF-8 text; zcat it")
