"""An encoder-decoder teacher (a tiny BART, whose head reads the decoder's state at the last `</s>`) through every
stage: teacher, a labeller bundle that labels the transfer set, a BiLSTM student, the teacher's bundles, and the
server, for single texts and pairs."""

from pathlib import Path

import numpy as np
import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import load_bundle
from edgedistill.common.data import load_splits
from edgedistill.common.recipe import load_recipe
from edgedistill.distill import heads
from edgedistill.distill.batching import collate
from edgedistill.distill.tokenization import encode, load_tokenizer

from tests.bart_init import write_bart
from tests.conftest import build_stages
from tests.distill.test_roberta_pairs import roberta_pair_recipe
from tests.pair_task import write_pair_task
from tests.serve.conftest import served_probabilities


def bart_recipe(data_dir, init) -> str:
    """A smoke-size SST-2 recipe fine-tuning the BART checkpoint `init`, labelling its transfer set with the teacher's
    bundle (fused, as bundles are by default), with a BiLSTM student."""
    return f"""\
data:
  train: {data_dir}/sst2/train.tsv
  dev: {data_dir}/sst2/dev.tsv
  label_names: [negative, positive]
  train_limit: 1500
  dev_limit: 200
model: {{family: bert, init: {init}, max_length: 48}}
finetune:
  optim: {{lr: 3.0e-3, epochs: 2, batch_size: 32, warmup_ratio: 0.1}}
transfer:
  unlabelled_files: ["{data_dir}/unlabeled/movie_reviews.txt"]
  unlabelled_max_lines: 300
  max_unlabelled: 500
  n_iter: 1
  max_augmented: 300
  max_length: 48
  labeller: teacher-fused
distill:
  deploy: bilstm
  students:
    bilstm:
      model: {{arch: bilstm, embed_dim: 16, hidden_size: 16}}
      optim: {{lr: 3.0e-3, epochs: 1, batch_size: 64}}
export:
  deploy: bilstm-fp32
  bundles:
    teacher-fused: {{source: teacher}}
    teacher-int8: {{source: teacher, precision: int8}}
    bilstm-fp32: {{source: bilstm}}
"""


def run_stages(folder, recipe_text: str, *commands: list[str]):
    """Write `recipe_text` to `folder`/bart.yaml and run each `python -m` command on it into `folder`/runs; the run
    folder and the recipe."""
    recipe = folder / "bart.yaml"
    recipe.write_text(recipe_text)
    build_stages(folder / "runs", recipe, *commands)
    return folder / "runs" / "bart", load_recipe(recipe)


@pytest.fixture(scope="module")
def bart_run(tmp_path_factory):
    """The run folder of the BART recipe after teacher, labeller, transfer set, student (no baseline) and bundles;
    its recipe."""
    from edgedistill.common import settings

    data_dir = settings.defaults()["EDGEDISTILL_DATA_DIR"]
    folder = tmp_path_factory.mktemp("bart")
    texts = (Path(data_dir) / "unlabeled" / "movie_reviews.txt").read_text(encoding="utf-8").splitlines()[:2000]
    init = write_bart(folder / "bart", texts)
    commands = (["distill", "teacher"], ["export", "labeller"], ["distill", "distill", "--no-baseline"])
    return run_stages(folder, bart_recipe(data_dir, init), *commands, ["export", "bundles"])


@pytest.fixture(scope="module")
def bart_pair_run(tmp_path_factory):
    """The run folder of a BART teacher of the synthetic pair task, `<s> A </s></s> B </s>`, and its fp32 bundle;
    its recipe."""
    folder = tmp_path_factory.mktemp("bart-pairs")
    paths = write_pair_task(folder / "data", train=1000, dev=200, unlabelled=600)
    init = write_bart(folder / "bart", paths["unlabelled"].read_text(encoding="utf-8").splitlines())
    commands = (["distill", "teacher"], ["export", "bundles", "--only", "teacher-onnx"])
    return run_stages(folder, roberta_pair_recipe(paths, init), *commands)


def served_and_pytorch(run, recipe, bundle: str, texts: list[str], pairs: list[str] | None):
    """The probabilities the server gives for `texts` (with their `pairs`) from `bundle`, and those of the teacher in
    PyTorch on them as training tokenized them: (N, C) each."""
    tokenizer = load_tokenizer(str(run / "teacher"))
    rows = list(range(len(texts)))
    batch = collate(encode(tokenizer, texts, pairs, recipe.model.max_length), rows, tokenizer.pad_token_id)
    with torch.no_grad():
        want = heads.load_teacher(run / "teacher").eval()(**batch).logits.softmax(-1).numpy()
    return served_probabilities(run / f"bundle-{bundle}", texts, pairs), want


@pytest.mark.slow
def test_a_bart_teacher_s_bundle_labels_its_transfer_set(bart_run):
    run, _ = bart_run
    assert mf.load(run / "transfer").info["labelling"]["engine"] == "onnxruntime"


@pytest.mark.slow
@pytest.mark.parametrize("bundle", ["teacher-fused", "teacher-int8"])
def test_a_bart_teacher_s_bundle_ships_its_graph_unfused(bart_run, bundle):
    run, _ = bart_run
    assert load_bundle(run / f"bundle-{bundle}").spec.fused_operators == {}


@pytest.mark.slow
def test_a_served_bart_teacher_gives_the_probabilities_of_its_pytorch_model(bart_run):
    run, recipe = bart_run
    _, dev = load_splits(recipe.data)
    served, want = served_and_pytorch(run, recipe, "teacher-fused", dev.texts[:8], None)
    np.testing.assert_allclose(served, want, atol=1e-5)


@pytest.mark.slow
def test_a_served_bart_pair_teacher_gives_the_probabilities_of_its_pytorch_model(bart_pair_run):
    run, recipe = bart_pair_run
    _, dev = load_splits(recipe.data)
    served, want = served_and_pytorch(run, recipe, "teacher-onnx", dev.texts[:8], dev.pairs[:8])
    np.testing.assert_allclose(served, want, atol=1e-5)
