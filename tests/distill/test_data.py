import pytest

from common.recipe import DataConfig
from distill.data import DataError, load_labelled, load_splits, load_unlabelled

CFG = DataConfig(train="unused", dev="unused")


def test_tsv_csv_jsonl(tmp_path):
    (tmp_path / "a.tsv").write_text('sentence\tlabel\nit \'s "good"\t1\nbad .\t0\n')
    (tmp_path / "a.csv").write_text('sentence,label\n"good, really",1\nbad,0\n')
    (tmp_path / "a.jsonl").write_text('{"sentence": "good", "label": 1}\n\n{"sentence": "bad", "label": 0}\n')
    tsv = load_labelled(str(tmp_path / "a.tsv"), CFG)
    assert tsv.texts == ['it \'s "good"', "bad ."] and tsv.labels == [1, 0] and tsv.pairs is None
    assert load_labelled(str(tmp_path / "a.csv"), CFG).texts == ["good, really", "bad"]
    assert load_labelled(str(tmp_path / "a.jsonl"), CFG).labels == [1, 0]


def test_sentence_pairs_and_custom_columns(tmp_path):
    (tmp_path / "p.tsv").write_text("q\tp\ty\nis it?\tyes\t1\n")
    cfg = DataConfig(train="x", dev="x", text_column="q", text_pair_column="p", label_column="y")
    data = load_labelled(str(tmp_path / "p.tsv"), cfg)
    assert data.texts == ["is it?"] and data.pairs == ["yes"] and data.labels == [1]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "no examples"),
        (b"sentence\tlabel\n", "no examples"),
        (b"text\tlabel\ngood\t1\n", r"a\.tsv:2: missing column\(s\) \['sentence'\].*data\.text_column"),
        (b"sentence\tlabel\ngood\t1\nbad\t2\n", r"a\.tsv:3: label 2 is out of range 0\.\.1"),
        (b"sentence\tlabel\ngood\tpos\n", r"a\.tsv:2: label 'pos' is not an integer"),
        (b"sentence\tlabel\ngood\t1\n\t0\n", r"a\.tsv:3: empty 'sentence'"),
        (b"sentence\tlabel\ngood\t1\ncaf\xe9\t1\n", r"a\.tsv:3: not valid UTF-8"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, content, message):
    (tmp_path / "a.tsv").write_bytes(content)
    with pytest.raises(DataError, match=message):
        load_labelled(str(tmp_path / "a.tsv"), CFG)


def test_missing_file_and_format(tmp_path):
    with pytest.raises(DataError, match="file not found.*DATA_DIR"):
        load_labelled(str(tmp_path / "nope.tsv"), CFG)
    (tmp_path / "a.parquet").write_text("x")
    with pytest.raises(DataError, match="unsupported format"):
        load_labelled(str(tmp_path / "a.parquet"), CFG)
    (tmp_path / "b.jsonl").write_text('{"sentence": 1\n')
    with pytest.raises(DataError, match=r"b\.jsonl:1: not valid JSON"):
        load_labelled(str(tmp_path / "b.jsonl"), CFG)


def test_unlabelled_lines_limit_and_errors(tmp_path):
    (tmp_path / "u1.txt").write_text("one\n\n two \n")
    (tmp_path / "u2.txt").write_text("three\nfour\n")
    assert load_unlabelled([str(tmp_path / "u1.txt"), str(tmp_path / "u2.txt")]) == ["one", "two", "three", "four"]
    assert load_unlabelled([str(tmp_path / "u1.txt"), str(tmp_path / "u2.txt")], max_lines=3) == ["one", "two", "three"]
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError, match="empty"):
        load_unlabelled([str(tmp_path / "empty.txt")])
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\n")
    with pytest.raises(DataError, match=r"bad\.txt:2: not valid UTF-8"):
        load_unlabelled([str(tmp_path / "bad.txt")])


def test_shared_sst2_splits(data_dir):
    cfg = DataConfig(train=str(data_dir / "sst2/train.tsv"), dev=str(data_dir / "sst2/dev.tsv"), train_limit=100)
    train, dev = load_splits(cfg)
    assert len(train) == 100 and len(dev) == 872
    assert set(dev.labels) == {0, 1}
