"""`edgedistill call`: pairs from arguments or a TSV file, large inputs in batches within the server's limit, the
output streamed as one JSON document; the client library's label names and limits it relies on."""

import gzip
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from edgedistill.common.data import DataError, load_unlabelled
from edgedistill.serve import call as cli
from edgedistill.serve import textfiles
from edgedistill.serve.client import Client, LabelsUnavailable

from tests.serve.conftest import Gateway, settings_for, write_bundle
from tests.serve.test_cascade import TEXTS, make_cascade
from tests.serve.test_client import unused_address
from tests.serve.test_operations import ADMIN_TOKEN

PAIRS_TSV = "sentence1\tsentence2\tlabel\ngood\tawful awful\t0\n\nawful\tgreat fun\t1\n"


def run(capsys, *argv: str, stdin: str = "") -> tuple[int, str, str]:
    code = cli.main(list(argv), stdin=io.StringIO(stdin))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tsv(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text(PAIRS_TSV)
    return path


def test_pairs_from_arguments_are_classified_by_their_pair(served_pairs, capsys):
    code, out, _ = run(capsys, "--address", served_pairs.address, "good", "awful", "--pair", "awful", "--pair", "fun")
    assert code == 0
    assert [p["label"] for p in json.loads(out)["predictions"]] == ["negative", "positive"]


@pytest.mark.parametrize("api", [[], ["--kserve"]])
def test_each_prediction_of_a_pair_names_its_pair(served_pairs, capsys, api):
    _, out, _ = run(
        capsys, "--address", served_pairs.address, "good", "awful", "--pair", "awful", "--pair", "fun", *api
    )
    assert [p["pair"] for p in json.loads(out)["predictions"]] == ["awful", "fun"]


def test_pairs_through_kserve_score_as_through_classify(served_pairs, capsys):
    argv = ["--address", served_pairs.address, "good", "awful", "--pair", "awful", "--pair", "fun"]
    classified = json.loads(run(capsys, *argv)[1])["predictions"]
    kserved = json.loads(run(capsys, *argv, "--kserve")[1])["predictions"]
    for a, b in zip(classified, kserved, strict=True):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=1e-6)


def test_pairs_from_a_tsv_with_a_header_skip_it_and_further_fields(served_pairs, tsv, capsys):
    code, out, _ = run(capsys, "--address", served_pairs.address, "--tsv", str(tsv), "--header")
    assert code == 0
    predictions = json.loads(out)["predictions"]
    assert [(p["text"], p["label"]) for p in predictions] == [("good", "negative"), ("awful", "positive")]


LABEL_FIRST_TSV = "verdict\tfirst\tsecond\n0\tgood\tawful awful\n1\tawful\tgreat fun\n"


def test_pairs_from_a_tsv_by_its_column_names_read_those_columns(served_pairs, tmp_path, capsys):
    path = tmp_path / "labelled.tsv"
    path.write_text(LABEL_FIRST_TSV)
    code, out, _ = run(capsys, "--address", served_pairs.address, "--tsv", str(path), "--columns", "first", "second")
    assert code == 0
    assert [(p["text"], p["pair"]) for p in json.loads(out)["predictions"]] == [
        ("good", "awful awful"),
        ("awful", "great fun"),
    ]


def test_pairs_from_a_tsv_by_column_names_take_them_in_the_order_given(served_pairs, tmp_path, capsys):
    path = tmp_path / "labelled.tsv"
    path.write_text(LABEL_FIRST_TSV)
    code, out, _ = run(capsys, "--address", served_pairs.address, "--tsv", str(path), "--columns", "second", "first")
    assert code == 0
    assert json.loads(out)["predictions"][0]["text"] == "awful awful"


def test_a_column_name_missing_from_the_tsv_header_is_a_usage_error_naming_the_columns(served_pairs, tmp_path, capsys):
    path = tmp_path / "labelled.tsv"
    path.write_text(LABEL_FIRST_TSV)
    code, _, err = run(capsys, "--address", served_pairs.address, "--tsv", str(path), "--columns", "first", "other")
    assert code == 2
    assert f"{path}:1 (the header): no column ['other']; found ['verdict', 'first', 'second']" in err


def test_a_tsv_line_short_of_the_named_columns_is_a_usage_error_naming_the_line(served_pairs, tmp_path, capsys):
    path = tmp_path / "labelled.tsv"
    path.write_text(LABEL_FIRST_TSV + "1\tgood\n")
    code, _, err = run(capsys, "--address", served_pairs.address, "--tsv", str(path), "--columns", "first", "second")
    assert code == 2
    assert f"{path}:4: 2 fields; --tsv wants the columns ['first', 'second'] on each line" in err


def test_columns_without_a_tsv_is_a_usage_error(served_pairs, capsys):
    code, _, err = run(capsys, "--address", served_pairs.address, "good", "--pair", "bad", "--columns", "a", "b")
    assert code == 2
    assert "--columns names the columns of --tsv files" in err


def test_header_without_a_tsv_is_a_usage_error_naming_both(served_pairs, capsys):
    code, _, err = run(capsys, "--address", served_pairs.address, "good", "--pair", "bad", "--header")
    assert code == 2
    assert "--header skips the first line of --tsv files: give one" in err


def test_columns_naming_one_column_twice_is_a_usage_error(served_pairs, tsv, capsys):
    code, _, err = run(capsys, "--address", served_pairs.address, "--tsv", str(tsv), "--columns", "label", "label")
    assert code == 2
    assert "--columns names 'label' twice" in err


def test_pairs_from_a_tsv_on_stdin(served_pairs, capsys):
    code, out, _ = run(capsys, "--address", served_pairs.address, "--tsv", "-", stdin="good\tawful awful\n")
    assert code == 0
    assert json.loads(out)["predictions"][0]["label"] == "negative"


def test_a_tsv_line_without_a_tab_is_a_usage_error_naming_the_line(served_pairs, tmp_path, capsys):
    path = tmp_path / "broken.tsv"
    path.write_text("good\tbad\njust one text\n")
    code, _, err = run(capsys, "--address", served_pairs.address, "--tsv", str(path))
    assert code == 2
    assert f"{path}:2: no tab" in err


CSV_PAIRS = 'verdict,first,second\n0,"good, really",awful\n'


