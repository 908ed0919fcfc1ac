"""A small synthetic sentence-pair task for end-to-end tests: do the two sentences together lean positive?

Words are positive or negative; each sentence draws seven at random. A pair is `high` when more than
seven of its fourteen words are positive, `low` when fewer (ties are left out), so half the pairs are
each. One sentence alone leaves the label open for most pairs, and replacing sentence B changes it
for many, so a model has to read both sentences. Unlabelled lines hold three such sentences.
"""

import random
from pathlib import Path

from edgedistill.common.data import load_splits
from edgedistill.common.recipe import Recipe, load_recipe
from edgedistill.distill.student_stage import load_student, student_logits
from edgedistill.distill.tokenization import encode, load_tokenizer

from tests.conftest import build_stages

WORDS, LENGTH = 30, 7
LABELS = ["low", "high"]


def _vocabulary(rng: random.Random) -> tuple[list[str], list[str]]:
    """Positive and negative made-up words."""
    words: set[str] = set()
    while len(words) < 2 * WORDS:
        words.add("".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(3)))
    ordered = sorted(words)
    rng.shuffle(ordered)
    return ordered[:WORDS], ordered[WORDS:]


def _sentence(rng: random.Random, positive: list[str], negative: list[str]) -> tuple[str, int]:
    """A sentence and how many of its words are positive."""
    words = [rng.choice(positive if rng.random() < 0.5 else negative) for _ in range(LENGTH)]
    return " ".join(words) + " .", sum(w in positive for w in words)


def _pairs(rng: random.Random, positive: list[str], negative: list[str], count: int) -> list[tuple[str, str, int]]:
    rows: list[tuple[str, str, int]] = []
    while len(rows) < count:
        (first, a), (second, b) = _sentence(rng, positive, negative), _sentence(rng, positive, negative)
        label = int(a + b > LENGTH)
        if a + b != LENGTH and sum(r[2] == label for r in rows) < count // 2:
            rows.append((first, second, label))
    return rows


def write_pair_task(folder: Path, train: int = 2000, dev: int = 300, unlabelled: int = 1500) -> dict[str, Path]:
    """Write `train.tsv`, `dev.tsv` (sentence1, sentence2, label by name) and `unlabelled.txt` (lines of three
    sentences) into `folder`; returns their paths."""
    rng = random.Random(0)
    positive, negative = _vocabulary(rng)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.tsv" for name in ("train", "dev")}
    for name, count in (("train", train), ("dev", dev)):
        rows = [f"{a}\t{b}\t{LABELS[y]}" for a, b, y in _pairs(rng, positive, negative, count)]
        paths[name].write_text("sentence1\tsentence2\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    lines = [" ".join(_sentence(rng, positive, negative)[0] for _ in range(3)) for _ in range(unlabelled)]
    paths["unlabelled"] = folder / "unlabelled.txt"
    paths["unlabelled"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def pair_recipe(paths: dict[str, Path]) -> str:
    """A smoke-size recipe for the task in `paths`: a tiny BERT teacher from scratch, every student, their
    bundles."""
    return f"""\
data:
  train: {paths["train"]}
  dev: {paths["dev"]}
  text_column: sentence1
  text_pair_column: sentence2
  label_names: [{", ".join(LABELS)}]
model: {{family: bert, init: null, max_length: 48, vocab_size: 400, hidden_size: 64, num_layers: 2, num_heads: 2,
  intermediate_size: 128}}
pretrain:
  train_files: ["{paths["unlabelled"]}"]
  eval_holdout_lines: 100
  seq_len: 48
  optim: {{lr: 1.0e-3, epochs: 1, batch_size: 32, warmup_ratio: 0.1}}
finetune:
  optim: {{lr: 1.0e-3, epochs: 3, batch_size: 32, warmup_ratio: 0.1}}
transfer:
  unlabelled_files: ["{paths["unlabelled"]}"]
  max_unlabelled: 2000
  n_iter: 2
  max_augmented: 3000
  max_length: 48
distill:
  deploy: bilstm
  students:
    bilstm:
      model: {{arch: bilstm, embed_dim: 32, hidden_size: 32}}
      optim: {{lr: 3.0e-3, epochs: 2, batch_size: 64}}
    cnn:
      model: {{arch: cnn, embed_dim: 32, num_filters: 32}}
      optim: {{lr: 3.0e-3, epochs: 2, batch_size: 64}}
    transformer:
      model: {{arch: transformer, hidden_size: 64, num_layers: 1, num_heads: 2, intermediate_size: 128}}
      optim: {{lr: 1.0e-3, epochs: 2, batch_size: 64}}
      losses: {{mse: 1.0, hidden: 1.0, attention: 1.0}}
export:
  deploy: bilstm-fp32
  bundles:
    teacher-fused: {{source: teacher}}
    bilstm-fp32: {{source: bilstm}}
    cnn-folded: {{source: cnn, fold: true}}
    transformer-int8: {{source: transformer, precision: int8, smooth: 0.85}}
"""


def share_changed_by_another_b(run: Path, student: str, texts: list[str], pairs: list[str], length: int) -> float:
    """The share of `student`'s predictions (in `run`) that change when each text gets another example's sentence B:
    near 0 for a student that reads sentence A alone."""
    model, _ = load_student(run / f"student-{student}")
    tokenizer = load_tokenizer(str(run / "teacher"))
    swapped = pairs[1:] + pairs[:1]

    def predictions(seconds: list[str]):
        features = encode(tokenizer, texts, seconds, length, student_segments=True)
        return student_logits(model, features, tokenizer.pad_token_id).argmax(-1)

    return float((predictions(pairs) != predictions(swapped)).mean())


def run_pair_stages(folder: Path, write_teacher, recipe_text) -> tuple[Path, Recipe]:
    """The pair task (1000 train, 200 dev, 600 unlabelled lines) in `folder`/data, a teacher checkpoint
    `write_teacher(folder, unlabelled lines)` made from it, then teacher, students (no baselines) and bundles of the
    recipe `recipe_text(paths, checkpoint)` (run name `pairs`, written to `folder`/pairs.yaml), each stage run in
    this process on one thread; the run folder and the recipe."""
    paths = write_pair_task(folder / "data", train=1000, dev=200, unlabelled=600)
    init = write_teacher(folder / "teacher-init", paths["unlabelled"].read_text(encoding="utf-8").splitlines())
    recipe = folder / "pairs.yaml"
    recipe.write_text(recipe_text(paths, init))
    commands = (["distill", "teacher"], ["distill", "distill", "--no-baseline"], ["export", "bundles"])
    build_stages(folder / "runs", recipe, *commands)
    return folder / "runs" / "pairs", load_recipe(recipe)


def dev_pairs(recipe: Recipe, count: int | None = None) -> tuple[list[str], list[str]]:
    """The first `count` (all) dev texts and their pairs."""
    _, dev = load_splits(recipe.data)
    return dev.texts[:count], dev.pairs[:count]
