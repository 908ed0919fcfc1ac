import gzip
import json
import re
from pathlib import Path

import pytest
from edgedistill.common import data, settings
from edgedistill.common.config.training import DataConfig
from edgedistill.common.data import (
    DataError,
    Examples,
    HubSource,
    _label_index,
    _rows,
    limits_note,
    line_count,
    load_dev,
    load_labelled,
    load_splits,
    load_test,
    load_unlabelled,
    unlabelled_lines,
)

CFG = DataConfig(train="unused", dev="unused", label_names=["negative", "positive"])
TREC = DataConfig(
    train="unused", dev="unused", text_column="question", label_names=["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
)


def test_labelled_data_loads_from_tsv_csv_and_jsonl(tmp_path):
    (tmp_path / "a.tsv").write_text('sentence\tlabel\nit \'s "good"\t1\nbad .\t0\n')
    (tmp_path / "a.csv").write_text('sentence,label\n"good, really",1\nbad,0\n')
    (tmp_path / "a.jsonl").write_text('{"sentence": "good", "label": 1}\n\n{"sentence": "bad", "label": 0}\n')
    tsv = load_labelled(str(tmp_path / "a.tsv"), CFG)
    assert tsv.texts == ['it \'s "good"', "bad ."]
    assert tsv.labels == [1, 0]
    assert tsv.pairs is None
    assert load_labelled(str(tmp_path / "a.csv"), CFG).texts == ["good, really", "bad"]
    assert load_labelled(str(tmp_path / "a.jsonl"), CFG).labels == [1, 0]


def test_sentence_pairs_and_custom_columns(tmp_path):
    (tmp_path / "p.tsv").write_text("q\tp\ty\nis it?\tyes\t1\n")
    cfg = DataConfig(
        train="x", dev="x", text_column="q", text_pair_column="p", label_column="y", label_names=["no", "yes"]
    )
    data = load_labelled(str(tmp_path / "p.tsv"), cfg)
    assert data.texts == ["is it?"]
    assert data.pairs == ["yes"]
    assert data.labels == [1]


SPLIT = Examples(["great fun", "dull"], None, [1, 0], "dev.tsv")


def test_a_digest_counts_the_examples():
    assert SPLIT.digest()["count"] == 2


def test_the_same_examples_read_from_elsewhere_have_the_same_digest():
    assert Examples(["great fun", "dull"], None, [1, 0], "copy.tsv").digest() == SPLIT.digest()


@pytest.mark.parametrize(
    "other",
    [
        Examples(["great fun", "dull!"], None, [1, 0], "dev.tsv"),
        Examples(["great fun", "dull"], None, [1, 1], "dev.tsv"),
        Examples(["great fun", "dull"], ["a", "b"], [1, 0], "dev.tsv"),
        Examples(["dull", "great fun"], None, [0, 1], "dev.tsv"),
    ],
    ids=["text", "label", "pairs", "order"],
)
def test_examples_unlike_in_a_text_label_pair_or_order_have_another_digest(other):
    assert other.digest()["sha256"] != SPLIT.digest()["sha256"]


def test_symmetric_pairs_train_on_each_pair_both_ways(tmp_path):
    (tmp_path / "p.tsv").write_text("a\tb\tlabel\nfirst\tsecond\t1\nthird\tfourth\t0\n")
    path = str(tmp_path / "p.tsv")
    cfg = DataConfig(train=path, dev=path, text_column="a", text_pair_column="b", label_names=["no", "yes"])
    train, _ = load_splits(cfg.model_copy(update={"symmetric_pairs": True}))
    assert list(zip(train.texts, train.pairs, train.labels, strict=True)) == [
        ("first", "second", 1),
        ("third", "fourth", 0),
        ("second", "first", 1),
        ("fourth", "third", 0),
    ]


def test_symmetric_pairs_leave_dev_in_its_order(tmp_path):
    (tmp_path / "p.tsv").write_text("a\tb\tlabel\nfirst\tsecond\t1\n")
    path = str(tmp_path / "p.tsv")
    cfg = DataConfig(
        train=path, dev=path, text_column="a", text_pair_column="b", label_names=["no", "yes"], symmetric_pairs=True
    )
    _, dev = load_splits(cfg)
    assert dev.texts == ["first"]
    assert dev.pairs == ["second"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "no examples"),
        (b"sentence\tlabel\n", "no examples"),
        (b"text\tlabel\ngood\t1\n", r"a\.tsv:1 \(the header\): missing column\(s\) \['sentence'\].*data\.text_column"),
        (
            b"sentence\tlabel\ngood\t1\na\tstray tab\t0\n",
            r"a\.tsv:3: 1 field\(s\) more than the header's 2; a tab inside",
        ),
        (
            b"sentence\tlabel\ngood\t1\nbad\t0\t\n",
            r"a\.tsv:3: 1 field\(s\) more than the header's 2; a tab at the line's end, or a tab inside a text",
        ),
        (
            b"sentence\tlabel\ngood\t1\nno label here\n",
            r"a\.tsv:3: 1 field\(s\) fewer than the header's 2; a missing tab",
        ),
        (b"sentence\tlabel\ngood\t1\nbad\t2\n", r"a\.tsv:3: label '2' is neither one of data\.label_names"),
        (b"sentence\tlabel\ngood\tpos\n", r"a\.tsv:2: label 'pos' is neither one of data\.label_names"),
        (b"sentence\tlabel\ngood\t1\n\t0\n", r"a\.tsv:3: empty 'sentence'"),
        (b"sentence\tlabel\ngood\t1\nbad\t \n", r"a\.tsv:3: empty 'label'; give the example its label"),
        (b"sentence\tlabel\ngood\t1\ncaf\xe9\t1\n", r"a\.tsv:3: not valid UTF-8"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, content, message):
    (tmp_path / "a.tsv").write_bytes(content)
    with pytest.raises(DataError, match=message):
        load_labelled(str(tmp_path / "a.tsv"), CFG)


def test_a_csv_quote_left_open_to_the_end_of_the_file_names_the_line_it_opens_on(tmp_path):
    (tmp_path / "a.csv").write_text('sentence,label\ngood,1\n"left open,1\nbad,0\n')
    with pytest.raises(DataError, match=r"a\.csv:3: a quote in the row that starts here is never closed"):
        load_labelled(str(tmp_path / "a.csv"), CFG)


@pytest.mark.parametrize(
    "content",
    [
        'label,sentence\n1,"quoted start\n0,second row\n1,third row\n',  # read leniently: one example
        'label,sentence\n1,"oops\n0,b\n1,"c"\n0,d',  # read leniently: two of four
    ],
)
def test_a_csv_text_opening_a_quote_it_never_closes_is_refused_at_its_line(tmp_path, content):
    (tmp_path / "a.csv").write_text(content)
    with pytest.raises(DataError, match=r"a\.csv:2: a quote in the row that starts here"):
        load_labelled(str(tmp_path / "a.csv"), CFG)


def test_a_csv_quote_left_open_after_blank_lines_names_the_line_it_opens_on(tmp_path):
    (tmp_path / "a.csv").write_text('label,sentence\n0,good\n\n\n1,"oops\n0,b\n1,"c"\n')
    with pytest.raises(DataError, match=r"a\.csv:5: a quote in the row that starts here closes before other "):
        load_labelled(str(tmp_path / "a.csv"), CFG)


def test_a_csv_header_opening_a_quote_it_never_closes_is_refused_at_line_1(tmp_path):
    (tmp_path / "a.csv").write_text('"label,sentence\n0,good\n')
    with pytest.raises(DataError, match=r"a\.csv:1: a quote in the row that starts here is never closed"):
        load_labelled(str(tmp_path / "a.csv"), CFG)


def test_csv_quotes_inside_doubled_and_over_lines_read_as_written(tmp_path):
    (tmp_path / "a.csv").write_text('label,sentence\n1,he said "hi" there\n0,"two\nlines"\n1,  "a, b"\n0,"a ""b"""\n')
    assert load_labelled(str(tmp_path / "a.csv"), CFG).texts == ['he said "hi" there', "two\nlines", "a, b", 'a "b"']


def test_a_column_named_twice_in_the_header_is_refused(tmp_path):
    (tmp_path / "a.csv").write_text("sentence,label,sentence\ngood,1,bad\n")  # the csv module keeps the last
    with pytest.raises(DataError, match=r"a\.csv:1 \(the header\): column\(s\) \['sentence'\] named more than once"):
        load_labelled(str(tmp_path / "a.csv"), CFG)


def test_a_spreadsheets_empty_columns_without_names_are_read_past(tmp_path):
    (tmp_path / "a.csv").write_text("sentence,label,,\ngood,1,,\nbad,0,,\n")
    assert load_labelled(str(tmp_path / "a.csv"), CFG).labels == [1, 0]


@pytest.mark.parametrize(
    "name, content, separator",
    [
        ("a.csv", "sentence;label\ngood;1\n", "';'"),
        ("a.csv", "sentence\tlabel\ngood\t1\n", "'\\\\t'"),
        ("a.tsv", "sentence,label\ngood,1\n", "','"),
        ("a.csv", "sentence;label\ngood, really;1\n", "';'"),
        ("a.csv", "sentence\tlabel\ngood, really\t1\n", "'\\\\t'"),
        ("a.tsv", "sentence,label\ngood\treally,1\n", "','"),
    ],
    ids=[
        "semicolons",
        "tabs",
        "commas",
        "semicolons, a text holding a comma",
        "tabs, a text holding a comma",
        "commas, a text holding a tab",
    ],
)
def test_a_file_separated_otherwise_than_its_name_says_is_named_so(tmp_path, name, content, separator):
    (tmp_path / name).write_text(content)
    with pytest.raises(
        DataError, match=rf"\(the header\): .*one column holding {separator}: a \.csv file is separated"
    ):
        load_labelled(str(tmp_path / name), CFG)


def test_a_missing_labelled_file_under_the_data_dir_names_the_data_dir_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", str(tmp_path))
    with pytest.raises(
        DataError, match=rf"file not found; set EDGEDISTILL_DATA_DIR \(now {re.escape(str(tmp_path))}\)"
    ):
        load_labelled(str(tmp_path / "nope.tsv"), CFG)


def test_a_data_dir_that_does_not_exist_is_named_so(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(DataError, match=r"data, which does not exist\) to the folder holding the data"):
        load_labelled(str(tmp_path / "data" / "sst2" / "train.tsv"), CFG)


def test_a_missing_file_outside_the_data_dir_names_no_data_dir_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(DataError, match=r"nope\.tsv: file not found; fix the path in the recipe, or in the override"):
        load_labelled(str(tmp_path / "nope.tsv"), CFG)


def test_a_folder_named_for_a_file_is_refused_as_a_folder_naming_its_files(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("words\n")
    with pytest.raises(DataError, match=r"texts: a folder, not a file \(it holds a\.txt\); name the file itself"):
        load_unlabelled([str(tmp_path / "texts")])


def test_a_task_folder_named_for_its_labelled_file_is_refused_as_a_folder(tmp_path):
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "train.tsv").write_text("sentence\tlabel\ngood\t1\n")
    with pytest.raises(DataError, match=r"sst2: a folder, not a file \(it holds train\.tsv\)"):
        load_labelled(str(tmp_path / "sst2"), CFG)


def test_a_missing_labelled_file_of_no_known_format_is_named_as_not_found(tmp_path):
    with pytest.raises(DataError, match=r"train: file not found"):
        load_labelled(str(tmp_path / "train"), CFG)


def test_a_labelled_file_of_an_unknown_format_is_refused(tmp_path):
    (tmp_path / "a.parquet").write_text("x")
    with pytest.raises(DataError, match=r"a\.parquet: unsupported format '\.parquet'"):
        load_labelled(str(tmp_path / "a.parquet"), CFG)


def test_a_jsonl_line_that_is_not_json_names_its_line(tmp_path):
    (tmp_path / "b.jsonl").write_text('{"sentence": 1\n')
    with pytest.raises(DataError, match=r"b\.jsonl:1: not valid JSON"):
        load_labelled(str(tmp_path / "b.jsonl"), CFG)


def test_a_jsonl_key_named_twice_is_refused(tmp_path):
    (tmp_path / "b.jsonl").write_text(
        '{"sentence": "good", "label": 1}\n{"sentence": "good", "label": 1, "sentence": ""}\n'
    )
    with pytest.raises(DataError, match=r"b\.jsonl:2: key\(s\) \['sentence'\] named more than once in an object"):
        load_labelled(str(tmp_path / "b.jsonl"), CFG)


def test_a_file_not_found_names_the_file_of_a_close_name_beside_it(tmp_path):
    (tmp_path / "questions_train.csv").write_text("sentence,label\ngood,1\n")
    with pytest.raises(DataError, match=rf"file not found; {re.escape(str(tmp_path))} has questions_train\.csv; "):
        load_labelled(str(tmp_path / "questions_trian.csv"), CFG)


def test_a_file_not_found_names_no_file_of_another_name_beside_it(tmp_path):
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\ngood\t1\n")
    with pytest.raises(DataError, match=r"questions\.tsv: file not found; fix the path"):
        load_labelled(str(tmp_path / "questions.tsv"), CFG)


def test_a_relative_labelled_path_not_found_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        DataError,
        match=rf"data/train\.tsv: file not found, looked for from the working directory {re.escape(str(tmp_path))}",
    ):
        load_labelled("data/train.tsv", CFG)


def test_a_relative_unlabelled_path_not_found_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        DataError, match=rf"u\.txt: file not found, looked for from the working directory {re.escape(str(tmp_path))}"
    ):
        load_unlabelled(["u.txt"])


