"""The texts the serving benchmark and the load tests send."""

import pytest

from bench import BenchError
from bench.texts import batches_of, load_texts, texts_info


@pytest.fixture
def texts_file(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(" ".join(["word"] * n) for n in range(1, 41)) + "\n\n")
    return path


def test_texts_are_shuffled_and_counted(texts_file):
    texts, source = load_texts(texts_file, count=10)
    assert len(texts) == 10 and source == str(texts_file)
    assert len({len(t) for t in texts}) > 5  # varied lengths


def test_batches_wrap_round_to_one_full_batch(texts_file):
    texts, _ = load_texts(texts_file, count=10)
    groups = batches_of(texts, 4)
    assert len(groups) == 2 and groups[0] == texts[:4] and all(len(g) == 4 for g in groups)
    assert batches_of(texts[:3], 4) == [texts[:3] + texts[:1]]


def test_a_file_without_texts_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(BenchError, match="holds no texts"):
        load_texts(tmp_path / "empty.txt")


def test_texts_info_gives_the_source_count_and_lengths():
    assert texts_info(["ab", "abcd", "abcdef"], "here") == {
        "source": "here",
        "count": 3,
        "chars": {"min": 2, "median": 4, "max": 6},
    }