def test_a_csv_file_named_by_its_columns_is_a_usage_error_saying_tsv_wants_tabs(tmp_path):
    path = tmp_path / "dev.csv"
    path.write_text(CSV_PAIRS)
    with pytest.raises(cli.UsageError, match=r":1 \(the header\): no column .*a CSV file\? --tsv reads tab-separated"):
        textfiles.read_tsv(path, False, io.StringIO(), ("first", "second"))


def test_a_csv_file_read_by_position_is_a_usage_error_saying_tsv_wants_tabs(tmp_path):
    path = tmp_path / "dev.csv"
    path.write_text(CSV_PAIRS)
    with pytest.raises(cli.UsageError, match=r":2: no tab; .*a CSV file\? --tsv reads tab-separated"):
        textfiles.read_tsv(path, True, io.StringIO())


@pytest.mark.parametrize(
    "content",
    ["good\tbad\nyes, one text alone\n", "just one text\n"],
    ids=["a-line-without-a-tab-after-lines-with-one", "a-line-without-commas-or-a-tab"],
)
def test_a_line_that_is_no_csv_line_is_not_called_one(tmp_path, content):
    path = tmp_path / "pairs.tsv"
    path.write_text(content)
    with pytest.raises(cli.UsageError) as refused:
        textfiles.read_tsv(path, False, io.StringIO())
    assert "CSV" not in str(refused.value)


@pytest.mark.parametrize(
    ("header", "columns"), [(False, ("premise", "hypothesis")), (True, None)], ids=["split-by-columns", "skipped"]
)
def test_a_line_without_a_tab_under_a_header_holding_one_is_not_called_a_csv_line(tmp_path, header, columns):
    path = tmp_path / "pairs.tsv"
    path.write_text("premise\thypothesis\nyes, one text alone\n")
    with pytest.raises(cli.UsageError) as refused:
        textfiles.read_tsv(path, header, io.StringIO(), columns)
    assert "CSV" not in str(refused.value)


@pytest.mark.parametrize("address", ["localhost:99999", "localhost:0", "127.0.0.1:port", "[::1]:70000", "localhost:٥٠"])
def test_an_address_whose_port_is_no_port_is_a_usage_error_naming_it(capsys, address):
    with pytest.raises(SystemExit) as exited:
        run(capsys, "--address", address, "hello")
    assert exited.value.code == 2
    assert f"the port of {address} must be a number from 1 to 65535" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["myhost", "10.0.0.7", "[::1]"])
def test_an_address_without_a_port_is_a_usage_error_naming_the_default_port(capsys, address):
    with pytest.raises(SystemExit) as exited:
        run(capsys, "--address", address, "hello")
    assert exited.value.code == 2
    assert f"{address} names no port, and gRPC would dial 443: give host:port, e.g. {address}:50051" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("address", ["::1", "fe80::1:50051", "2001:db8::7"])
def test_an_ipv6_address_without_brackets_is_a_usage_error_asking_for_them(capsys, address):
    with pytest.raises(SystemExit) as exited:
        run(capsys, "--address", address, "hello")
    assert exited.value.code == 2
    assert f"{address} reads as an IPv6 address without brackets" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["http://localhost:50051", "https://example.com", "grpc://h:1"])
def test_a_url_is_a_usage_error_asking_for_host_and_port(capsys, address):
    with pytest.raises(SystemExit) as exited:
        run(capsys, "--address", address, "hello")
    assert exited.value.code == 2
    assert f"{address} is a URL, not a gRPC target: give host:port" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["dns:///localhost", "dns://8.8.8.8/myhost"])
def test_a_dns_target_without_a_port_is_a_usage_error(capsys, address):
    with pytest.raises(SystemExit) as exited:
        run(capsys, "--address", address, "hello")
    assert exited.value.code == 2
    assert f"{address} names no port, and gRPC would dial 443: give {address}:port" in capsys.readouterr().err


@pytest.mark.parametrize(
    "address",
    [
        "localhost:50051",
        "[::1]:50051",
        "dns:///localhost:50051",
        "unix:server.sock",
        "unix:///tmp/s",
        "ipv4:127.0.0.1:1",
    ],
)
def test_an_address_with_a_port_or_a_scheme_is_taken(address):
    assert cli.build_parser().parse_args(["--address", address, "hello"]).address == address


BLANK_BEFORE_THE_HEADER = "\n\nsentence1\tsentence2\tlabel\ncat dog\tdog cat\t1\n"