@pytest.mark.parametrize("name", ["a.tsv.gz", "a.jsonl.GZ"])
def test_gzipped_labelled_files_are_read_decompressed(tmp_path, name):
    text = "sentence\tlabel\ngood\t1\n" if ".tsv" in name else '{"sentence": "good", "label": 1}\n'
    (tmp_path / name).write_bytes(gzip.compress(text.encode()))
    assert load_labelled(str(tmp_path / name), CFG).texts == ["good"]


def test_a_labelled_gz_file_of_no_known_format_is_refused_before_reading(tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(b"not even gzip")
    with pytest.raises(DataError, match=r"a\.txt\.gz: unsupported format '\.txt'"):
        load_labelled(str(tmp_path / "a.txt.gz"), CFG)


def test_a_csv_saved_with_a_byte_order_mark_finds_its_first_column(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"\xef\xbb\xbfsentence,label\r\ngood,1\r\n")
    assert load_labelled(str(tmp_path / "a.csv"), CFG).texts == ["good"]


def test_a_jsonl_file_with_a_byte_order_mark_reads_its_first_line(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'\xef\xbb\xbf{"sentence": "good", "label": 1}\n')
    assert load_labelled(str(tmp_path / "a.jsonl"), CFG).labels == [1]


def test_unlabelled_text_with_a_byte_order_mark_leaves_it_out(tmp_path):
    (tmp_path / "u.txt").write_bytes(b"\xef\xbb\xbffirst line\nsecond\n")
    assert load_unlabelled([str(tmp_path / "u.txt")]) == ["first line", "second"]


def test_unlabelled_lines_that_show_nothing_are_skipped_as_blank_lines_are(tmp_path):
    (tmp_path / "u.txt").write_text("first line\n\u200b\n\u200b\u2060 \u200b\nsecond\n", encoding="utf-8")
    assert load_unlabelled([str(tmp_path / "u.txt")]) == ["first line", "second"]


def test_an_unlabelled_file_whose_lines_show_nothing_has_no_text(tmp_path):
    (tmp_path / "u.txt").write_text("\u200b\n\u00ad\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"u\.txt: no text \(the file is empty, or its lines show nothing\)"):
        load_unlabelled([str(tmp_path / "u.txt")])


def test_unlabelled_text_read_with_a_name_prints_its_progress_in_status_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(settings.PROGRESS_VAR, "lines")
    monkeypatch.setenv(settings.PROGRESS_INTERVAL_VAR, "0.000001")
    (tmp_path / "u.txt").write_text("a line\n" * 3000)
    load_unlabelled([str(tmp_path / "u.txt")], desc="read")
    assert "[read] 3,000/3,000 line (100%)" in capsys.readouterr().err


def test_a_stray_byte_that_is_not_utf8_names_how_to_drop_it(tmp_path):
    (tmp_path / "u.txt").write_bytes("a good film\nan awful\xa0film\n".encode() + b"broken \xff byte\n")
    with pytest.raises(DataError, match=r"u\.txt:3: not valid UTF-8.*iconv -f utf-8 -t utf-8 -c"):
        load_unlabelled([str(tmp_path / "u.txt")])


def test_a_utf16_labelled_file_is_named_as_such(tmp_path):
    (tmp_path / "a.tsv").write_text("sentence\tlabel\ngood\t1\n", encoding="utf-16")
    with pytest.raises(DataError, match=r"a\.tsv:1: UTF-16 text \(it starts with a UTF-16 byte-order mark"):
        load_labelled(str(tmp_path / "a.tsv"), CFG)


def test_a_utf16_labelled_file_without_a_byte_order_mark_is_named_as_such(tmp_path):
    (tmp_path / "a.tsv").write_text("sentence\tlabel\ngood\t1\n", encoding="utf-16-le")
    with pytest.raises(DataError, match=r"a\.tsv:1: UTF-16 text \(every other byte of its first line is NUL"):
        load_labelled(str(tmp_path / "a.tsv"), CFG)


def test_a_utf16_unlabelled_file_is_named_as_such(tmp_path):
    (tmp_path / "u.txt").write_text("first line\n", encoding="utf-16")
    with pytest.raises(DataError, match=r"u\.txt:1: UTF-16 text"):
        load_unlabelled([str(tmp_path / "u.txt")])


def test_gzip_data_in_a_labelled_file_without_gz_is_told_to_take_the_name(tmp_path):
    (tmp_path / "a.tsv").write_bytes(gzip.compress(b"sentence\tlabel\ngood\t1\n"))
    with pytest.raises(DataError, match=r"a\.tsv:1: gzip-compressed data .* name it a\.tsv\.gz to read it so"):
        load_labelled(str(tmp_path / "a.tsv"), CFG)


def test_gzip_data_compressed_twice_is_told_to_be_gunzipped_once(tmp_path):
    (tmp_path / "u.txt.gz").write_bytes(gzip.compress(gzip.compress(b"first line\n")))
    with pytest.raises(DataError, match=r"u\.txt\.gz:1: gzip-compressed data .* compressed twice: gunzip it once"):
        load_unlabelled([str(tmp_path / "u.txt.gz")])


def test_a_hub_dataset_that_cannot_be_loaded_names_the_source():
    with pytest.raises(DataError, match=r"hub:no-such-org/no-such-set:train: cannot load it from the Hub"):
        load_labelled("hub:no-such-org/no-such-set:train", CFG)


def test_a_labelled_hub_source_with_a_column_is_refused_before_loading():
    with pytest.raises(DataError, match=r"hub:glue/sst2:train:sentence: a labelled Hub source is .*data\.text_column"):
        load_labelled("hub:glue/sst2:train:sentence", CFG)


def test_a_csv_with_a_space_after_each_comma_reads_its_columns_and_quotes(tmp_path):
    (tmp_path / "a.csv").write_text('sentence, label\n"good, really", 1\nbad, 0\n')
    data = load_labelled(str(tmp_path / "a.csv"), CFG)
    assert data.texts == ["good, really", "bad"]
    assert data.labels == [1, 0]


def test_a_quoted_csv_cell_over_two_lines_keeps_them_apart(tmp_path):
    (tmp_path / "a.csv").write_text('sentence,label\n"line one\nline two",1\n')
    assert load_labelled(str(tmp_path / "a.csv"), CFG).texts == ["line one\nline two"]


@pytest.mark.parametrize("name, row", [("a.csv", '"{text}",1'), ("a.tsv", "{text}\t1")])
def test_a_text_longer_than_the_csv_modules_field_limit_loads_whole(tmp_path, name, row):
    text = "a long review " * 20_000  # 280k characters: the csv module refuses fields over 128k by default
    (tmp_path / name).write_text(
        ("sentence,label\n" if name == "a.csv" else "sentence\tlabel\n") + row.format(text=text)
    )
    assert load_labelled(str(tmp_path / name), CFG).texts == [text.strip()]


def test_a_jsonl_text_holding_a_unicode_line_separator_stays_one_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"sentence": "first\u2028second", "label": 1}\n', encoding="utf-8")
    assert load_labelled(str(tmp_path / "a.jsonl"), CFG).texts == ["first\u2028second"]


def test_a_jsonl_line_holding_a_lone_cr_as_json_whitespace_is_one_object(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"sentence": "good",\r"label": 1}\n{"sentence": "bad", "label": 0}\n')
    assert load_labelled(str(tmp_path / "a.jsonl"), CFG).labels == [1, 0]


def test_a_jsonl_line_after_a_lone_cr_is_named_by_its_lf_count(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"sentence": "good",\r"label": 1}\n{"sentence": "bad" "label": 0}\n')
    with pytest.raises(DataError, match=r"a\.jsonl:2: not valid JSON"):
        load_labelled(str(tmp_path / "a.jsonl"), CFG)


def test_a_jsonl_file_of_lines_ended_by_cr_alone_is_refused_naming_the_line_ends(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"sentence": "good", "label": 1}\r{"sentence": "bad", "label": 0}\r')
    with pytest.raises(DataError, match=r"a\.jsonl:1: not valid JSON .* its lines end in CR alone, where JSON Lines"):
        load_labelled(str(tmp_path / "a.jsonl"), CFG)


def test_a_tsv_text_holding_a_next_line_character_stays_one_row(tmp_path):
    (tmp_path / "a.tsv").write_text("sentence\tlabel\nfirst\x85second\t1\n", encoding="utf-8")
    assert load_labelled(str(tmp_path / "a.tsv"), CFG).labels == [1]


def two_unlabelled_files(tmp_path) -> list[str]:
    """Two text files of two lines each, the first with a blank line and spaces around a line."""
    (tmp_path / "u1.txt").write_text("one\n\n two \n")
    (tmp_path / "u2.txt").write_text("three\nfour\n")
    return [str(tmp_path / "u1.txt"), str(tmp_path / "u2.txt")]


def test_unlabelled_files_give_their_lines_in_order_stripped_and_without_blank_ones(tmp_path):
    assert load_unlabelled(two_unlabelled_files(tmp_path)) == ["one", "two", "three", "four"]


def test_unlabelled_lines_stop_at_max_lines_across_files(tmp_path):
    assert load_unlabelled(two_unlabelled_files(tmp_path), max_lines=3) == ["one", "two", "three"]


def test_unlabelled_text_of_blank_lines_only_is_refused_as_empty(tmp_path):
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError, match=r"empty\.txt: no text \(the file is empty, or its lines show nothing\)"):
        load_unlabelled([str(tmp_path / "empty.txt")])


