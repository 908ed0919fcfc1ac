"""Sentence pairs with a teacher whose tokenizer gives no token types (a tiny RoBERTa): teacher, transfer set, pair
students, bundles and a served pair, the students splitting each pair by the tokenizer's sequence ids."""

import json
import subprocess

import grpc
import numpy as np
import pytest
from edgedistill.common import manifest as mf
from edgedistill.common.bundle import load_bundle
from edgedistill.common.runtime import open_runner
from edgedistill.distill.batching import collate
from edgedistill.distill.student_stage import load_student, student_logits
from edgedistill.distill.tokenization import encode, load_tokenizer
from edgedistill.serve.encoding import TextEncoder
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc

from tests.conftest import PYTHON
from tests.pair_task import LABELS, dev_pairs, run_pair_stages, share_changed_by_another_b
from tests.roberta_init import write_roberta
from tests.serve.conftest import RunningServer, served_probabilities, settings_for

STUDENTS = ("bilstm", "cnn", "transformer")
BUNDLES = ("teacher-onnx", "bilstm-fp32", "cnn-folded", "transformer-fused")


def roberta_pair_recipe(paths, init) -> str:
    """A smoke-size pair recipe fine-tuning the RoBERTa checkpoint `init`, with a BiLSTM, a CNN and a Transformer
    student (which cannot start from a RoBERTa's layers, but matches its hidden states)."""
    return f"""\
data:
  train: {paths["train"]}
  dev: {paths["dev"]}
  text_column: sentence1
  text_pair_column: sentence2
  label_names: [{", ".join(LABELS)}]
model: {{family: bert, init: {init}, max_length: 48}}
finetune:
  optim: {{lr: 3.0e-3, epochs: 4, batch_size: 32, warmup_ratio: 0.1}}
transfer:
  unlabelled_files: ["{paths["unlabelled"]}"]
  max_unlabelled: 1000
  n_iter: 1
  max_augmented: 1000
  max_length: 48
distill:
  deploy: bilstm
  students:
    bilstm:
      model: {{arch: bilstm, embed_dim: 32, hidden_size: 32}}
      optim: {{lr: 3.0e-3, epochs: 3, batch_size: 64}}
    cnn:
      model: {{arch: cnn, embed_dim: 32, num_filters: 32}}
      optim: {{lr: 3.0e-3, epochs: 3, batch_size: 64}}
    transformer:
      model: {{arch: transformer, hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}}
      init_from_teacher: false
      baseline_init_from_teacher: false
      optim: {{lr: 1.0e-3, epochs: 3, batch_size: 64}}
      losses: {{mse: 1.0, hidden: 1.0}}
export:
  deploy: bilstm-fp32
  bundles:
    teacher-onnx: {{source: teacher, fused: false}}
    bilstm-fp32: {{source: bilstm}}
    cnn-folded: {{source: cnn, fold: true}}
    transformer-fused: {{source: transformer}}
"""


@pytest.fixture(scope="module")
def roberta_run(tmp_path_factory):
    """The run folder of the RoBERTa pair task after teacher, students (no baselines) and bundles; its recipe."""
    folder = tmp_path_factory.mktemp("roberta-pairs")
    return run_pair_stages(folder, write_roberta, roberta_pair_recipe)


def bundle_probabilities(bundle, tokenizer, texts: list[str], pairs: list[str]) -> np.ndarray:
    """The bundle's model file run on the pairs as training tokenized them: softmax of its logits, (N, C)."""
    spec = load_bundle(bundle).spec
    feats = encode(tokenizer, texts, pairs, spec.max_length, student_segments=True)
    batch = collate(feats, list(range(len(texts))), spec.pad_token_id)
    runner = open_runner(bundle / spec.model_file, spec.runtime, spec.providers)
    try:
        logits = runner.infer({name: batch[name].numpy() for name in spec.input_names})["logits"]
    finally:
        runner.close()
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


@pytest.mark.slow
def test_a_transformer_student_matches_the_hidden_states_of_a_roberta_pair_teacher(roberta_run):
    # the teacher, of one token type, takes its own inputs: not the students' segment ids, 1 on sentence B
    run, _ = roberta_run
    assert mf.load(run / "student-transformer").info["losses"]["hidden"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("bundle", BUNDLES[1:])
def test_a_roberta_pair_student_bundle_splits_pairs_by_sequence_ids(roberta_run, bundle):
    run, _ = roberta_run
    assert load_bundle(run / f"bundle-{bundle}").spec.pair_segments == "sequence_ids"


@pytest.mark.slow
def test_a_roberta_teacher_bundle_takes_no_token_type_ids(roberta_run):
    run, _ = roberta_run
    assert load_bundle(run / "bundle-teacher-onnx").spec.input_names == ["input_ids", "attention_mask"]


@pytest.mark.slow
@pytest.mark.parametrize("bundle", BUNDLES[1:])
def test_the_server_gives_a_roberta_pair_the_segment_ids_of_training(roberta_run, bundle):
    run, recipe = roberta_run
    texts, pairs = dev_pairs(recipe)
    tokenizer = load_tokenizer(str(run / "teacher"))
    served = TextEncoder.for_bundle(load_bundle(run / f"bundle-{bundle}")).encode(texts, pairs)
    trained = encode(tokenizer, texts, pairs, recipe.transfer.max_length, student_segments=True)["token_type_ids"]
    assert [row["token_type_ids"].tolist() for row in served] == list(trained)


@pytest.mark.slow
@pytest.mark.parametrize("bundle", BUNDLES)
def test_a_served_roberta_pair_gets_the_bundle_s_prediction(roberta_run, bundle):
    run, recipe = roberta_run
    texts, pairs = dev_pairs(recipe, 8)
    want = bundle_probabilities(run / f"bundle-{bundle}", load_tokenizer(str(run / "teacher")), texts, pairs)
    np.testing.assert_allclose(served_probabilities(run / f"bundle-{bundle}", texts, pairs), want, atol=1e-5)


@pytest.mark.slow
def test_a_single_text_sent_to_a_roberta_pair_bundle_is_refused(roberta_run):
    run, _ = roberta_run
    server = RunningServer(settings_for(run / "bundle-bilstm-fp32"))
    try:
        with server.channel() as channel, pytest.raises(grpc.RpcError) as refused:
            classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=["a text"]), timeout=30)
    finally:
        server.close()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.slow
@pytest.mark.parametrize("name", STUDENTS)
def test_a_roberta_pair_student_reads_sentence_b(roberta_run, name):
    run, recipe = roberta_run
    texts, pairs = dev_pairs(recipe)
    assert share_changed_by_another_b(run, name, texts, pairs, recipe.transfer.max_length) > 0.2


@pytest.mark.slow
def test_a_roberta_pair_student_s_card_code_gives_its_logits_for_a_pair(roberta_run):
    run, recipe = roberta_run
    card = (run / "student-bilstm" / mf.CARD).read_text(encoding="utf-8")
    code = card.split("```python\n", 1)[1].split("```", 1)[0] + "print(logits.tolist())\n"
    shown = subprocess.run(
        [PYTHON, "-c", code], cwd=run.parent.parent, capture_output=True, text=True, timeout=120, check=True
    )
    student, _ = load_student(run / "student-bilstm")
    tokenizer = load_tokenizer(str(run / "teacher"))
    feats = encode(tokenizer, ["a text"], ["its pair"], recipe.transfer.max_length, student_segments=True)
    np.testing.assert_allclose(
        json.loads(shown.stdout), student_logits(student, feats, tokenizer.pad_token_id), atol=1e-5
    )
