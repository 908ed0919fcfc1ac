"""Property-based fuzzing of the client CLI's input: texts in files, TSV files and on stdin come back one per line as
written, whatever else they hold; any arguments (bytes that are not UTF-8 among them, as Python passes them on as
lone surrogates) end in predictions, a usage error (2) or the server's client error as JSON (1), never a traceback."""

import contextlib
import io
import json

import pytest
from edgedistill.common.text import shows_nothing
from edgedistill.serve import call as cli
from hypothesis import example, given
from hypothesis import strategies as st

from tests.serve.test_fuzz import FUZZ, MAX_TEXTS, mostly, sentences

# Characters `str.splitlines` also ends a line at; a text may hold them.
SEPARATOR_LIKE = ["\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
# Blank lines (skipped) and lines that show something: one of control or zero-width characters only is refused.
LINES = st.text(
    st.characters(exclude_characters="\n\r\ufeff", exclude_categories=["Cs"]) | st.sampled_from(SEPARATOR_LIKE)
).filter(lambda line: not line.strip() or not shows_nothing(line))
FIELDS = LINES.map(lambda line: line.replace("\t", " ")).filter(lambda field: not shows_nothing(field))
CLIENT_ERRORS = {"INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"}
ARGUMENTS = mostly(sentences, st.text(max_size=20) | st.sampled_from(["good\udcff", "\udc80", "-"]))


def parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


@FUZZ
@given(
    lines=st.lists(LINES, min_size=1, max_size=6).filter(lambda lines: any(map(str.strip, lines))),
    newline=st.sampled_from(["\n", "\r\n"]),
    mark=st.sampled_from(["", "\ufeff"]),
)
@example(lines=["good\u2028bad", "fun\fawful"], newline="\n", mark="")
@example(lines=["good"], newline="\r\n", mark="\ufeff")
def test_a_file_gives_its_lines_that_are_not_blank(tmp_path_factory, lines, newline, mark):
    """Whatever the lines hold, and whether a byte order mark (`mark`) begins the file."""
    path = tmp_path_factory.getbasetemp() / "texts.txt"
    path.write_bytes((mark + "".join(line + newline for line in lines)).encode())
    texts, _, _ = cli.read_texts(parse("--file", str(path)), io.StringIO())
    assert texts == [line for line in lines if line.strip()]


@FUZZ
@given(rows=st.lists(st.tuples(FIELDS, FIELDS), min_size=1, max_size=6), header=st.booleans())
@example(rows=[("a\x1cb", "c\x85d")], header=False)
def test_a_tsv_on_stdin_gives_its_texts_and_pairs(rows, header):
    stdin = io.StringIO(("text\tpair\tlabel\n" if header else "") + "".join(f"{a}\t{b}\t0\n" for a, b in rows))
    texts, pairs, _ = cli.read_texts(parse("--tsv", "-", *(["--header"] if header else [])), stdin)
    assert list(zip(texts, pairs, strict=True)) == rows


def outcome(argv: list[str]) -> tuple[int, str, str]:
    """The CLI's exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv, stdin=io.StringIO())
        except SystemExit as exited:  # argparse refuses the arguments
            code = exited.code
    return code, out.getvalue(), err.getvalue()


@FUZZ
@given(
    texts=st.lists(ARGUMENTS, min_size=1, max_size=MAX_TEXTS + 2),
    model=mostly(st.just(""), st.sampled_from(["tiny-sentiment", "bert", "m\udcff"])),
    kserve=st.booleans(),
)
@example(texts=["good\udcff"], model="", kserve=False)
@example(texts=["good"], model="m\udcff", kserve=True)
def test_any_arguments_end_in_predictions_a_usage_error_or_a_client_error(served, texts, model, kserve):
    argv = ["--address", served.address, "--model", model, *(["--kserve"] if kserve else []), "--", *texts]
    code, out, err = outcome(argv)
    assert code in (0, 1, 2)
    if code == 0:
        assert len(json.loads(out)["predictions"]) == len(texts)
    if code == 1:
        assert json.loads(err)["error"]["code"] in CLIENT_ERRORS


@pytest.mark.parametrize("flags", [["--tls-ca"], ["--tls-cert", "--tls-key"]], ids=["ca", "client certificate"])
def test_a_tls_file_that_cannot_be_read_is_a_usage_error(tmp_path, flags):
    code, _, err = outcome([*(part for flag in flags for part in (flag, str(tmp_path / "absent.pem"))), "good"])
    assert code == 2
    assert "absent.pem" in err


@pytest.mark.parametrize("token", ["t\u00e9", "two\nlines"])
def test_a_token_that_cannot_travel_in_metadata_is_a_usage_error(token):
    assert outcome(["--token", token, "good"])[0] == 2


@pytest.mark.parametrize("timeout", ["inf", "1e10"])
def test_a_timeout_beyond_what_grpc_can_keep_is_a_usage_error(timeout):
    assert outcome(["--timeout", timeout, "good"])[0] == 2


def test_an_empty_address_is_a_usage_error():
    assert outcome(["--address", "", "good"])[0] == 2


def test_a_reload_path_that_is_not_utf8_is_a_usage_error():
    assert outcome(["--reload", "/runs/bundle-\udcff"])[0] == 2