def test_unlabelled_lines_ended_by_a_carriage_return_alone_are_lines(tmp_path):
    (tmp_path / "mac.txt").write_bytes(b"one good film\rtwo\r\rthree\r\nfour\n")
    assert load_unlabelled([str(tmp_path / "mac.txt")]) == ["one good film", "two", "three", "four"]


def test_unlabelled_lines_ended_by_a_carriage_return_alone_count_towards_the_limit(tmp_path):
    (tmp_path / "mac.txt").write_bytes(b"one\rtwo\rthree\r")
    assert load_unlabelled([str(tmp_path / "mac.txt")], max_lines=2) == ["one", "two"]


def test_labelled_rows_are_read_as_they_are_taken(tmp_path):
    rows = "good\t1\n" * 10_000  # past the first blocks a reader decodes at once
    (tmp_path / "a.tsv").write_bytes(b"sentence\tlabel\n" + rows.encode() + b"caf\xe9\t1\n")
    assert next(_rows(tmp_path / "a.tsv")) == (2, {"sentence": "good", "label": "1"}, 1)


def test_unlabelled_lines_decodes_only_the_lines_taken(tmp_path):
    (tmp_path / "u.txt").write_bytes(b"first\nsecond\n\xff\n")  # line 3 is not UTF-8: reading it would raise
    assert next(unlabelled_lines([str(tmp_path / "u.txt")])) == "first"


