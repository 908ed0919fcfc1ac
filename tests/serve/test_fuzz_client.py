"""Property-based fuzzing of the client CLI's input: texts in files, TSV files and on stdin come back one per line as
written, whatever else they hold."""

import io

from edgedistill.serve import client as cli
from hypothesis import example, given
from hypothesis import strategies as st

from tests.serve.test_fuzz import FUZZ

# Characters `str.splitlines` also ends a line at; a text may hold them.
SEPARATOR_LIKE = ["\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
LINES = st.text(st.characters(exclude_characters="\n\r", exclude_categories=["Cs"]) | st.sampled_from(SEPARATOR_LIKE))
FIELDS = LINES.map(lambda line: line.replace("\t", " ")).filter(str.strip)


def parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


@FUZZ
@given(
    lines=st.lists(LINES, min_size=1, max_size=6).filter(lambda lines: any(map(str.strip, lines))),
    newline=st.sampled_from(["\n", "\r\n"]),
)
@example(lines=["good\u2028bad", "fun\fawful"], newline="\n")
def test_a_file_gives_its_lines_that_are_not_blank(tmp_path_factory, lines, newline):
    path = tmp_path_factory.getbasetemp() / "texts.txt"
    path.write_bytes("".join(line + newline for line in lines).encode())
    texts, _ = cli.read_texts(parse("--file", str(path)), io.StringIO())
    assert texts == [line for line in lines if line.strip()]


@FUZZ
@given(rows=st.lists(st.tuples(FIELDS, FIELDS), min_size=1, max_size=6), header=st.booleans())
@example(rows=[("a\x1cb", "c\x85d")], header=False)
def test_a_tsv_on_stdin_gives_its_texts_and_pairs(rows, header):
    stdin = io.StringIO(("text\tpair\n" if header else "") + "".join(f"{a}\t{b}\t0\n" for a, b in rows))
    texts, pairs = cli.read_texts(parse("--tsv", "-", *(["--header"] if header else [])), stdin)
    assert list(zip(texts, pairs, strict=True)) == rows
