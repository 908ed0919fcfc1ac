"""The texts that the serving benchmark and the load tests send: SST-2 dev sentences unless a file is given."""

import random
import statistics
from pathlib import Path

from bench import BenchError
from common.settings import defaults

TEXT_COUNT = 512


def load_texts(path: Path | None, count: int = TEXT_COUNT, seed: int = 0) -> tuple[list[str], str]:
    """Up to `count` shuffled texts from `path` (one per line), else from SST-2 dev; and where they came from."""
    if path is None:
        path = Path(defaults()["DATA_DIR"]) / "sst2" / "dev.tsv"
        if not path.is_file():
            raise BenchError(f"{path} not found: set DATA_DIR or pass --texts FILE (one text per line)")
        lines = path.read_text(encoding="utf-8").splitlines()[1:]  # header: sentence<TAB>label
        texts = [line.rsplit("\t", 1)[0].strip() for line in lines]
    else:
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    texts = [text for text in texts if text]
    if not texts:
        raise BenchError(f"{path} holds no texts")
    random.Random(seed).shuffle(texts)
    return texts[:count], str(path)


def batches_of(texts: list[str], size: int) -> list[list[str]]:
    """Consecutive groups of `size` texts, wrapping around so that there is at least one full group."""
    return [[texts[(k * size + j) % len(texts)] for j in range(size)] for k in range(max(1, len(texts) // size))]


def texts_info(texts: list[str], source: str) -> dict:
    """Where the texts came from, how many, and their lengths in characters."""
    lengths = [len(text) for text in texts]
    return {
        "source": source,
        "count": len(texts),
        "chars": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
    }