def test_gzipped_unlabelled_text_is_read_decompressed(tmp_path):
    with gzip.open(tmp_path / "u.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("\ufefffirst line\n\nsecond\n")
    assert load_unlabelled([str(tmp_path / "u.txt.gz")]) == ["first line", "second"]


def test_a_gz_file_that_is_not_gzip_data_names_the_file(tmp_path):
    (tmp_path / "u.txt.gz").write_text("plain text\n")
    with pytest.raises(DataError, match=r"u\.txt\.gz:1: cannot decompress it"):
        load_unlabelled([str(tmp_path / "u.txt.gz")])


def test_shared_sst2_splits(data_dir):
    cfg = CFG.model_copy(
        update={"train": str(data_dir / "sst2/train.tsv"), "dev": str(data_dir / "sst2/dev.tsv"), "train_limit": 100}
    )
    train, dev = load_splits(cfg)
    assert len(train) == 100
    assert len(dev) == 872
    assert set(dev.labels) == {0, 1}


def limited_splits(tmp_path):
    """Splits cut to 2 train and 1 dev example, of files whose later lines hold a label no recipe knows."""
    (tmp_path / "s.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\nfine\t1\nodd\tneutral\n")
    path = str(tmp_path / "s.tsv")
    return load_splits(CFG.model_copy(update={"train": path, "dev": path, "train_limit": 2, "dev_limit": 1}))


def test_train_limit_keeps_the_first_examples_reading_no_further(tmp_path):
    assert limited_splits(tmp_path)[0].texts == ["good", "bad"]


def test_dev_limit_keeps_the_first_examples_reading_no_further(tmp_path):
    assert limited_splits(tmp_path)[1].texts == ["good"]


def test_the_dev_split_is_read_without_the_train_split(tmp_path):
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    cfg = CFG.model_copy(update={"train": str(tmp_path / "absent.tsv"), "dev": str(tmp_path / "dev.tsv")})
    assert load_dev(cfg).texts == ["good", "bad"]


def test_the_dev_split_is_cut_to_dev_limit(tmp_path):
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    assert len(load_dev(CFG.model_copy(update={"dev": str(tmp_path / "dev.tsv"), "dev_limit": 1}))) == 1


def test_a_dev_split_error_names_data_dev(tmp_path):
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\ngood\tmaybe\n")
    with pytest.raises(DataError, match=r"^data\.dev: .*dev\.tsv:2: label 'maybe'"):
        load_dev(CFG.model_copy(update={"dev": str(tmp_path / "dev.tsv")}))


@pytest.mark.parametrize(
    "name, content",
    [
        ("s.tsv", "sentence\tlabel\ngood\t1\nbad\t0\nsplit\tby a tab\t1\n"),
        ("s.jsonl", '{"sentence": "good", "label": "1"}\n{"sentence": "bad", "label": "0"}\n{"sentence": \n'),
    ],
    ids=["tsv", "jsonl"],
)
def test_a_limit_reads_not_even_the_row_after_it(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    path = str(tmp_path / name)
    train, _ = load_splits(CFG.model_copy(update={"train": path, "dev": path, "train_limit": 2, "dev_limit": 2}))
    assert train.texts == ["good", "bad"]


@pytest.mark.parametrize(
    "name, content",
    [
        ("s.tsv", b"sentence\tlabel\ngood\t1\nbad \xff\t0\n"),
        ("s.jsonl", b'{"sentence": "good", "label": 1}\n{"sentence": "bad \xff", "label": 0}\n'),
        ("s.jsonl", b'{"sentence": "good",\r"label": 1}\n{"sentence": "bad \xff", "label": 0}\n'),
    ],
    ids=["tsv", "jsonl", "jsonl, a CR within the line"],
)
def test_a_limit_decodes_not_even_the_line_after_it(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    assert load_labelled(str(tmp_path / name), CFG, limit=1).texts == ["good"]


def write_labels(tmp_path, *cells, name="l.tsv") -> str:
    path = tmp_path / name
    path.write_text("question\tlabel\n" + "".join(f"what is it ?\t{cell}\n" for cell in cells))
    return str(path)


def test_label_names_map_to_their_index(tmp_path):
    assert load_labelled(write_labels(tmp_path, "HUM", "ABBR", "NUM"), TREC).labels == [3, 0, 5]


@pytest.mark.parametrize(("cell", "name"), [("ne\u0301gatif", "n\u00e9gatif"), ("n\u00e9gatif", "ne\u0301gatif")])
def test_a_label_with_its_accent_composed_otherwise_than_its_name_is_that_name(tmp_path, cell, name):
    (tmp_path / "l.tsv").write_text(f"sentence\tlabel\nmauvais film\t{cell}\n", encoding="utf-8")
    cfg = DataConfig(train="x", dev="x", label_names=[name, "positif"])
    assert load_labelled(str(tmp_path / "l.tsv"), cfg).labels == [0]


def test_integer_labels_in_range_are_indices(tmp_path):
    assert load_labelled(write_labels(tmp_path, "3", "0", "5"), TREC).labels == [3, 0, 5]


def test_names_and_indices_mix_in_one_file(tmp_path):
    assert load_labelled(write_labels(tmp_path, "HUM", "1"), TREC).labels == [3, 1]


def test_a_name_that_is_a_number_is_read_as_the_name(tmp_path):
    """Star ratings named 1..5: the cell `1` is the label named `1` (index 0), not index 1."""
    stars = DataConfig(train="x", dev="x", text_column="question", label_names=["1", "2", "3", "4", "5"])
    assert load_labelled(write_labels(tmp_path, "1", "5"), stars).labels == [0, 4]


def test_an_index_among_labels_named_by_other_numbers_is_refused(tmp_path):
    """Star ratings named 1..5 in a file of indices 0..4: `0` (an index) and `1` (a name) would both be label 0."""
    stars = DataConfig(train="x", dev="x", text_column="question", label_names=["1", "2", "3", "4", "5"])
    with pytest.raises(DataError, match=r"l\.tsv:3: label '0' is no name .* '1' names label 0, so a number is read"):
        load_labelled(write_labels(tmp_path, "1", "0"), stars)


@pytest.mark.parametrize("names", [["-1", "1"], ["-1", "+1"]])
def test_an_index_among_labels_named_by_signed_numbers_is_refused(tmp_path, names):
    """Sentiment named -1 and 1 in a file that also holds 0 (a neutral label left out): 0 would be label -1."""
    signs = DataConfig(train="x", dev="x", text_column="question", label_names=names)
    with pytest.raises(DataError, match=r"l\.tsv:3: label '0' is no name .* '-1' names label 0, so a number is read"):
        load_labelled(write_labels(tmp_path, "-1", "0"), signs)


def test_labels_named_by_signed_numbers_are_read_as_the_names(tmp_path):
    signs = DataConfig(train="x", dev="x", text_column="question", label_names=["-1", "0", "1"])
    assert load_labelled(write_labels(tmp_path, "1", "-1"), signs).labels == [2, 0]


def test_jsonl_labels_by_name_and_by_integer(tmp_path):
    (tmp_path / "l.jsonl").write_text('{"question": "who ?", "label": "HUM"}\n{"question": "why ?", "label": 1}\n')
    assert load_labelled(str(tmp_path / "l.jsonl"), TREC).labels == [3, 1]


@pytest.mark.parametrize(("label", "kind"), [("true", "bool"), ("1.0", "float")])
def test_a_jsonl_label_of_another_type_is_refused_naming_its_type(tmp_path, label, kind):
    (tmp_path / "l.jsonl").write_text(f'{{"question": "ok", "label": {label}}}\n')
    names = DataConfig(train="x", dev="x", text_column="question", label_names=["False", "True"])
    with pytest.raises(DataError, match=rf"l\.jsonl:1: label \S+ \(a {kind}, not text or an integer\) is neither"):
        load_labelled(str(tmp_path / "l.jsonl"), names)


def test_a_jsonl_integer_that_is_a_label_name_is_read_as_the_name(tmp_path):
    """The same star ratings as JSON integers: `1` is the label named `1`, as the TSV cell `1` is."""
    (tmp_path / "l.jsonl").write_text('{"question": "ok", "label": 1}\n{"question": "top", "label": 5}\n')
    stars = DataConfig(train="x", dev="x", text_column="question", label_names=["1", "2", "3", "4", "5"])
    assert load_labelled(str(tmp_path / "l.jsonl"), stars).labels == [0, 4]


def test_an_integer_cell_is_an_index_even_where_a_name_is_its_digits():
    """A Hub class label reaches the label reader as an integer: the index of the dataset's own label."""
    assert _label_index(1, {"1": 0, "2": 1}, "hub:x:train:1") == 1


def test_a_jsonl_line_without_a_key_the_first_line_has_names_its_line(tmp_path):
    (tmp_path / "l.jsonl").write_text('{"question": "who ?", "label": "HUM"}\n{"question": "why ?"}\n')
    with pytest.raises(DataError, match=r"l\.jsonl:2: missing \['label'\] \(found \['question'\]\), which line 1 has"):
        load_labelled(str(tmp_path / "l.jsonl"), TREC)


@pytest.mark.parametrize("value", ['["good", "film"]', '{"en": "good"}', "true", "5"])
def test_a_jsonl_text_that_is_not_a_string_is_refused_naming_its_line(tmp_path, value):
    (tmp_path / "a.jsonl").write_text(f'{{"sentence": "fine", "label": 1}}\n{{"sentence": {value}, "label": 1}}\n')
    with pytest.raises(DataError, match=r"a\.jsonl:2: 'sentence' is a JSON \w+, not a string"):
        load_labelled(str(tmp_path / "a.jsonl"), CFG)


def test_a_jsonl_text_with_a_lone_surrogate_escape_is_refused_naming_its_line(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"sentence": "fine", "label": 1}\n{"sentence": "\\ud83d great", "label": 1}\n')
    with pytest.raises(DataError, match=r"a\.jsonl:2: 'sentence' holds a lone surrogate \('\\ud83d' at character 0\)"):
        load_labelled(str(tmp_path / "a.jsonl"), CFG)


def test_a_jsonl_text_with_an_escaped_surrogate_pair_loads_as_its_character(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"sentence": "\\ud83c\\udfac great", "label": 1}\n')
    assert load_labelled(str(tmp_path / "a.jsonl"), CFG).texts == ["\U0001f3ac great"]


@pytest.mark.parametrize("text", ["\u200b\u200d", "\x00\x7f", "\ufeff\u2060", "\u202e \u200f"])
def test_a_text_of_invisible_characters_only_is_empty(tmp_path, text):
    (tmp_path / "a.jsonl").write_text(
        f'{{"sentence": "fine", "label": 1}}\n{{"sentence": {json.dumps(text)}, "label": 1}}\n'
    )
    with pytest.raises(
        DataError, match=r"a\.jsonl:2: empty 'sentence' \(only control, zero-width, space or replacement characters\)"
    ):
        load_labelled(str(tmp_path / "a.jsonl"), CFG)


def test_a_jsonl_line_that_is_not_an_object_names_its_line(tmp_path):
    (tmp_path / "l.jsonl").write_text('{"question": "who ?", "label": "HUM"}\n["why ?", "DESC"]\n')
    with pytest.raises(DataError, match=r"l\.jsonl:2: a JSON list, not an object"):
        load_labelled(str(tmp_path / "l.jsonl"), TREC)


def test_shared_trec_labels_by_name(data_dir):
    dev = load_labelled(str(data_dir / "trec/dev.tsv"), TREC)
    assert sorted(set(dev.labels)) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("cell", ["hum", "6", "-2", "1.0", "HUMAN"])
def test_unknown_label_names_file_line_and_value(tmp_path, cell):
    with pytest.raises(DataError, match=rf"l\.tsv:3: label '{re.escape(cell)}' is neither one of data\.label_names"):
        load_labelled(write_labels(tmp_path, "HUM", cell), TREC)


def test_a_bad_label_after_a_blank_line_names_its_own_line(tmp_path):
    path = tmp_path / "l.tsv"
    path.write_text("question\tlabel\nwho ?\tHUM\n\nwhere ?\tPLACE\n")  # the bad label is on line 4
    with pytest.raises(DataError, match=r"l\.tsv:4: label 'PLACE'"):
        load_labelled(str(path), TREC)


@pytest.mark.parametrize("row", ["is it?\t\tyes", "is it?\t  \tyes"])
def test_an_empty_sentence_b_is_refused_naming_the_line(tmp_path, row):
    (tmp_path / "p.tsv").write_text(f"q\tp\ty\nfine?\tfine\tno\n{row}\n")
    cfg = DataConfig(
        train="x", dev="x", text_column="q", text_pair_column="p", label_column="y", label_names=["no", "yes"]
    )
    with pytest.raises(DataError, match=r"p\.tsv:3: empty 'p'; every text needs its pair"):
        load_labelled(str(tmp_path / "p.tsv"), cfg)


def test_unknown_label_lists_the_known_names(tmp_path):
    with pytest.raises(DataError, match=re.escape("['ABBR', 'DESC', 'ENTY', 'HUM', 'LOC', 'NUM'] nor an index 0..5")):
        load_labelled(write_labels(tmp_path, "what"), TREC)


def test_a_label_unknown_but_for_its_case_names_the_label_meant(tmp_path):
    with pytest.raises(DataError, match=re.escape("nor an index 0..5 (did you mean 'HUM'? a name matches as written")):
        load_labelled(write_labels(tmp_path, "hum"), TREC)


def test_a_label_unknown_but_for_a_typo_names_the_label_meant(tmp_path):
    with pytest.raises(DataError, match=re.escape("(did you mean 'DESC'?")):
        load_labelled(write_labels(tmp_path, "DESCR"), TREC)


def test_a_label_two_letters_from_a_name_names_the_label_meant(tmp_path):
    with pytest.raises(DataError, match=re.escape("(did you mean 'ENTY'?")):
        load_labelled(write_labels(tmp_path, "ENTI"), TREC)


def test_a_label_missing_from_the_names_is_not_taken_for_a_short_name_one_letter_away(tmp_path):
    trec_without_num = TREC.model_copy(update={"label_names": ["ABBR", "DESC", "ENTY", "HUM", "LOC"]})
    with pytest.raises(DataError) as refused:
        load_labelled(write_labels(tmp_path, "NUM"), trec_without_num)
    assert "did you mean" not in str(refused.value)


def test_an_unknown_label_is_told_to_be_added_to_the_names_if_it_is_one(tmp_path):
    with pytest.raises(DataError, match="if it is a label of the task, add it to data.label_names in the recipe"):
        load_labelled(write_labels(tmp_path, "what"), TREC)


@pytest.fixture
def misspelt_column(tmp_path) -> str:
    """The error for a recipe whose text column is misspelt: `qeury` for a file of columns `query` and `qtype`."""
    (tmp_path / "q.tsv").write_text("query\tqtype\nwhat is it?\tdesc\n")
    cfg = DataConfig(train="x", dev="x", text_column="qeury", label_column="qtype", label_names=["desc", "hum"])
    with pytest.raises(DataError) as caught:
        load_labelled(str(tmp_path / "q.tsv"), cfg)
    return str(caught.value)


def test_a_misspelt_column_is_answered_with_the_column_meant(misspelt_column):
    assert "(did you mean 'query' for 'qeury'?)" in misspelt_column


def test_the_columns_found_are_listed_in_the_files_order(misspelt_column):
    assert "found ['query', 'qtype']" in misspelt_column


def test_a_label_like_no_name_names_none(tmp_path):
    with pytest.raises(DataError, match=re.escape("nor an index 0..5; if it is a label of the task")):
        load_labelled(write_labels(tmp_path, "what"), TREC)


@pytest.mark.parametrize("cell", ["true", "6", "1.5"])
def test_jsonl_label_that_is_neither_name_nor_index_is_refused(tmp_path, cell):
    (tmp_path / "l.jsonl").write_text(f'{{"question": "who ?", "label": {cell}}}\n')
    with pytest.raises(DataError, match=r"l\.jsonl:1: label .* is neither one of data\.label_names"):
        load_labelled(str(tmp_path / "l.jsonl"), TREC)


@pytest.mark.parametrize("cell", ["null", '""'])
def test_an_empty_jsonl_label_is_named_empty(tmp_path, cell):
    (tmp_path / "l.jsonl").write_text(f'{{"question": "who ?", "label": {cell}}}\n')
    with pytest.raises(DataError, match=r"l\.jsonl:1: empty 'label'"):
        load_labelled(str(tmp_path / "l.jsonl"), TREC)


def test_a_pair_files_missing_column_names_the_pair_setting(tmp_path):
    (tmp_path / "p.tsv").write_text("sentence\tlabel\ngood\t1\n")
    pairs = CFG.model_copy(update={"text_pair_column": "second"})
    with pytest.raises(DataError, match=r"data\.text_pair_column"):
        load_labelled(str(tmp_path / "p.tsv"), pairs)


@pytest.mark.parametrize("suffix", ["tsv", "csv"])
@pytest.mark.parametrize("label", ["positive", " positive ", "1"])
def test_a_file_without_a_header_is_refused_saying_to_add_one(tmp_path, suffix, label):
    separator = "\t" if suffix == "tsv" else ","
    (tmp_path / f"a.{suffix}").write_text(f"a gripping film{separator}{label}\nflat{separator}negative\n")
    with pytest.raises(DataError, match=r"a\.\w+:1: .*looks like an example; add a header line naming the columns"):
        load_labelled(str(tmp_path / f"a.{suffix}"), CFG)


@pytest.mark.parametrize("header", ["sentence\tpositive", "text\t2"])
def test_a_header_without_a_label_or_beside_a_recipe_column_is_not_taken_for_an_example(tmp_path, header):
    (tmp_path / "a.tsv").write_text(f"{header}\ngood\t1\n")
    with pytest.raises(DataError, match=r"a\.tsv:1 \(the header\): missing column\(s\) .*\. Set data\.text_column"):
        load_labelled(str(tmp_path / "a.tsv"), CFG)


def read_single(path: Path, content: str, text_column: str = "sentence1"):
    """`path`, holding `content`, loaded as single texts of `text_column` (no data.text_pair_column set)."""
    path.write_text(content)
    return load_labelled(str(path), CFG.model_copy(update={"text_column": text_column}))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("sentence1", "sentence2"),
        ("#1 String", "#2 String"),
        ("text_a", "text_b"),
        ("premise", "hypothesis"),
        ("question", "passage"),
        ("text", "text_pair"),
        ("句子1", "句子2"),
    ],
)
def test_a_pair_file_read_without_its_pair_column_names_the_pair_setting(tmp_path, first, second):
    message = re.escape(f'set data.text_pair_column: "{second}", or data.text_pair_column: null')
    with pytest.raises(DataError, match=message):
        read_single(tmp_path / "p.tsv", f"{first}\t{second}\tlabel\ngood\tfine\t1\n", first)


@pytest.mark.parametrize(
    ("first", "second"),
    [("Premise", "Hypothesis"), ("Question", "Passage"), ("Text", "Text_pair"), ("text", "TEXT_PAIR")],
)
def test_a_pair_file_whose_header_differs_in_case_names_its_second_column(tmp_path, first, second):
    message = re.escape(f'set data.text_pair_column: "{second}", or data.text_pair_column: null')
    with pytest.raises(DataError, match=message):
        read_single(tmp_path / "p.tsv", f"{first}\t{second}\tlabel\ngood\tfine\t1\n", first)


def test_a_text_column_is_not_its_own_second_whatever_its_case(tmp_path):
    assert read_single(tmp_path / "p.tsv", "Text\tlabel\ngood\t1\n", "Text").texts == ["good"]


def test_a_pair_file_read_without_its_pair_column_is_named_at_its_header(tmp_path):
    with pytest.raises(DataError, match=r"p\.tsv:2 \(the header\): column 'sentence2'"):
        read_single(tmp_path / "p.tsv", "\nsentence1\tsentence2\tlabel\ngood\tfine\t1\n")


def test_a_pair_file_read_without_its_pair_column_is_named_at_its_header_after_rows_of_empty_cells(tmp_path):
    with pytest.raises(DataError, match=r"p\.csv:3 \(the header\): column 'sentence2'"):
        read_single(tmp_path / "p.csv", ',,\n"  ",,\nsentence1,sentence2,label\ngood,fine,1\n')


def test_a_jsonl_pair_read_without_its_pair_column_is_named_at_its_first_line(tmp_path):
    with pytest.raises(DataError, match=r"p\.jsonl:1: column 'sentence2'"):
        read_single(tmp_path / "p.jsonl", '{"sentence1": "good", "sentence2": "fine", "label": 1}\n')


def test_a_pair_column_set_to_null_reads_the_first_text_alone(tmp_path):
    (tmp_path / "p.tsv").write_text("sentence1\tsentence2\tlabel\ngood\tfine\t1\n")
    alone = DataConfig(train="x", dev="x", text_column="sentence1", text_pair_column=None, label_names=["n", "p"])
    assert load_labelled(str(tmp_path / "p.tsv"), alone).texts == ["good"]


@pytest.mark.parametrize("columns", ["sentence\tsentence2", "question\ttitle", "text_ab\ttext_bb"])
def test_columns_that_are_no_second_text_are_read_past(tmp_path, columns):
    (tmp_path / "p.tsv").write_text(f"{columns}\tlabel\ngood\tfine\t1\n")
    single = CFG.model_copy(update={"text_column": columns.split("\t")[0]})
    assert load_labelled(str(tmp_path / "p.tsv"), single).texts == ["good"]


def test_label_names_no_example_carries_are_found():
    assert Examples(["a", "b"], None, [0, 2], "here").absent(["x", "y", "z"]) == ["y"]


def test_absent_labels_of_unlabelled_examples_are_refused():
    with pytest.raises(ValueError, match="absent needs labelled examples; transfer.txt has no labels"):
        Examples(["a", "b"], None, None, "transfer.txt").absent(["x", "y"])


def test_unlabelled_pairs_are_not_turned_both_ways():
    with pytest.raises(ValueError, match="both_ways needs labelled examples; transfer.txt has no labels"):
        Examples(["a"], ["b"], None, "transfer.txt").both_ways()


def test_examples_shared_with_another_split_are_counted_text_and_pair():
    train = Examples(["a", "b", "c"], ["x", "y", "z"], [0, 1, 0], "train")
    assert Examples(["a", "b", "q"], ["x", "other", "z"], [0, 0, 0], "dev").shared_with(train) == 1
    assert Examples(["c", "c"], None, [1, 1], "dev").shared_with(Examples(["c"], None, [0], "train")) == 2


def test_batches_cover_every_example_once_in_order():
    examples = Examples(list("abcde"), None, [0, 1, 0, 1, 0], "here")
    assert [(b.texts, b.labels) for b in examples.batches(2)] == [
        (["a", "b"], [0, 1]),
        (["c", "d"], [0, 1]),
        (["e"], [0]),
    ]


def test_a_missing_split_is_named_by_its_setting(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\ngood\t1\n")
    cfg = DataConfig(train=str(train), dev=str(tmp_path / "dev.tsv"), label_names=["negative", "positive"])
    with pytest.raises(DataError, match=r"^data\.dev: .*dev\.tsv: file not found"):
        load_splits(cfg)


def test_a_malformed_test_split_is_named_by_its_setting(tmp_path):
    test = tmp_path / "test.tsv"
    test.write_text("sentence\tlabel\ngood\tmaybe\n")
    cfg = DataConfig(train="x", dev="x", test=str(test), label_names=["negative", "positive"])
    with pytest.raises(DataError, match=r"^data\.test: "):
        load_test(cfg)


def unlabelled_test_split(tmp_path) -> str:
    """The error of a test split laid out as GLUE SST-2's `test.tsv`: an index and a sentence, no label."""
    test = tmp_path / "test.tsv"
    test.write_text("index\tsentence\n0\tit 's a charming journey .\n")
    with pytest.raises(DataError) as refused:
        load_test(CFG.model_copy(update={"test": str(test)}))
    return str(refused.value)


def test_a_test_split_without_labels_is_told_it_holds_none(tmp_path):
    assert "['index', 'sentence']: the split holds no labels" in unlabelled_test_split(tmp_path)


def test_a_test_split_without_labels_is_told_to_use_a_labelled_one(tmp_path):
    assert "data.test take labelled examples only: a labelled split" in unlabelled_test_split(tmp_path)


def test_a_misspelt_label_column_is_not_taken_for_a_split_without_labels(tmp_path):
    (tmp_path / "a.tsv").write_text("sentence\tlabels\ngood\t1\n")
    with pytest.raises(DataError, match=re.escape("(did you mean 'labels' for 'label'?)")):
        load_labelled(str(tmp_path / "a.tsv"), CFG)


@pytest.fixture
def hub_texts(monkeypatch):
    """A Hub source reading an in-memory dataset with a text column holding a missing value and a label column."""
    import datasets
    from edgedistill.common import data

    split = datasets.Dataset.from_dict({"text": ["a first line", None, " another "], "label": [0, 1, 0]})
    monkeypatch.setattr(data, "_from_hub", lambda spec: (split, (spec.split(":")[3:] or [None])[0]))
    return "hub:texts/x:train"


def test_a_hub_text_columns_missing_values_are_skipped(hub_texts):
    assert load_unlabelled([hub_texts]) == ["a first line", "another"]


def test_a_hub_column_the_dataset_lacks_is_refused_naming_its_columns(hub_texts):
    with pytest.raises(DataError, match=r"train:txt: no column 'txt'; its columns are \['text', 'label'\]"):
        load_unlabelled([f"{hub_texts}:txt"])


def test_a_hub_column_that_holds_no_text_is_refused(hub_texts):
    with pytest.raises(DataError, match=r"train:label: column 'label' holds int64, not text; its columns are"):
        load_unlabelled([f"{hub_texts}:label"])


def test_unlabelled_text_that_is_not_utf8_names_the_byte_as_labelled_data_does(tmp_path):
    (tmp_path / "u.txt").write_bytes(b"ok\nbad \xff\n")
    with pytest.raises(DataError, match=r"u\.txt:2: not valid UTF-8 \(byte 7\)"):
        load_unlabelled([str(tmp_path / "u.txt")])


NLI = ["entailment", "neutral", "contradiction"]


@pytest.fixture
def hub_nli(monkeypatch):
    """`hub:nli/x:train` as a Hub dataset whose label column is a class label named `NLI`, loaded from memory."""
    import datasets
    from edgedistill.common import data

    features = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=NLI),
        }
    )
    split = datasets.Dataset.from_dict(
        {"premise": ["a man sleeps", "a cat runs"], "hypothesis": ["he rests", "a dog sits"], "label": [0, 2]}, features
    )
    monkeypatch.setattr(data, "_from_hub", lambda spec: (split, None))
    return "hub:nli/x:train"