def test_a_tsv_header_after_blank_lines_is_skipped_as_the_header(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text(BLANK_BEFORE_THE_HEADER)
    assert textfiles.read_tsv(path, True, io.StringIO()) == (["cat dog"], ["dog cat"])


@pytest.mark.parametrize(("header", "columns"), [(True, None), (False, ("sentence1", "sentence2"))])
def test_a_tsv_line_split_by_a_stray_tab_under_a_header_is_a_usage_error_naming_it(tmp_path, header, columns):
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tlabel\ngreat\tmovie\tdull film\t1\n")
    with pytest.raises(cli.UsageError, match=r"pairs\.tsv:2: 1 field\(s\) more than the header's 3; a tab inside"):
        textfiles.read_tsv(path, header, io.StringIO(), columns)


def test_a_tsv_line_ending_in_a_tab_under_a_header_is_told_of_it(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\ngreat\tmovie\t\n")
    with pytest.raises(cli.UsageError, match=r"pairs\.tsv:2: 1 field\(s\) more .*a tab at the line's end, or a tab"):
        textfiles.read_tsv(path, True, io.StringIO())


def test_tsv_lines_without_a_header_may_hold_further_fields(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("great\tmovie\t1\ndull\tfilm\t0\textra\n")
    assert textfiles.read_tsv(path, False, io.StringIO()) == (["great", "dull"], ["movie", "film"])


def test_a_tsv_header_after_blank_lines_names_the_columns(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text(BLANK_BEFORE_THE_HEADER)
    assert textfiles.read_tsv(path, False, io.StringIO(), ("sentence2", "sentence1")) == (["dog cat"], ["cat dog"])


def test_a_header_after_blank_lines_missing_a_column_is_named_by_its_line(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text(BLANK_BEFORE_THE_HEADER)
    with pytest.raises(cli.UsageError, match=r":3 \(the header\): no column \['premise'\]"):
        textfiles.read_tsv(path, False, io.StringIO(), ("premise", "sentence2"))


def test_a_tsv_line_with_an_empty_pair_is_a_usage_error_naming_the_line(served_pairs, tmp_path, capsys):
    path = tmp_path / "pairs.tsv"
    path.write_text("good\tawful\n" * 10 + "good\t \t1\n")
    code, _, err = run(capsys, "--address", served_pairs.address, "--tsv", str(path))
    assert code == 2
    assert f"{path}:11: an empty text or pair" in err


def test_a_tsv_pair_of_zero_width_characters_only_is_a_usage_error_naming_the_line(served_pairs, tmp_path, capsys):
    path = tmp_path / "pairs.tsv"
    path.write_text("good\tawful\n" * 10 + "good\t\u200b\u200d\t1\n")
    code, _, err = run(capsys, "--address", served_pairs.address, "--tsv", str(path))
    assert code == 2
    assert f"{path}:11: an empty text or pair (or one of control, zero-width or replacement characters only)" in err


@pytest.mark.parametrize("line", ["\u200b", "\u200d\u2060", "\x00 \x1b", "\u202e\u200f"])
def test_a_file_line_of_control_or_zero_width_characters_only_is_a_usage_error_naming_it(
    served, tmp_path, capsys, line
):
    path = tmp_path / "texts.txt"
    path.write_text("good\n" * 100 + line + "\n")
    code, _, err = run(capsys, "--address", served.address, "--file", str(path), "--batch-size", "8")
    assert code == 2
    assert f"{path}:101: only control, zero-width or replacement (U+FFFD) characters" in err


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["good", ""], "argument 2"),
        (["good", "\u200b"], "argument 2"),
        (["a", "b", "--pair", "x", "--pair", " "], "--pair 2"),
    ],
)
def test_an_argument_that_shows_nothing_is_a_usage_error_naming_it(served_pairs, capsys, argv, where):
    code, out, err = run(capsys, "--address", served_pairs.address, *argv)
    assert (code, out) == (2, "")
    assert f"{where}: empty, or only control, zero-width or replacement" in err


@pytest.mark.parametrize("option", ["--file", "--tsv"])
def test_stdin_named_twice_is_a_usage_error(served_pairs, capsys, option):
    code, _, err = run(capsys, "--address", served_pairs.address, option, "-", option, "-", stdin="a\tb\n")
    assert code == 2
    assert "stdin (-) is named twice" in err


def test_a_tsv_beside_texts_is_a_usage_error(served_pairs, tsv, capsys):
    code, _, err = run(capsys, "--address", served_pairs.address, "--tsv", str(tsv), "good")
    assert code == 2
    assert "not both" in err


@pytest.mark.parametrize("source", [[], ["--file", "-"]])
def test_stdin_that_is_not_utf8_is_a_usage_error(served, capsys, source):
    code, _, _ = run(
        capsys, "--address", served.address, *source, stdin="good\n\udcff bad\n"
    )  # as a C locale reads 0xff
    assert code == 2


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_a_byte_that_is_not_utf8_is_refused_as_the_data_loader_refuses_it_whatever_the_line_ends(tmp_path, end):
    path = tmp_path / "texts.txt"
    path.write_bytes(f"good one{end}good two{end}".encode() + "crème brûlée".encode("cp1252") + end.encode())
    with pytest.raises(DataError) as loaded:
        load_unlabelled([str(path)])
    with pytest.raises(cli.UsageError) as read:
        textfiles.lines_of(path, io.StringIO())
    assert str(read.value) == str(loaded.value)


def test_a_byte_that_is_not_utf8_is_named_by_its_line_and_byte_with_how_to_re_encode(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_bytes(b"good one\ngood two\nbad \xff three\n")
    with pytest.raises(cli.UsageError, match=r"texts\.txt:3: not valid UTF-8 \(byte 22\); .*iconv -f cp1252 -t utf-8"):
        textfiles.lines_of(path, io.StringIO())


def test_lines_are_ended_and_numbered_as_the_data_loader_ends_and_numbers_them(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_bytes(b"good\rfilm\r\nbad\rone\n")  # a lone CR ends a text, not the line `grep -n` counts
    assert textfiles.numbered_lines(path, None) == [(1, "good"), (1, "film"), (2, "bad"), (2, "one")]


def test_a_gzip_file_is_a_usage_error_saying_it_is_compressed(tmp_path):
    path = tmp_path / "texts.txt.gz"
    path.write_bytes(gzip.compress(b"good one\n"))
    with pytest.raises(cli.UsageError, match=r"texts\.txt\.gz:1: gzip-compressed data .* give it gunzipped \(zcat\)"):
        textfiles.lines_of(path, io.StringIO())


def test_stdin_is_read_as_utf8_whatever_the_locales_encoding():
    stdin = io.TextIOWrapper(io.BytesIO("\ufeffcafé naïve\n".encode()), encoding="cp1252")
    assert textfiles.lines_of(Path("-"), stdin) == ["café naïve"]


def test_text_stdin_holding_a_byte_that_is_not_utf8_names_its_line_and_byte():
    stdin = io.StringIO("good\n\udcff bad\n")  # as a C locale's stdin reads the byte 0xff
    with pytest.raises(cli.UsageError, match=r"^stdin:2: not valid UTF-8 \(byte 5\)"):
        textfiles.lines_of(Path("-"), stdin)


def test_utf16_stdin_is_a_usage_error_naming_utf16_whatever_the_locales_encoding():
    stdin = io.TextIOWrapper(io.BytesIO("\ufeffgood film\n".encode("utf-16-le")), encoding="latin-1")
    with pytest.raises(cli.UsageError, match="^stdin:1: UTF-16 text"):
        textfiles.lines_of(Path("-"), stdin)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_a_utf16_file_is_a_usage_error_naming_utf16(served, tmp_path, capsys, encoding):
    path = tmp_path / "texts.txt"
    path.write_bytes("\ufeffgood film\r\n".encode(encoding))  # with its byte-order mark, as Notepad writes it
    code, _, err = run(capsys, "--address", served.address, "--file", str(path))
    assert code == 2
    assert f"{path}:1: UTF-16 text" in err


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_a_utf16_file_without_a_byte_order_mark_is_a_usage_error_naming_utf16(tmp_path, encoding):
    path = tmp_path / "texts.txt"
    path.write_bytes("good film\nbad film\n".encode(encoding))
    with pytest.raises(cli.UsageError, match=r"texts\.txt:1: UTF-16 text \(every other byte of its first line is NUL"):
        textfiles.lines_of(path, None)


def test_a_file_with_a_byte_that_is_not_utf8_names_the_byte(served, tmp_path, capsys):
    path = tmp_path / "texts.txt"
    path.write_bytes(b"good film\nbad \xff film\n")
    code, _, err = run(capsys, "--address", served.address, "--file", str(path))
    assert code == 2
    assert f"{path}:2: not valid UTF-8 (byte 14)" in err


def test_a_missing_tsv_is_a_usage_error(served_pairs, tmp_path, capsys):
    code, _, err = run(capsys, "--address", served_pairs.address, "--tsv", str(tmp_path / "absent.tsv"))
    assert code == 2
    assert "cannot read" in err


def test_a_pair_count_unlike_the_text_count_is_a_usage_error(served_pairs, capsys):
    code, _, err = run(capsys, "--address", served_pairs.address, "one", "two", "--pair", "only one")
    assert code == 2
    assert "1 --pair values for 2 texts" in err


def test_a_pair_count_unlike_the_text_count_says_a_pair_model_wants_one_per_text(served_pairs, capsys):
    _, _, err = run(capsys, "--address", served_pairs.address, "one", "two", "--pair", "only one")
    assert "give one per text (none to a model of single texts)" in err


def test_texts_without_pairs_to_a_pair_model_are_refused_by_the_server(served_pairs, capsys):
    code, _, err = run(capsys, "--address", served_pairs.address, "good")
    assert code == 1
    assert "takes text pairs" in json.loads(err)["error"]["message"]


@pytest.mark.parametrize("api", [[], ["--kserve"]])
def test_a_file_beyond_the_servers_limit_goes_in_batches_in_order(served, tmp_path, capsys, api):
    texts = [f"{'great' if i % 3 else 'awful'} film {i}" for i in range(20)]  # the server takes 8 per call
    path = tmp_path / "many.txt"
    path.write_text("\n".join(texts) + "\n")
    code, out, _ = run(capsys, "--address", served.address, "--file", str(path), "--batch-size", "8", *api)
    assert code == 0
    assert [p["text"] for p in json.loads(out)["predictions"]] == texts


@pytest.mark.parametrize("api", [[], ["--kserve"]])
def test_without_a_batch_size_the_calls_take_as_many_texts_as_the_server_does(served, tmp_path, capsys, api):
    texts = [f"{'great' if i % 3 else 'awful'} film {i}" for i in range(20)]  # the server takes 8 per call
    path = tmp_path / "many.txt"
    path.write_text("\n".join(texts) + "\n")
    code, out, _ = run(capsys, "--address", served.address, "--file", str(path), *api)
    assert code == 0
    assert [p["text"] for p in json.loads(out)["predictions"]] == texts


def test_texts_to_a_server_without_kserve_go_in_calls_of_the_max_texts_its_model_info_gives(refusing, capsys):
    servicer, address = refusing(0, max_texts=2)
    code, _, err = run(capsys, "a", "b", "c", "--address", address)
    assert code == 0, err
    assert servicer.texts_per_call == [2, 1]


def test_texts_to_a_server_that_gives_no_max_texts_go_in_calls_of_the_default_one(refusing, capsys):
    servicer, address = refusing(0)
    code, _, err = run(capsys, *(f"text {i}" for i in range(65)), "--address", address)
    assert code == 0, err
    assert servicer.texts_per_call == [64, 1]


@pytest.mark.parametrize("api", [[], ["--kserve"]])
def test_long_texts_go_in_batches_within_the_bytes_given(served, tmp_path, capsys, api):
    texts = [f"{'great' if i % 3 else 'awful'} film {i} " + "x" * 10_000 for i in range(8)]  # 80 KB: above 64 KiB
    path = tmp_path / "long.txt"
    path.write_text("\n".join(texts) + "\n")
    code, out, err = run(capsys, "--address", served.address, "--file", str(path), "--batch-bytes", "32768", *api)
    assert code == 0, err
    assert [p["text"] for p in json.loads(out)["predictions"]] == texts


@pytest.mark.parametrize("api", [[], ["--kserve"]])
def test_without_batch_bytes_long_texts_go_in_calls_within_the_message_limit_the_server_gives(
    served, tmp_path, capsys, api
):
    texts = [f"{'great' if i % 3 else 'awful'} film {i} " + "x" * 10_000 for i in range(8)]  # 80 KB: above 64 KiB
    path = tmp_path / "long.txt"
    path.write_text("\n".join(texts) + "\n")
    code, out, err = run(capsys, "--address", served.address, "--file", str(path), *api)
    assert code == 0, err
    assert [p["text"] for p in json.loads(out)["predictions"]] == texts


def test_batches_close_at_the_count_or_the_bytes_whichever_comes_first():
    texts = ["aaaa", "bb", "cc", "d", "eeeeeeeee", "f"]
    budget = 2 * cli.WIRE_BYTES + 6
    spans = [(b.start, b.stop) for b in cli.batches(texts, None, batch_size=3, batch_bytes=budget)]
    assert spans == [(0, 2), (2, 4), (4, 5), (5, 6)]


def test_batch_bytes_count_the_pairs_too():
    budget = 2 * cli.WIRE_BYTES + 6  # two texts without their pairs
    spans = [(b.start, b.stop) for b in cli.batches(["ab", "cd"], ["ef", "gh"], batch_size=8, batch_bytes=budget)]
    assert spans == [(0, 1), (1, 2)]


@pytest.mark.parametrize("api", [[], ["--kserve"]])
def test_many_short_texts_go_in_calls_within_the_message_limit_the_server_gives(start_server, tmp_path, capsys, api):
    # what each text costs on the wire beyond its one byte would take a call of half the limit's bytes over it
    server = start_server(settings_for(write_bundle(tmp_path / "bundle"), max_texts=1024, max_message_bytes=1024))
    path = tmp_path / "short.txt"
    path.write_text("a\n" * 1500)
    code, _, err = run(capsys, "--address", server.address, "--file", str(path), *api)
    assert code == 0, err


@pytest.mark.parametrize("api", [[], ["--kserve"]])
def test_batch_bytes_below_the_servers_message_limit_make_calls_within_it(start_server, tmp_path, capsys, api):
    # two texts of 1013 bytes on the wire in all: with KServe's input tensor headers, 1034, over the limit
    server = start_server(settings_for(write_bundle(tmp_path / "bundle"), max_message_bytes=1024))
    path = tmp_path / "two.txt"
    path.write_text("x" * 503 + "\n" + "y" * 502 + "\n")
    code, _, err = run(capsys, "--address", server.address, "--file", str(path), "--batch-bytes", "1023", *api)
    assert code == 0, err


def test_texts_after_a_double_dash_are_classified_whatever_they_start_with(served, capsys):
    _, out, _ = run(capsys, "--address", served.address, "--", "-bad", "good")
    assert [p["text"] for p in json.loads(out)["predictions"]] == ["-bad", "good"]


def test_a_text_after_a_double_dash_that_is_not_utf8_is_refused_as_one_before_it(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--address", unused_address(), "--", "-bad\udcff"])
    assert "argument texts: not UTF-8" in capsys.readouterr().err


def test_texts_may_follow_options_each_with_its_pair(served_pairs, capsys):
    argv = ["--address", served_pairs.address, "good", "--pair", "awful", "awful", "--pair", "fun"]
    _, out, _ = run(capsys, *argv)
    assert [(p["text"], p["pair"]) for p in json.loads(out)["predictions"]] == [("good", "awful"), ("awful", "fun")]


def test_a_file_named_dash_given_as_such_is_read_not_stdin(served, tmp_path, capsys, monkeypatch):
    (tmp_path / "-").write_text("from the file\n")
    monkeypatch.chdir(tmp_path)
    _, out, _ = run(capsys, "--address", served.address, "--file", "./-", stdin="from stdin\n")
    assert [p["text"] for p in json.loads(out)["predictions"]] == ["from the file"]


def test_a_closed_stdin_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # as `<&-` starts it
    assert cli.main(["--address", unused_address()]) == 2


def test_a_closed_stdin_is_named_in_the_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)
    cli.main(["--address", unused_address()])
    assert "stdin is closed" in capsys.readouterr().err


def test_a_closed_stdout_is_a_usage_error_before_any_call(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)  # as `>&-` starts it: every answer would be lost
    assert cli.main(["--address", unused_address(), "good"]) == 2


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_texts_read_from_a_terminal_say_how_to_end_them(capsys):
    cli.read_texts(cli.build_parser("edgedistill call").parse_args([]), Terminal("good film\n"))
    assert capsys.readouterr().err == "reading from the terminal, one text per line; end with Ctrl-D\n"


def test_pairs_read_from_a_terminal_say_how_to_write_them(capsys):
    cli.read_texts(cli.build_parser("edgedistill call").parse_args(["--tsv", "-"]), Terminal("good\tfilm\n"))
    assert capsys.readouterr().err == "reading from the terminal, text<TAB>pair on each line; end with Ctrl-D\n"


def test_texts_piped_in_are_read_without_a_word(capsys):
    cli.read_texts(cli.build_parser("edgedistill call").parse_args([]), io.StringIO("good film\n"))
    assert capsys.readouterr().err == ""


def test_a_batch_beyond_the_servers_limit_is_refused(served, tmp_path, capsys):
    path = tmp_path / "many.txt"
    path.write_text("good film\n" * 9)
    limits = ["--batch-size", "9", "--batch-bytes", "4096"]  # the server is not asked: it refuses the call
    code, _, err = run(capsys, "--address", served.address, "--file", str(path), *limits)
    assert code == 1
    assert json.loads(err)["error"]["code"] == "RESOURCE_EXHAUSTED"


@pytest.fixture
def nine_texts(tmp_path) -> Path:
    path = tmp_path / "many.txt"
    path.write_text("good film\n" * 9)
    return path


def test_a_batch_size_over_the_servers_limit_is_a_usage_error(served, nine_texts, capsys):
    code, out, _ = run(capsys, "--address", served.address, "--file", str(nine_texts), "--batch-size", "9")
    assert (code, out) == (2, "")


def test_a_batch_size_over_the_servers_limit_sends_no_text(served, gateway, nine_texts, capsys):
    front = gateway(served.address, ("/edgedistill.v1.Classifier/",))
    run(capsys, "--address", front.address, "--file", str(nine_texts), "--batch-size", "9")
    assert front.calls["/edgedistill.v1.Classifier/Classify"] == 0


def test_a_batch_size_over_the_servers_limit_is_refused_naming_the_limit(served, nine_texts, capsys):
    _, _, err = run(capsys, "--address", served.address, "--file", str(nine_texts), "--batch-size", "9")
    assert "--batch-size 9 is over the server's MAX_TEXTS, 8: give at most that" in err


def test_batch_bytes_at_the_servers_message_limit_is_refused_naming_it(served, nine_texts, capsys):
    limit = str(served.settings.max_message_bytes)
    _, _, err = run(capsys, "--address", served.address, "--file", str(nine_texts), "--batch-bytes", limit)
    assert f"--batch-bytes {limit} is not below the server's MAX_MESSAGE_BYTES, {limit}" in err


def test_a_text_the_server_refuses_is_named_by_its_file_and_line(make_bundle, start_server, tmp_path, capsys):
    server = start_server(settings_for(make_bundle(text_style="ptb_lower"), max_texts=8))
    path = tmp_path / "many.txt"
    path.write_text("".join("<br />\n" if number == 70 else "good film\n" for number in range(1, 101)))
    _, _, err = run(capsys, "--address", server.address, "--file", str(path))
    assert json.loads(err)["error"]["where"] == f"{path}:70"  # markup alone, which its text style removes


# whitespace in all of the characters the server reads (MAX_TEXT_CHARS, 4096): refused there, not here
PADDED = " " * 5000 + "fun"


def test_a_pair_the_server_refuses_is_named_by_its_pair_option(served_pairs, capsys):
    _, _, err = run(capsys, "--address", served_pairs.address, "good", "awful", "--pair", "fun", "--pair", PADDED)
    assert json.loads(err)["error"]["where"] == "--pair 2"


def test_a_call_that_fails_names_the_first_and_last_of_its_texts(capsys):
    limits = ["--batch-size", "8", "--batch-bytes", "1024"]  # so that the call that fails is the texts'
    _, _, err = run(capsys, "good", "bad", "--address", unused_address(), *limits, "--retries", "0")
    assert json.loads(err)["error"]["where"] == "argument 1 to argument 2"


def test_a_batch_size_below_one_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--batch-size", "0", "good"])
    assert exited.value.code == 2


@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_a_timeout_that_is_not_above_zero_is_refused(timeout, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--timeout", timeout, "good"])
    assert exited.value.code == 2


def test_a_timeout_that_is_no_number_is_refused_as_not_seconds(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--timeout", "10s", "good"])
    assert "argument --timeout: must be a number of seconds, got '10s'" in capsys.readouterr().err


def test_each_batch_is_written_before_the_next_is_asked_for():
    out = io.StringIO()

    def results():
        yield {"model": "m", "version": "1", "predictions": [{"text": "a"}, {"text": "b"}]}
        assert '"text": "b"' in out.getvalue()
        yield {"model": "m", "version": "1", "predictions": [{"text": "c"}]}

    cli.write_streamed(results(), out)
    assert json.loads(out.getvalue()) == {
        "model": "m",
        "version": "1",
        "predictions": [{"text": "a"}, {"text": "b"}, {"text": "c"}],
    }


def results_then(error: Exception):
    """One batch's results, then `error`, as a run stopped after its first call yields them."""
    yield {"model": "m", "version": "1", "predictions": [{"text": "a"}]}
    raise error


def test_a_run_stopped_after_its_first_batch_still_writes_one_json_document_of_the_predictions_so_far():
    out = io.StringIO()
    with pytest.raises(cli.ModelChanged):
        cli.write_streamed(results_then(cli.ModelChanged("reloaded")), out)
    assert json.loads(out.getvalue())["predictions"] == [{"text": "a"}]


def test_a_run_stopped_after_its_first_batch_says_its_document_is_incomplete():
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        cli.write_streamed(results_then(KeyboardInterrupt()), out)
    assert json.loads(out.getvalue())["complete"] is False


def test_a_whole_run_writes_no_completeness_flag():
    out = io.StringIO()
    cli.write_streamed(iter([{"model": "m", "version": "1", "predictions": [{"text": "a"}]}]), out)
    assert "complete" not in json.loads(out.getvalue())


def test_a_model_change_between_batches_stops_the_run():
    versions = iter(["1", "2"])

    def infer(texts, pairs, model=""):
        return {"model": "m", "version": next(versions), "predictions": [{"text": t} for t in texts]}

    batches = cli.classify_in_batches(infer, ["a", "b", "c"], None, batch_size=2)
    assert next(batches)["version"] == "1"
    with pytest.raises(cli.ModelChanged, match="from model m version 1 to m version 2 after 2 texts"):
        next(batches)


def test_a_reader_that_stops_early_ends_the_client_quietly(served, tmp_path):
    path = tmp_path / "many.txt"
    path.write_text("".join(f"great film {i}\n" for i in range(2000)))
    command = [sys.executable, "-m", "edgedistill", "call", "--address", served.address, "--file", str(path)]
    client = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    client.stdout.readline()
    client.stdout.close()  # as `| head -1` does
    err = client.stderr.read().decode()
    assert client.wait(timeout=60) == 141
    assert "Traceback" not in err


def test_info_of_a_model_the_server_does_not_serve_is_not_found(served, capsys):
    code, _, err = run(capsys, "--address", served.address, "--info", "--model", "bert")
    assert code == 1
    assert json.loads(err)["error"]["code"] == "NOT_FOUND"


def test_labels_of_a_version_the_server_does_not_serve_are_not_found(served):
    with Client(served.address) as client, pytest.raises(grpc.RpcError) as caught:
        client.labels("tiny-sentiment", "2")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_labels_of_the_served_model_are_those_of_the_model_served_after_a_reload(start_server, make_bundle):
    first = make_bundle("v1")
    make_bundle("v2", version="2", labels=["bad", "good"])
    server = start_server(settings_for(first, reload_root=first.parent, admin_token=ADMIN_TOKEN))
    with Client(server.address, token=ADMIN_TOKEN) as client:
        client.labels()
        client.reload("v2")
        assert client.labels() == ["bad", "good"]


KSERVE = "/inference.GRPCInferenceService/"
MODEL_INFER = KSERVE + "ModelInfer"


def test_kserve_behind_a_gateway_of_kserve_only_gives_the_label_names(served, gateway):
    with Client(gateway(served.address, (KSERVE,)).address) as client:
        (prediction,) = client.kserve_infer(["a great movie"])["predictions"]
    assert set(prediction["probabilities"]) == {"negative", "positive"}


def test_kserve_behind_a_gateway_without_model_config_reads_the_labels_from_model_info(served, gateway):
    with Client(gateway(served.address, (MODEL_INFER, "/edgedistill.v1.Classifier/")).address) as client:
        (prediction,) = client.kserve_infer(["a great movie"])["predictions"]
    assert set(prediction["probabilities"]) == {"negative", "positive"}


def test_kserve_labels_are_asked_once_per_model_version(served, gateway):
    front = gateway(served.address, (KSERVE,))
    with Client(front.address) as client:
        client.kserve_infer(["a great movie"])
        client.kserve_infer(["awful boring film"])
    assert front.calls[KSERVE + "ModelConfig"] == 1


def test_kserve_labels_that_cannot_be_read_are_not_blamed_on_the_texts(served, gateway, capsys):
    code, _, err = run(capsys, "--address", gateway(served.address, (MODEL_INFER,)).address, "--kserve", "good")
    assert code == 1
    assert "the server answered, but the labels of model tiny-sentiment" in err
    assert "where" not in err


@pytest.fixture
def reloaded_after_classify(start_server, make_bundle, gateway) -> str:
    """The address of a gateway to a server of version 1 that has it load version 2 once a Classify is answered,
    before the answer goes back: the version that answered is gone when the client asks its labels."""
    first = make_bundle("v1")
    make_bundle("v2", version="2")
    server = start_server(settings_for(first, reload_root=first.parent, admin_token=ADMIN_TOKEN))

    def reload(method: str) -> None:
        if method.endswith("/Classify"):
            with Client(server.address, token=ADMIN_TOKEN) as admin:
                admin.reload("v2")

    return gateway(server.address, ("/edgedistill.v1.Classifier/",), reload).address


def test_labels_of_a_version_reloaded_away_after_it_answered_are_unavailable(reloaded_after_classify):
    with Client(reloaded_after_classify) as client, pytest.raises(LabelsUnavailable, match="version 1 cannot"):
        client.classify(["good"])


def test_labels_unavailable_after_a_reload_say_the_version_is_no_longer_served(reloaded_after_classify):
    with Client(reloaded_after_classify) as client, pytest.raises(LabelsUnavailable, match="no longer serves"):
        client.classify(["good"])


def test_labels_that_cannot_be_read_after_a_classify_fail_the_run(reloaded_after_classify, capsys):
    assert run(capsys, "--address", reloaded_after_classify, "good")[0] == 1


def test_labels_that_cannot_be_read_after_a_classify_say_the_server_answered(reloaded_after_classify, capsys):
    err = run(capsys, "--address", reloaded_after_classify, "good")[2]
    assert "the server answered, but the labels of model tiny-sentiment version 1 cannot be read" in err


def test_labels_that_cannot_be_read_after_a_classify_are_not_blamed_on_the_texts(reloaded_after_classify, capsys):
    assert "where" not in run(capsys, "--address", reloaded_after_classify, "good")[2]


def test_info_to_a_closed_pipe_ends_the_client_quietly(served):
    command = [sys.executable, "-m", "edgedistill", "call", "--address", served.address, "--info"]
    client = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    client.stdout.close()  # before the client writes, as a reader that exits at once
    err = client.stderr.read().decode()
    assert client.wait(timeout=60) == 141
    assert "Traceback" not in err


def test_kserve_names_the_cascade_member_that_answered_as_classify_does(start_server, tmp_path, capsys):
    server = start_server(settings_for(make_cascade(tmp_path), max_texts=8))
    classified = json.loads(run(capsys, "--address", server.address, *TEXTS)[1])["predictions"]
    kserved = json.loads(run(capsys, "--address", server.address, "--kserve", *TEXTS)[1])["predictions"]
    assert [p.get("answered_by") for p in kserved] == [p["answered_by"] for p in classified]


def test_the_token_comes_from_the_servers_variable_without_the_flag(start_server, bundle, monkeypatch, capsys):
    server = start_server(settings_for(bundle, token="s3cret"))
    monkeypatch.setenv("EDGEDISTILL_TOKEN", "s3cret")
    code, _, err = run(capsys, "--address", server.address, "good")
    assert code == 0, err


def test_a_reload_sends_the_admin_token_from_its_variable(start_server, bundle, monkeypatch, capsys):
    server = start_server(settings_for(bundle, token="s3cret", admin_token="admin"))
    monkeypatch.setenv("EDGEDISTILL_TOKEN", "s3cret")
    monkeypatch.setenv("EDGEDISTILL_ADMIN_TOKEN", "admin")
    code, _, err = run(capsys, "--address", server.address, "--reload")
    assert code == 0, err


class DeadlineGateway(Gateway):
    """A `Gateway` to the Classifier API that forwards each call's token too, and keeps the seconds each call has left
    of its deadline as it comes in; with `hold`, it holds each reply until its caller has gone, as a server does whose
    reload outlasts the call."""

    def __init__(self, upstream: str, hold: bool):
        super().__init__(upstream, ("/edgedistill.v1.Classifier/",))
        self.hold, self.time_left = hold, []

    def service(self, handler_call_details):
        forward = self.upstream.unary_unary(handler_call_details.method)

        def handle(request: bytes, context) -> bytes:
            self.time_left.append(context.time_remaining())
            token = [(key, value) for key, value in context.invocation_metadata() if key == "authorization"]
            try:
                reply = forward(request, metadata=token)
            except grpc.RpcError as err:
                context.abort(err.code(), err.details())
            gone = threading.Event()
            if self.hold and context.add_callback(gone.set):  # False: the call has already ended
                gone.wait()
            return reply

        return grpc.unary_unary_rpc_method_handler(handle)


@pytest.fixture
def reload_through(start_server, bundle):
    """`reload_through(capsys, hold, *argv) -> (DeadlineGateway, (code, out, err))`: `--reload` through a
    `DeadlineGateway` to a server that takes Reload calls."""
    server = start_server(settings_for(bundle, admin_token=ADMIN_TOKEN))
    gateways = []

    def reload(capsys, hold: bool, *argv: str):
        gateways.append(DeadlineGateway(server.address, hold))
        argv = ("--address", gateways[-1].address, "--token", ADMIN_TOKEN, "--reload", *argv)
        return gateways[-1], run(capsys, *argv)

    yield reload
    for gateway in gateways:
        gateway.close()


def test_a_reload_without_a_timeout_has_minutes_to_load_and_warm_up(reload_through, capsys):
    gateway, _ = reload_through(capsys, False)
    assert gateway.time_left[0] > 60  # minutes, not a classification's seconds


def test_a_reload_with_a_timeout_has_that_deadline(reload_through, capsys):
    gateway, _ = reload_through(capsys, False, "--timeout", "30")
    assert gateway.time_left[0] <= 30


def test_a_reload_past_its_deadline_hints_that_the_server_goes_on_with_it(reload_through, capsys):
    _, (_, _, err) = reload_through(capsys, True, "--timeout", "1")
    assert json.loads(err)["error"]["hint"].startswith("the server goes on with the reload past the call's deadline")


def test_a_token_variable_grpc_cannot_send_is_a_usage_error(served, monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_TOKEN", "s3cret\n")
    code, _, err = run(capsys, "--address", served.address, "good")
    assert code == 2
    assert "EDGEDISTILL_TOKEN must be printable ASCII" in err


@pytest.mark.parametrize("value", ["", "  ", "off"])
def test_a_blank_token_variable_is_a_usage_error(served, monkeypatch, capsys, value):
    monkeypatch.setenv("EDGEDISTILL_TOKEN", value)
    assert run(capsys, "--address", served.address, "good")[0] == 2


def test_a_blank_token_variable_is_named_in_its_error(served, monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_TOKEN", "  ")
    assert "EDGEDISTILL_TOKEN is empty, 'none' or 'off'" in run(capsys, "--address", served.address, "good")[2]


def test_a_blank_admin_token_variable_for_a_reload_is_named_in_its_error(served, monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_ADMIN_TOKEN", " ")
    assert (
        "EDGEDISTILL_ADMIN_TOKEN is empty, 'none' or 'off'" in run(capsys, "--address", served.address, "--reload")[2]
    )


def test_a_blank_token_flag_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--token", " ", "good"])
    assert exited.value.code == 2


def test_single_texts_sent_to_a_pair_model_are_told_to_give_pairs(served_pairs, capsys):
    code, _, err = run(capsys, "--address", served_pairs.address, "good")
    assert code == 1
    assert json.loads(err)["error"]["hint"].startswith("the served model takes text pairs: give --pair once per text")


def test_pairs_sent_to_a_single_text_model_are_told_to_drop_them(served, capsys):
    code, _, err = run(capsys, "--address", served.address, "good", "--pair", "bad")
    assert code == 1
    assert json.loads(err)["error"]["hint"].startswith("the served model takes single texts: give them as arguments")


def test_a_call_refused_for_another_reason_names_no_input_shape(served, capsys):
    code, _, err = run(capsys, "--address", served.address, PADDED)
    assert code == 1
    assert "hint" not in json.loads(err)["error"]


# Each refused before any call: no server is needed.
@pytest.mark.parametrize(
    "given",
    [["good"], ["--file", "texts.txt"], ["--tsv", "pairs.tsv"], ["--kserve"], ["--batch-size", "4"]],
    ids=["text", "file", "tsv", "kserve", "batch-size"],
)
@pytest.mark.parametrize(
    "command", [["--info"], ["--reload"], ["--reload", "bundle-v2"]], ids=["info", "reload", "path"]
)
def test_classification_options_with_info_or_reload_are_a_usage_error_naming_both(capsys, command, given):
    code, _, err = run(capsys, *given, *command)
    assert code == 2
    assert f"{command[0]} sends no texts: " in err


def test_classification_options_with_info_are_named_in_the_error(capsys):
    _, _, err = run(capsys, "--info", "--kserve", "--batch-size", "4")
    assert "--kserve, --batch-size would do nothing" in err


def test_a_model_with_reload_is_a_usage_error(capsys):
    code, _, err = run(capsys, "--reload", "--model", "tiny-sentiment")
    assert code == 2
    assert "--reload names no model" in err


def test_info_and_reload_together_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--info", "--reload"])
    assert exited.value.code == 2
    assert "argument --reload: not allowed with argument --info" in capsys.readouterr().err


@pytest.mark.parametrize(
    "files",
    [("--tls-ca", "ca.key"), ("--tls-cert", "client.key", "--tls-key", "client.key"),
     ("--tls-cert", "client.pem", "--tls-key", "server.key")],
    ids=["a CA file of no certificate", "a certificate file of none", "a key that is not the certificate's"],
)  # fmt: skip
def test_tls_files_grpc_cannot_use_are_a_usage_error_before_any_call(certs, capsys, files):
    paths = [name if name.startswith("--") else str(certs / name) for name in files]
    code, _, err = run(capsys, "--address", unused_address(), *paths, "good")
    assert code == 2
    assert "cannot use --tls-ca, --tls-cert or --tls-key" in err


@pytest.mark.parametrize("flag", ["--tls-cert", "--tls-key"])
def test_a_client_certificate_or_key_alone_is_a_usage_error(tmp_path, capsys, flag):
    code, _, err = run(capsys, flag, str(tmp_path / "client.pem"), "good")
    assert code == 2
    assert "--tls-cert and --tls-key go together" in err


def test_a_plaintext_call_to_a_tls_server_hints_at_tls(start_server, bundle, certs, capsys):
    server = start_server(settings_for(bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key"))
    _, _, err = run(capsys, "--address", server.address, "--retries", "0", "good")
    assert json.loads(err)["error"]["hint"].startswith("the server closed the connection at once, as a TLS server")


def test_a_tls_call_to_a_plaintext_server_hints_at_plaintext(served, certs, capsys):
    _, _, err = run(capsys, "--address", served.address, "--retries", "0", "--tls-ca", str(certs / "ca.pem"), "good")
    assert json.loads(err)["error"]["hint"].startswith("the server did not answer in TLS")


def test_a_call_with_a_client_certificate_alone_to_a_plaintext_server_hints_at_plaintext(served, certs, capsys):
    certificate = ("--tls-cert", str(certs / "client.pem"), "--tls-key", str(certs / "client.key"))
    _, _, err = run(capsys, "--address", served.address, "--retries", "0", *certificate, "good")
    assert json.loads(err)["error"]["hint"].startswith("the server did not answer in TLS")


def test_a_call_without_a_certificate_to_a_mutual_tls_server_hints_at_one(start_server, bundle, certs, capsys):
    tls = {"tls_cert": certs / "server.pem", "tls_key": certs / "server.key", "tls_ca": certs / "ca.pem"}
    server = start_server(settings_for(bundle, **tls))
    _, _, err = run(capsys, "--address", server.address, "--retries", "0", "--tls-ca", str(certs / "ca.pem"), "good")
    assert json.loads(err)["error"]["hint"].startswith("the server closed the connection in the TLS handshake")


def test_a_call_trusting_another_ca_hints_at_the_one_that_signed_the_server(start_server, bundle, certs, capsys):
    server = start_server(settings_for(bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key"))
    trusting = ("--tls-ca", str(certs / "other-ca.pem"))
    _, _, err = run(capsys, "--address", server.address, "--retries", "0", *trusting, "good")
    assert json.loads(err)["error"]["hint"].startswith("the server's certificate is not one this client trusts")


@pytest.mark.parametrize(
    "module",
    [["edgedistill", "call"], ["edgedistill.serve.call"], ["serve.call"]],
    ids=["command", "module", "checkout"],
)
def test_a_failed_tls_handshake_is_said_in_the_clients_json_line_alone(start_server, bundle, certs, module):
    server = start_server(settings_for(bundle, tls_cert=certs / "server.pem", tls_key=certs / "server.key"))
    trusting = ("--tls-ca", str(certs / "other-ca.pem"))
    command = [sys.executable, "-m", *module, "--address", server.address, "--retries", "0", *trusting]
    env = {name: value for name, value in os.environ.items() if name != "GRPC_VERBOSITY"}
    err = subprocess.run([*command, "good"], capture_output=True, text=True, env=env, timeout=60).stderr
    assert [json.loads(line)["error"]["code"] for line in err.splitlines()] == ["UNAVAILABLE"]


def test_a_token_sent_in_plaintext_beyond_loopback_is_warned_of_once():
    command = [sys.executable, "-m", "edgedistill.serve.call", "--address", "10.0.0.1:1", "--token", "s3cret"]
    call = [*command, "--timeout", "1", "--retries", "0", "good"]
    err = subprocess.run(call, capture_output=True, text=True, timeout=60).stderr
    assert err.count("the token goes to 10.0.0.1:1 in plaintext") == 1


def test_a_token_sent_in_plaintext_beyond_loopback_is_warned_of_as_the_commands_own_line(capsys):
    _, _, err = run(capsys, "--address", "10.0.0.1:1", "--token", "s3cret", "--timeout", "1", "--retries", "0", "good")
    assert "call: warning: the token goes to 10.0.0.1:1 in plaintext" in err


def test_a_call_to_no_server_hints_that_none_listens_there(capsys):
    address = unused_address()
    _, _, err = run(capsys, "--address", address, "--retries", "0", "good")
    assert json.loads(err)["error"]["hint"].startswith(f"no server listens at {address}: start one")
