"""The texts the serving benchmark, the served-accuracy check and the load tests send."""

import argparse
import hashlib
import io
import sys
from pathlib import Path

import pytest
from edgedistill.bench import BenchError
from edgedistill.bench.texts import (
    PairsFile,
    add_texts_arguments,
    batches_of,
    dev_split,
    hashed_path,
    load_groups,
    load_texts,
    read_pairs_file,
    read_texts_file,
    texts_info,
)
from edgedistill.common.config.training import DataConfig
from edgedistill.common.data import Examples

PAIRS_DEV = (
    "sentence1\tsentence2\tlabel\n"
    'He said " yes .\tShe said " no " .\t0\n'
    'a great film\t"quoted" pair\t1\n'
    "the plot\tthe acting\t1\n"
)


def data(dev, **changes) -> DataConfig:
    return DataConfig(**({"train": str(dev), "dev": str(dev), "label_names": ["negative", "positive"]} | changes))


@pytest.fixture
def texts_file(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(" ".join(["word"] * n) for n in range(1, 41)) + "\n\n")
    return path


@pytest.fixture
def pairs_dev(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text(PAIRS_DEV)
    return path


def pair_data(dev, **changes) -> DataConfig:
    return data(dev, text_column="sentence1", text_pair_column="sentence2", **changes)


def test_a_pair_dev_split_keeps_quotes_as_they_are(pairs_dev):
    examples = dev_split(pair_data(pairs_dev))
    assert examples.texts == ['He said " yes .', "a great film", "the plot"]
    assert examples.pairs == ['She said " no " .', '"quoted" pair', "the acting"]


def test_a_dev_split_gives_label_ids(pairs_dev):
    assert dev_split(pair_data(pairs_dev)).labels == [0, 1, 1]


def test_labels_may_be_given_by_name(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("question\tlabel\nwho is it ?\tHUM\nwhere is it ?\tLOC\n")
    examples = dev_split(data(path, text_column="question", label_names=["DESC", "HUM", "LOC"]))
    assert examples.labels == [1, 2]


def test_a_single_text_dev_split_has_no_pairs(pairs_dev):
    assert dev_split(data(pairs_dev, text_column="sentence1", text_pair_column=None)).pairs is None


def test_a_pair_dev_split_read_without_its_pair_setting_is_refused(pairs_dev):
    with pytest.raises(BenchError, match="column 'sentence2' reads as the second text of a pair"):
        dev_split(data(pairs_dev, text_column="sentence1"))


def test_the_dev_split_is_cut_to_dev_limit(pairs_dev):
    assert len(dev_split(pair_data(pairs_dev, dev_limit=2))) == 2


def test_a_missing_column_is_named(pairs_dev):
    with pytest.raises(BenchError, match=r"missing column\(s\) \['sentence'\]"):
        dev_split(data(pairs_dev))


def test_a_label_outside_the_names_is_refused_with_its_line(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\ngood\t7\n")
    with pytest.raises(BenchError, match="dev.tsv:2: label '7' is neither"):
        dev_split(data(path))


def test_a_dev_split_error_names_the_dev_setting(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\ngood\t7\n")
    with pytest.raises(BenchError, match=r"^data\.dev: .*dev\.tsv:2: label '7'"):
        dev_split(data(path))


def test_pairs_of_the_dev_split_are_shuffled_together(pairs_dev):
    split = dev_split(pair_data(pairs_dev))
    examples = load_texts(pair_data(pairs_dev), pairs=True, seed=3)
    assert sorted(zip(examples.texts, examples.pairs, strict=True)) == sorted(
        zip(split.texts, split.pairs, strict=True)
    )


def test_texts_are_shuffled_and_counted(texts_file, pairs_dev):
    examples = load_texts(data(pairs_dev), pairs=False, texts_file=texts_file, count=10)
    assert len(examples) == 10
    assert examples.source == str(texts_file)
    assert len({len(t) for t in examples.texts}) > 5  # varied lengths


def test_a_pairs_file_gives_pairs(tmp_path, pairs_dev):
    path = tmp_path / "pairs.tsv"
    path.write_text("good\tbad\nfun\tdull\n")
    examples = load_texts(data(pairs_dev), pairs=True, pairs_file=PairsFile(path))
    assert sorted(zip(examples.texts, examples.pairs, strict=True)) == [("fun", "dull"), ("good", "bad")]


def test_a_texts_files_byte_order_mark_is_no_part_of_its_first_text(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\ufeffgood film\ndull\n", encoding="utf-8")
    assert read_texts_file(path).texts == ["good film", "dull"]


def test_a_texts_file_line_holding_a_line_separator_is_one_text(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("good\u2028film\nnext\x85line\n", encoding="utf-8")
    assert read_texts_file(path).texts == ["good\u2028film", "next\x85line"]


def test_a_texts_file_line_that_shows_nothing_is_refused_naming_it(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("good film\n\u200b\u200d\n", encoding="utf-8")
    with pytest.raises(BenchError, match="texts.txt:2: only control, zero-width"):
        read_texts_file(path)


def test_a_pairs_file_line_without_a_tab_is_refused(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("good\tbad\nno tab here\n")
    with pytest.raises(BenchError, match="pairs.tsv:2: no tab; --pairs wants"):
        read_pairs_file(PairsFile(path))


# A pairs file laid out as GLUE's RTE and MNLI files are: the label first.
LABEL_FIRST = "label\tpremise\thypothesis\nentailment\ta dog runs\tan animal moves\n"


def pairs_options(*argv: str) -> PairsFile | None:
    """The pairs file of a command's `--pairs`, `--header` and `--columns` options."""
    parser = argparse.ArgumentParser()
    add_texts_arguments(parser)
    return PairsFile.of(parser.parse_args(argv))


def test_a_pairs_files_columns_are_read_by_name(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text(LABEL_FIRST)
    examples = read_pairs_file(pairs_options("--pairs", str(path), "--columns", "premise", "hypothesis"))
    assert examples.texts == ["a dog runs"]
    assert examples.pairs == ["an animal moves"]


def test_a_pairs_files_header_is_skipped_with_header(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("text\tpair\ngood\tbad\n")
    assert read_pairs_file(pairs_options("--pairs", str(path), "--header")).texts == ["good"]


def test_a_pairs_files_column_missing_from_its_header_is_refused_naming_the_columns_found(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text(LABEL_FIRST)
    with pytest.raises(BenchError, match=r"pairs.tsv:1 \(the header\): no column \['sentence1'\]"):
        read_pairs_file(pairs_options("--pairs", str(path), "--columns", "sentence1", "hypothesis"))


def test_columns_without_a_pairs_file_are_refused():
    with pytest.raises(BenchError, match="--columns names the columns of --pairs files: give one"):
        pairs_options("--columns", "premise", "hypothesis")


@pytest.mark.parametrize("texts", [False, True], ids=["dev split", "texts file"])
def test_header_without_a_pairs_file_is_refused_naming_both(tmp_path, texts):
    (tmp_path / "texts.txt").write_text("a fine film\n")
    given = ["--texts", str(tmp_path / "texts.txt")] if texts else []
    with pytest.raises(BenchError, match="--header skips the first line of --pairs files: give one"):
        pairs_options(*given, "--header")


def test_columns_naming_one_column_twice_are_refused(tmp_path):
    (tmp_path / "pairs.tsv").write_text("premise\thypothesis\n")
    with pytest.raises(BenchError, match="--columns names 'premise' twice"):
        pairs_options("--pairs", str(tmp_path / "pairs.tsv"), "--columns", "premise", "premise")


def test_single_texts_for_a_pair_model_are_refused(texts_file, pairs_dev):
    with pytest.raises(BenchError, match="the model takes text pairs"):
        load_texts(data(pairs_dev), pairs=True, texts_file=texts_file)


def test_pairs_for_a_single_text_model_are_refused(pairs_dev):
    with pytest.raises(BenchError, match="the model takes single texts"):
        load_texts(pair_data(pairs_dev), pairs=False)


def test_a_command_without_text_files_names_none_to_pass(pairs_dev):
    with pytest.raises(BenchError) as refused:
        load_texts(pair_data(pairs_dev), pairs=False)
    assert "file" not in str(refused.value).rpartition(":")[2]


def test_a_command_with_text_files_names_the_texts_file_to_pass_for_a_single_text_model(pairs_dev):
    with pytest.raises(BenchError, match=r"or pass a texts file \(--texts"):
        load_texts(pair_data(pairs_dev), pairs=False, takes_files=True)


def test_a_command_with_text_files_names_the_pairs_file_to_pass_for_a_pair_model(texts_file, pairs_dev):
    with pytest.raises(BenchError, match=r"or pass a pairs file \(--pairs"):
        load_texts(data(pairs_dev), pairs=True, texts_file=texts_file, takes_files=True)


def test_a_file_without_texts_is_refused(tmp_path, pairs_dev):
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(BenchError, match="holds no texts"):
        load_texts(data(pairs_dev), pairs=False, texts_file=tmp_path / "empty.txt")


def test_batches_wrap_round_to_one_full_batch():
    values = list(range(10))
    groups = batches_of(values, 4)
    assert len(groups) == 2
    assert groups[0] == values[:4]
    assert all(len(g) == 4 for g in groups)
    assert batches_of(values[:3], 4) == [[0, 1, 2, 0]]


def test_load_groups_keep_each_pair_with_its_text():
    examples = Examples(["a", "b", "c"], ["x", "y", "z"], None, "here")
    (group,) = load_groups(examples, 4)
    assert group.texts == ["a", "b", "c", "a"]
    assert group.pairs == ["x", "y", "z", "x"]


def test_texts_info_gives_the_source_count_and_lengths():
    assert texts_info(Examples(["ab", "abcd", "abcdef"], None, None, "here")) == {
        "source": "here",
        "count": 3,
        "pairs": False,
        "chars": {"min": 2, "median": 4, "max": 6},
    }


def test_texts_info_counts_both_texts_of_a_pair():
    assert texts_info(Examples(["ab"], ["cde"], None, "here"))["chars"]["max"] == 5


def test_texts_on_stdin_hash_as_the_file_of_their_lines_does(tmp_path, monkeypatch):
    (tmp_path / "texts.txt").write_bytes(b"a good film\nbad one\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a good film\nbad one\n"), encoding="utf-8"))
    assert hashed_path(Path("-")) == f"sha256:{hashlib.sha256((tmp_path / 'texts.txt').read_bytes()).hexdigest()}"