def nli_config(names: list[str]) -> DataConfig:
    return DataConfig(train="x", dev="x", text_column="premise", text_pair_column="hypothesis", label_names=names)


def test_a_hub_class_label_is_read_by_the_datasets_own_index(hub_nli):
    assert load_labelled(hub_nli, nli_config(NLI)).labels == [0, 2]


def test_hub_class_label_names_listed_in_another_order_are_refused(hub_nli):
    with pytest.raises(
        DataError, match=r"class label named \['entailment', 'neutral', 'contradiction'\] in index order"
    ):
        load_labelled(hub_nli, nli_config(["contradiction", "entailment", "neutral"]))


def test_hub_class_labels_given_names_of_the_recipes_own_are_read_by_index(hub_nli):
    assert load_labelled(hub_nli, nli_config(["yes", "maybe", "no"])).labels == [0, 2]


def test_hub_class_label_names_written_in_another_case_in_another_order_are_refused(hub_nli):
    with pytest.raises(DataError, match=r"lists 'Contradiction' at 0 \(the dataset's at 2\)"):
        load_labelled(hub_nli, nli_config(["Contradiction", "Neutral", "Entailment"]))


def test_a_hub_class_label_name_the_recipe_lists_at_another_index_beside_names_of_its_own_is_refused(hub_nli):
    with pytest.raises(DataError, match=r"lists 'contradiction' at 0 \(the dataset's at 2\): each label would be read"):
        load_labelled(hub_nli, nli_config(["contradiction", "maybe", "yes"]))


