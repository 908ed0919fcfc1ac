import json
import subprocess
import sys

import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common import modelcard
from edgedistill.common.recipe import load_recipe, run_dir
from edgedistill.distill import heads
from edgedistill.distill.student_stage import load_student, student_logits
from edgedistill.distill.students import (
    BiLSTMClassifier,
    CNNClassifier,
    Student,
    StudentConfig,
    TransformerClassifier,
    build_student,
)
from edgedistill.distill.tokenization import encode, load_tokenizer, train_tokenizer
from huggingface_hub import ModelCard

from tests.conftest import ROOT

ARCHS = {"bilstm": BiLSTMClassifier, "cnn": CNNClassifier, "transformer": TransformerClassifier}
TINY = dict(vocab_size=40, embed_dim=8, hidden_size=8, num_heads=2, intermediate_size=16, num_filters=4)
LABELS = ["negative", "positive"]
TEXTS = ["a gripping , funny film", "dull"]
TRAINING = (
    "edgedistill.distill.trainer",
    "edgedistill.distill.student_stage",
    "edgedistill.distill.transfer",
    "edgedistill.distill.transfer_texts",
    "edgedistill.distill.labelling",
)
# What a user runs with the pipeline absent: the student and tokenizer from the folder, logits for TEXTS.
USER_CODE = """
import json, sys
from edgedistill.distill.students import Student
from transformers import AutoTokenizer

logits = {}
for folder in sys.argv[1:]:
    model = Student.from_pretrained(folder)
    batch = AutoTokenizer.from_pretrained(folder)(TEXTS, padding=True, return_tensors="pt")
    logits[folder] = model(batch["input_ids"], batch["attention_mask"]).tolist()
modules = sorted(name for name in sys.modules if name.startswith("edgedistill"))
print(json.dumps({"logits": logits, "modules": modules}))
"""


def _saved(tmp_path, arch: str, **overrides) -> tuple[Student, str]:
    torch.manual_seed(0)
    student = build_student(StudentConfig(arch=arch, **TINY, **overrides), LABELS).eval()
    student.save_pretrained(tmp_path)
    return student, str(tmp_path)


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[2, 11, 12, 13, 3], [2, 20, 3, 0, 0]])
    return ids, (ids > 0).long()


@pytest.mark.parametrize("arch", ARCHS)
def test_from_pretrained_builds_the_architecture_its_config_names(tmp_path, arch):
    _, folder = _saved(tmp_path, arch)
    assert type(Student.from_pretrained(folder)) is ARCHS[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_from_pretrained_gives_the_saved_logits(tmp_path, arch):
    student, folder = _saved(tmp_path, arch)
    with torch.no_grad():
        torch.testing.assert_close(Student.from_pretrained(folder)(*_ids()), student(*_ids()), rtol=0, atol=0)


def test_config_json_holds_the_student_config_and_labels(tmp_path):
    student, folder = _saved(tmp_path, "cnn", pairs=True)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == student.config.model_dump(mode="json") | {"labels": LABELS}


def test_loaded_student_keeps_config_and_labels(tmp_path):
    student, folder = _saved(tmp_path, "bilstm", pooling="mean")
    loaded = Student.from_pretrained(folder)
    assert loaded.config == student.config
    assert loaded.labels == LABELS


def test_architecture_class_refuses_another_architectures_folder(tmp_path):
    _, folder = _saved(tmp_path, "cnn")
    with pytest.raises(TypeError, match="holds a cnn student"):
        BiLSTMClassifier.from_pretrained(folder)


def test_missing_weight_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = _saved(tmp_path, "cnn")
    weights = load_file(tmp_path / "model.safetensors")
    del weights["classifier.bias"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(RuntimeError, match="classifier.bias"):
        Student.from_pretrained(folder)


def test_label_names_must_match_num_labels():
    with pytest.raises(ValueError, match="3 label names for num_labels=2"):
        build_student(StudentConfig(arch="cnn", **TINY), ["a", "b", "c"])


def test_save_pretrained_card_has_the_hub_header(tmp_path):
    _saved(tmp_path, "cnn")
    data = ModelCard.load(tmp_path / "README.md").data
    assert data.library_name == "edgedistill"
    assert data.pipeline_tag == "text-classification"


@pytest.fixture(scope="module")
def user_run(smoke_run) -> dict:
    """USER_CODE run in a fresh interpreter over every smoke student."""
    folders = [str(smoke_run / f"student-{arch}") for arch in ARCHS]
    code = f"TEXTS = {TEXTS!r}\n{USER_CODE}"
    result = subprocess.run(
        [sys.executable, "-c", code, *folders], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_student_loads_without_the_pipeline_with_the_pipelines_logits(smoke_run, user_run, arch):
    folder = smoke_run / f"student-{arch}"
    student, cfg = load_student(folder)
    tokenizer = load_tokenizer(str(smoke_run / "teacher"))
    with torch.no_grad():
        expected = student_logits(student, encode(tokenizer, TEXTS, None, cfg.max_length), tokenizer.pad_token_id)
    torch.testing.assert_close(torch.tensor(user_run["logits"][str(folder)]), torch.from_numpy(expected))


@pytest.mark.slow
def test_loading_a_student_imports_no_training_code(user_run):
    assert [name for name in user_run["modules"] if name in TRAINING] == []


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_student_folder_manifest_hashes_every_file_but_the_card(smoke_run, arch):
    folder = smoke_run / f"student-{arch}"
    listed = set(mf.load(folder).files)
    on_disk = {p.name for p in folder.iterdir() if p.name not in (mf.MANIFEST, mf.CARD)}
    assert listed == on_disk


def test_the_student_cards_code_scores_a_text_longer_than_the_students_max_length(tmp_path):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    _, folder = _saved(tmp_path, "transformer", max_length=8)
    train_tokenizer("bert", TEXTS * 10, 40).save_pretrained(folder)
    lines = modelcard._usage(recipe, "student-transformer", {})
    code = "\n".join(lines[1:-1])  # inside the ```python fence
    code = code.replace(f'"{run_dir(recipe) / "student-transformer"}"', repr(folder))
    code = code.replace('"a text"', repr(" ".join(TEXTS * 5)))
    scope = {}
    exec(code, scope)
    assert tuple(scope["logits"].shape) == (1, len(LABELS))


@pytest.mark.parametrize("pair", [["its pair"], None], ids=["pair", "single"])
def test_the_teachers_card_code_gives_its_logits_for_a_text_and_a_pair_task_its_pair(tmp_path, pair):
    pairs = {} if pair is None else {"data.text_pair_column": "pair"}
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", pairs | {"finetune.pooling": "mean"})
    torch.manual_seed(0)
    config = heads.MeanPooledBertConfig(
        num_labels=2, vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
    )
    model = heads.MeanPooledBertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path)
    tokenizer = train_tokenizer("bert", ["a text and its pair", *TEXTS] * 20, 60)
    tokenizer.save_pretrained(tmp_path)
    lines = modelcard._usage(recipe, "teacher", {})
    code = "\n".join(lines[1:-1]).replace(f'"{run_dir(recipe) / "teacher"}"', repr(str(tmp_path)))  # inside the fence
    scope = {}
    exec(code, scope)
    with torch.no_grad():
        expected = model(**tokenizer(["a text"], pair, return_tensors="pt")).logits
    torch.testing.assert_close(scope["logits"].detach(), expected)