def test_hub_class_label_names_kept_at_their_indices_beside_names_of_the_recipes_own_are_read_by_index(hub_nli):
    assert load_labelled(hub_nli, nli_config(["entailment", "maybe", "contra"])).labels == [0, 2]


@pytest.mark.parametrize("ends", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
def test_line_count_counts_each_line_end_the_reader_takes(tmp_path, ends):
    (tmp_path / "u.txt").write_bytes(ends.join(["one line", "two lines", "three"]).encode() + ends.encode())
    assert line_count([str(tmp_path / "u.txt")]) == 3


@pytest.mark.parametrize("ends", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
def test_line_count_counts_a_last_line_without_a_line_end(tmp_path, ends):
    (tmp_path / "u.txt").write_bytes(ends.join(["one line", "two lines", "three"]).encode())
    assert line_count([str(tmp_path / "u.txt")]) == 3


def test_line_count_of_a_file_of_one_line_without_a_line_end_is_one(tmp_path):
    (tmp_path / "u.txt").write_bytes(b"only line")
    assert line_count([str(tmp_path / "u.txt")]) == 1


def test_line_count_counts_a_cr_lf_split_between_two_blocks_once():
    assert data._lines_in(iter([b"one\r", b"\ntwo\r", b"three\r"])) == 3


def test_line_count_of_a_missing_file_is_a_data_error_naming_it(tmp_path):
    with pytest.raises(DataError, match=r"missing\.txt: file not found"):
        line_count([str(tmp_path / "missing.txt")])


def test_line_count_of_a_file_that_is_not_gzip_data_is_a_data_error_naming_it(tmp_path):
    (tmp_path / "u.txt.gz").write_bytes(b"plain text\n")
    with pytest.raises(DataError, match=r"u\.txt\.gz: cannot decompress it"):
        line_count([str(tmp_path / "u.txt.gz")])


def test_a_csv_line_of_spaces_is_skipped_as_a_blank_line_is(tmp_path):
    (tmp_path / "a.csv").write_text("sentence,label\ngood,1\n   \nbad,0\n")
    assert load_labelled(str(tmp_path / "a.csv"), CFG).texts == ["good", "bad"]


def test_a_tsv_line_of_spaces_and_tabs_is_skipped_as_a_blank_line_is(tmp_path):
    (tmp_path / "a.tsv").write_text("sentence\tlabel\ngood\t1\n \t \nbad\t0\n")
    assert load_labelled(str(tmp_path / "a.tsv"), CFG).texts == ["good", "bad"]


@pytest.mark.parametrize(
    "name, content", [("a.tsv", "\n \t\nsentence\tlabel\ngood\t1\n"), ("a.csv", "\n\nsentence,label\ngood,1\n")]
)
def test_blank_lines_before_the_header_are_skipped(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    assert load_labelled(str(tmp_path / name), CFG).texts == ["good"]


def test_a_header_after_blank_lines_is_named_at_its_own_line(tmp_path):
    (tmp_path / "a.tsv").write_text("\n\ntext\tlabel\ngood\t1\n")
    with pytest.raises(DataError, match=r"a\.tsv:3 \(the header\): missing column\(s\) \['sentence'\]"):
        load_labelled(str(tmp_path / "a.tsv"), CFG)


@pytest.mark.parametrize(
    "name, content",
    [("a.tsv", "\t\t\n \t\t\ntext\tlabel\tnotes\ngood\t1\tx\n"), ("a.csv", ',,\n"  ",,\ntext,label,notes\ngood,1,x\n')],
)
def test_a_header_after_rows_of_empty_cells_is_named_at_its_own_line(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=rf"{re.escape(name)}:3 \(the header\): missing column\(s\) \['sentence'\]"):
        load_labelled(str(tmp_path / name), CFG)


@pytest.fixture
def hub_calls(monkeypatch):
    """The (dataset, config, split) each Hub source asks `datasets.load_dataset` for, which returns an in-memory
    labelled split."""
    import datasets

    calls = []

    def load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return datasets.Dataset.from_dict({"sentence": ["good", "bad"], "label": [1, 0]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_a_hub_dataset_of_an_organisation_is_loaded_by_its_id(hub_calls):
    load_labelled("hub:dair-ai/emotion:train", CFG)
    assert hub_calls == [("dair-ai/emotion", None, "train")]


def test_a_hub_config_is_named_after_an_at(hub_calls):
    load_labelled("hub:nyu-mll/glue@mrpc:validation", CFG)
    assert hub_calls == [("nyu-mll/glue", "mrpc", "validation")]


def test_a_hub_dataset_without_an_organisation_or_config_is_loaded_by_its_name(hub_calls):
    load_labelled("hub:imdb:train", CFG)
    assert hub_calls == [("imdb", None, "train")]


def test_a_sliced_hub_split_is_passed_to_the_hub_whole(hub_calls):
    load_labelled("hub:imdb:train[:90%]", CFG)
    assert hub_calls == [("imdb", None, "train[:90%]")]


def test_a_column_after_a_sliced_hub_split_is_the_column():
    assert HubSource.parse("hub:imdb@plain_text:unsupervised[10:20]:text") == HubSource(
        "imdb", "plain_text", "unsupervised[10:20]", "text"
    )


def test_a_hub_source_without_a_split_is_refused_with_the_syntax():
    with pytest.raises(DataError, match=r"hub:imdb: a Hub source looks like hub:<dataset>\[@<config>\]:<split>"):
        load_labelled("hub:imdb", CFG)


def test_an_empty_hub_config_is_refused_with_the_syntax():
    with pytest.raises(DataError, match=r"hub:imdb@:train: a Hub source looks like"):
        load_labelled("hub:imdb@:train", CFG)


def test_a_hub_dataset_that_cannot_be_loaded_with_one_slash_is_shown_the_config_syntax():
    with pytest.raises(DataError, match=r"if no-such-set is the dataset and its-config its config, write hub:no-such"):
        load_labelled("hub:no-such-set/its-config:train", CFG)


@pytest.fixture
def local_hub_dataset(tmp_path, monkeypatch):
    """`myorg/emo`, a dataset folder of one split, train, where the Hub loader finds it: the working directory."""
    folder = tmp_path / "myorg" / "emo"
    folder.mkdir(parents=True)
    (folder / "train.csv").write_text("sentence,label\ngood,1\nbad,0\n")
    monkeypatch.chdir(tmp_path)
    return "hub:myorg/emo"


def test_a_hub_dataset_without_the_split_named_says_which_splits_it_has(local_hub_dataset):
    with pytest.raises(DataError, match=r"Unknown split \"validation\"\. Should be one of \['train'\]"):
        load_labelled(f"{local_hub_dataset}:validation", CFG)


def test_a_hub_dataset_without_the_split_named_is_not_shown_the_config_syntax(local_hub_dataset):
    with pytest.raises(DataError) as refused:
        load_labelled(f"{local_hub_dataset}:validation", CFG)
    assert "its config" not in str(refused.value)


def test_a_hub_source_of_an_absolute_path_is_not_shown_the_config_syntax(tmp_path):
    with pytest.raises(DataError) as refused:
        load_labelled(f"hub:{tmp_path}/nothing:train", CFG)
    assert "its config" not in str(refused.value)


def hub_split(monkeypatch, labels: list, feature) -> str:
    """A Hub source whose `label` column holds `labels` as `feature`, loaded from memory."""
    import datasets

    features = datasets.Features({"sentence": datasets.Value("string"), "label": feature})
    dataset = datasets.Dataset.from_dict({"sentence": ["a"] * len(labels), "label": labels}, features)
    monkeypatch.setattr(datasets, "load_dataset", lambda path, name=None, split=None: dataset)
    return "hub:org/set:train"


STARS = DataConfig(train="x", dev="x", label_names=["1", "2", "3", "4", "5"])


def test_a_hub_integer_column_that_is_no_class_label_is_read_by_name_first(monkeypatch):
    import datasets

    assert load_labelled(hub_split(monkeypatch, [5, 1], datasets.Value("int64")), STARS).labels == [4, 0]


@pytest.mark.parametrize(
    "name, content",
    [("t.csv", "sentence,label,idx\nfine,-1,0\n"), ("t.jsonl", '{"sentence": "fine", "label": -1, "idx": 0}\n')],
    ids=["csv", "jsonl"],
)
def test_a_saved_unlabelled_split_of_labels_minus_one_is_told_to_use_a_labelled_one(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=re.escape(data.LABELLED_ONLY)):
        load_labelled(str(tmp_path / name), CFG)


def test_a_jsonl_label_of_minus_one_is_shown_as_the_integer_it_is(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"sentence": "fine", "label": -1}\n')
    with pytest.raises(DataError, match=r"t\.jsonl:1: label -1, which marks an example without a label"):
        load_labelled(str(tmp_path / "t.jsonl"), CFG)


def test_a_hub_class_label_of_minus_one_says_the_split_is_unlabelled(monkeypatch):
    import datasets

    source = hub_split(monkeypatch, [-1], datasets.ClassLabel(names=["negative", "positive"]))
    with pytest.raises(DataError, match=r"org/set:train:1: label -1, .* the split is unlabelled"):
        load_labelled(source, CFG)


F1 = DataConfig(train="x", dev="x", label_names=["negative", "positive"], metric="f1")


def test_dev_without_the_positive_label_warns_that_f1_selects_nothing():
    warning = Examples(["a", "b"], None, [0, 0], "dev.tsv").f1_warning(F1)
    assert re.search(r"'positive' \(data\.positive_label\).*raise data\.dev_limit", warning)


def test_the_f1_warning_says_training_runs_its_whole_budget_unless_the_teacher_has_patience():
    warning = Examples(["a", "b"], None, [0, 0], "dev.tsv").f1_warning(F1)
    assert "runs its whole budget for nothing, stopping early only where finetune.optim.patience is set" in warning


def test_dev_with_the_positive_label_gives_no_f1_warning():
    assert Examples(["a", "b"], None, [0, 1], "dev.tsv").f1_warning(F1) is None


def test_dev_without_the_positive_label_gives_no_warning_selecting_on_accuracy():
    assert Examples(["a", "b"], None, [0, 0], "dev.tsv").f1_warning(CFG) is None


def limited_note(tmp_path, train_limit: int | None, dev_limit: int | None) -> str | None:
    """The limits note of a task of 3 train and 2 dev examples, read with these limits."""
    train, dev = write_labels(tmp_path, "HUM", "LOC", "NUM"), write_labels(tmp_path, "HUM", "LOC", name="dev.tsv")
    cfg = TREC.model_copy(
        update={"train": str(train), "dev": str(dev), "train_limit": train_limit, "dev_limit": dev_limit}
    )
    return limits_note(cfg, *load_splits(cfg))


def test_a_train_split_read_up_to_its_limit_is_said_to_be_cut(tmp_path):
    assert limited_note(tmp_path, 2, None) == (
        "read up to the limits: 2 train examples, data.train_limit (the files may hold more; null reads a split whole)"
    )


def test_splits_read_whole_under_their_limits_are_not_said_to_be_cut(tmp_path):
    assert limited_note(tmp_path, 10, 10) is None
