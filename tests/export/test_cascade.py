"""Cascade thresholds and temperatures on problems with a known answer, and the cascade stage on the smoke run."""

import contextlib
import io
import json
import shutil

import numpy as np
import pytest
from edgedistill.common import manifest as mf
from edgedistill.common.cascade import is_cascade, load_cascade, route
from edgedistill.common.config.export import CascadeRecipe
from edgedistill.common.data import DEV_EXAMPLES, load_splits
from edgedistill.common.recipe import load_recipe, parse_overrides
from edgedistill.common.runtime import available_providers
from edgedistill.common.stage import Inputs
from edgedistill.distill.tokenization import load_tokenizer
from edgedistill.export import cascade as export_cascade
from edgedistill.export import stages, validate
from edgedistill.export.cascade import Member, calibration_texts, choose_threshold, fit_routing, fit_temperature
from edgedistill.export.onnx_export import ExportError

from tests.conftest import ROOT, run_here
from tests.pair_task import pair_recipe, write_pair_task
from tests.serve.conftest import write_bundle

SMOKE = ROOT / "recipes" / "smoke.yaml"
# A cascade of the smoke recipe whose second member runs on CUDA only.
GPU_CASCADE = ["--export.cascades.gpu-cascade.members=[bilstm-int8,teacher-cuda-fp16]"]
cuda_offered = "CUDAExecutionProvider" in available_providers()


def test_threshold_keeps_the_most_confident_texts_within_the_allowed_disagreement():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    agrees = np.array([True, True, False, True, True])
    assert choose_threshold(scores, agrees, 0.9) == (0.8, 0.4)


def test_threshold_keeps_everything_when_the_target_allows_it():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    agrees = np.array([True, True, False, True, True])
    assert choose_threshold(scores, agrees, 0.8) == (0.5, 1.0)


def test_threshold_never_splits_tied_scores():
    scores = np.array([0.9, 0.9, 0.5])
    agrees = np.array([True, False, True])
    assert choose_threshold(scores, agrees, 0.9) == (float("inf"), 0.0)


def test_fit_temperature_recovers_the_temperature_that_made_the_labels():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (20_000, 3))
    p = np.exp(logits / 2.0)
    p /= p.sum(1, keepdims=True)
    labels = np.array([rng.choice(3, p=row) for row in p])
    assert fit_temperature(logits, labels) == pytest.approx(2.0, rel=0.1)


def test_routing_refuses_a_member_no_calibration_text_reaches():
    last = np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    cfg = CascadeRecipe(members=["first", "middle", "last"], target_agreement=0.5, temperature_scaling=False)
    with pytest.raises(ExportError, match="middle: no calibration text reaches it"):
        fit_routing([last, last, last], cfg, "c")


def test_routing_refuses_a_last_member_no_calibration_text_reaches():
    last = np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    cfg = CascadeRecipe(members=["first", "last"], target_agreement=0.5, temperature_scaling=False)
    with pytest.raises(ExportError, match="last: no calibration text reaches it"):
        fit_routing([last, last], cfg, "c")


def test_a_last_member_no_text_reaches_as_the_others_answer_all_as_it_does_names_dropping_the_cascade():
    last = np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    cfg = CascadeRecipe(members=["first", "last"], target_agreement=1.0, temperature_scaling=False)
    no_target = r"as last does, so that no target_agreement \(1\.0 included\) passes one on: drop the cascade "
    with pytest.raises(ExportError, match=no_target + r"\(export\.cascades\.c: null\), or calibrate on more texts"):
        fit_routing([last, last], cfg, "c")


def test_a_last_member_no_text_reaches_as_the_others_answer_some_unlike_it_names_raising_the_target():
    first = np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    last = np.array([[2.0, 0.0], [0.0, 2.0], [0.0, 2.0]])
    cfg = CascadeRecipe(members=["first", "last"], target_agreement=0.5, temperature_scaling=False)
    with pytest.raises(ExportError, match="answering 1 of them unlike last: raise target_agreement, which passes"):
        fit_routing([first, last], cfg, "c")


def test_routing_refuses_a_member_that_keeps_no_calibration_text():
    first = np.array([[5.0, 0.0], [0.0, 1.0], [1.0, 0.0]])  # surest where it disagrees with the last member
    last = np.array([[0.0, 2.0], [0.0, 2.0], [2.0, 0.0]])
    cfg = CascadeRecipe(members=["first", "last"], target_agreement=1.0, temperature_scaling=False)
    with pytest.raises(ExportError, match="first keeps none of the 3 calibration texts"):
        fit_routing([first, last], cfg, "c")


@pytest.mark.parametrize("member", [0, 1])
def test_routing_refuses_a_member_with_a_non_finite_calibration_logit_naming_it_and_the_count(member):
    calibration = [np.array([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0]]) for _ in range(2)]
    calibration[member][1:, 0] = [np.nan, np.inf]
    cfg = CascadeRecipe(members=["first", "last"], target_agreement=0.5)
    name = cfg.members[member]
    with pytest.raises(ExportError, match=f"member {name} gives a non-finite logit .* on 2 of the 3 calibration"):
        fit_routing(calibration, cfg, "c")


@pytest.fixture(scope="module")
def smoke_cascade(smoke_bundles):
    return smoke_bundles / "bundle-bilstm-cascade"


def test_smoke_run_builds_its_cascade(smoke_cascade):
    assert is_cascade(smoke_cascade)


def test_a_cascade_is_served_as_the_version_of_its_spec(smoke_cascade):
    spec = load_cascade(smoke_cascade).spec
    assert spec.version == spec.content_versioned().version


def test_cascade_answers_equal_its_members_routed_by_hand(smoke_cascade, smoke_bundles):
    cascade = load_cascade(smoke_cascade)
    recipe = load_recipe(SMOKE)
    tokenizer = load_tokenizer(str(smoke_bundles / "teacher"))
    _, dev = load_splits(recipe.data)
    logits = [Member(bundle.folder).logits(tokenizer, dev.texts, dev.pairs) for bundle in cascade.members]
    answers, _ = route(logits, cascade.spec)
    accuracy = float((answers.argmax(-1) == np.asarray(dev.labels)).mean())
    assert accuracy == cascade.manifest.metrics["dev_accuracy"]


def test_a_cascade_records_the_dev_examples_its_figures_were_measured_on(smoke_cascade):
    recorded = mf.load(smoke_cascade).info[DEV_EXAMPLES]
    assert recorded == load_splits(load_recipe(SMOKE).data)[1].digest()


def test_cascade_escalates_a_share_between_none_and_all(smoke_cascade):
    escalated = mf.load(smoke_cascade).metrics["dev_escalated"]
    assert 0 < escalated < 1


def test_cascade_manifest_counts_the_calibration_texts_not_the_dev_texts(smoke_cascade):
    recipe = load_recipe(SMOKE)
    texts, _ = calibration_texts(recipe, recipe.export.cascades["bilstm-cascade"].calibration_sentences)
    assert mf.load(smoke_cascade).metrics["calibration_texts"] == len(texts)


def test_cascade_curve_in_the_manifest_escalates_more_as_the_threshold_rises(smoke_cascade):
    curve = mf.load(smoke_cascade).info["curve"]
    escalated = [point["escalated"] for point in curve]
    assert escalated == sorted(escalated)


def test_cascade_with_a_corrupt_member_is_refused(smoke_cascade, tmp_path):

    copy = tmp_path / "cascade"
    shutil.copytree(smoke_cascade, copy)
    model = copy / "members" / "bilstm-int8" / "model.onnx"
    model.write_bytes(model.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(mf.ArtifactError, match="sha256"):
        load_cascade(copy)


def test_a_cascade_whose_member_manifest_was_edited_fails_its_own_verification(smoke_cascade, tmp_path):
    copy = tmp_path / "cascade"
    shutil.copytree(smoke_cascade, copy)
    member = copy / "members" / "teacher-fused" / mf.MANIFEST
    member.write_text(member.read_text() + " ")
    with pytest.raises(mf.ArtifactError, match="members/teacher-fused/manifest.json has"):
        mf.load(copy)


def test_cascade_with_a_member_rebuilt_since_is_refused(smoke_cascade, tmp_path):

    copy = tmp_path / "cascade"
    shutil.copytree(smoke_cascade, copy)
    member = copy / "members" / "teacher-fused" / mf.MANIFEST
    member.write_text(member.read_text().replace('"recipe"', '"recipe" ', 1))
    manifest = json.loads((copy / mf.MANIFEST).read_text())  # the cascade's own listing of it made to agree
    entry = {"sha256": mf.sha256_file(member), "size_bytes": member.stat().st_size}
    manifest["files"]["members/teacher-fused/manifest.json"] = entry
    (copy / mf.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(mf.ArtifactError, match="not the bundle the cascade was built with"):
        load_cascade(copy)


def load_recipe_of(folder, paths):
    """The smoke-size pair recipe of the task in `paths`, its transfer set reading the first 10 unlabelled lines."""
    (folder / "pairs.yaml").write_text(pair_recipe(paths), encoding="utf-8")
    return load_recipe(folder / "pairs.yaml", {"transfer.unlabelled_max_lines": 10})


def test_pair_calibration_reads_on_past_lines_that_hold_no_pair(tmp_path):
    paths = write_pair_task(tmp_path / "task", train=40, dev=20, unlabelled=0)
    window = [f"window sentence {i} ." for i in range(10)]
    single = [f"lonely sentence {i} ." for i in range(200)]  # one sentence each: no adjacent pair
    double = [f"first half {i} . second half {i} ." for i in range(200)]
    paths["unlabelled"].write_text("\n".join(window + single + double) + "\n", encoding="utf-8")
    texts, pairs = calibration_texts(load_recipe_of(tmp_path, paths), 150)
    assert pairs[:2] == ["second half 0 .", "second half 1 ."]
    assert len(texts) == 150


def test_pair_calibration_drops_the_pairs_of_a_dev_sentence_rather_than_pairing_across_it(tmp_path):
    paths = write_pair_task(tmp_path / "task", train=40, dev=20, unlabelled=0)
    dev_sentence = load_splits(load_recipe_of(tmp_path, paths).data)[1].texts[0]
    window = [f"window sentence {i} ." for i in range(10)]
    around = f"the sentence before . {dev_sentence} the sentence after ."
    double = [f"first half {i} . second half {i} ." for i in range(200)]
    paths["unlabelled"].write_text("\n".join([*window, around, *double]) + "\n", encoding="utf-8")
    texts, pairs = calibration_texts(load_recipe_of(tmp_path, paths), 150)
    assert ("the sentence before .", "the sentence after .") not in zip(texts, pairs, strict=True)


def test_calibration_leaves_out_an_unlabelled_sentence_of_the_test_split(tmp_path):
    test_sentence = "a quietly moving portrait of a family at war ."
    (tmp_path / "test.tsv").write_text(f"sentence\tlabel\n{test_sentence}\t1\n", encoding="utf-8")
    lines = [f"filler sentence number {i} ." for i in range(200)]
    (tmp_path / "unlabelled.txt").write_text("\n".join([*lines[:10], test_sentence, *lines[10:]]) + "\n")
    overrides = {
        "data.test": str(tmp_path / "test.tsv"),
        "transfer.unlabelled_files": [str(tmp_path / "unlabelled.txt")],
    }
    texts, _ = calibration_texts(load_recipe(SMOKE, {**overrides, "transfer.unlabelled_max_lines": 10}), 150)
    assert test_sentence not in texts


def test_calibration_reads_the_dev_split_without_the_train_split(tmp_path):
    paths = write_pair_task(tmp_path / "task", train=40, dev=20, unlabelled=200)
    recipe = load_recipe_of(tmp_path, paths)
    paths["train"].write_text("sentence1\tsentence2\tlabel\ngood\tfine\tmaybe\n", encoding="utf-8")
    assert len(calibration_texts(recipe, 150)[0]) == 150


def test_calibration_short_of_unlabelled_text_says_how_many_lines_it_read(tmp_path):
    paths = write_pair_task(tmp_path / "task", train=40, dev=20, unlabelled=0)
    lines = [f"first half {i} . second half {i} ." for i in range(30)]  # one pair each
    paths["unlabelled"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ExportError, match="found 20 unlabelled texts in the 20 lines of"):
        calibration_texts(load_recipe_of(tmp_path, paths), 150)


def test_a_member_runs_the_model_it_verified_not_a_file_swapped_in_since(swapped_after_check, smoke_bundles):
    folder = swapped_after_check(export_cascade)
    tokenizer = load_tokenizer(smoke_bundles / "teacher")
    assert Member(folder).logits(tokenizer, ["a gripping film"], None).shape == (1, 2)


def test_a_member_opens_its_bundle_for_the_batch_its_dev_pass_runs(tmp_path, monkeypatch):
    asked, open_bundle = [], export_cascade.open_bundle

    def open_recorded(bundle, **kwargs):
        asked.append(kwargs.get("max_batch"))
        return open_bundle(bundle, **kwargs)

    monkeypatch.setattr(export_cascade, "open_bundle", open_recorded)
    with Member(write_bundle(tmp_path / "bundle-tiny")):
        assert asked == [validate.DEV_BATCH]


class ClosingRecorded:
    """A member's runner, as `open_bundle` gave it, that notes whether it was closed."""

    def __init__(self, runner):
        self.runner, self.closed = runner, False

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def close(self) -> None:
        self.closed = True
        self.runner.close()


def recorded_openings(monkeypatch, fail_opening: int | None = None) -> list[ClosingRecorded]:
    """The runners `export.cascade` opens from now on, in order; the `fail_opening`-th (from 0) fails to open."""
    opened, open_bundle = [], export_cascade.open_bundle

    def open_recorded(*args, **kwargs):
        if len(opened) == fail_opening:
            raise RuntimeError("out of device memory")
        opened.append(ClosingRecorded(open_bundle(*args, **kwargs)))
        return opened[-1]

    monkeypatch.setattr(export_cascade, "open_bundle", open_recorded)
    return opened


def build_smoke_cascade(smoke_bundles, monkeypatch) -> None:
    """The smoke cascade's build (what it would publish is left unwritten)."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    cascade = stages.cascade(load_recipe(SMOKE), "bilstm-cascade")
    cascade.build(cascade.inputs())


def test_building_a_cascade_closes_every_member_it_opened(smoke_bundles, monkeypatch):
    opened = recorded_openings(monkeypatch)
    build_smoke_cascade(smoke_bundles, monkeypatch)
    assert [runner.closed for runner in opened] == [True, True]


def test_a_cascade_whose_last_member_fails_to_open_closes_those_opened_before(smoke_bundles, monkeypatch):
    opened = recorded_openings(monkeypatch, fail_opening=1)
    with pytest.raises(RuntimeError, match="out of device memory"):
        build_smoke_cascade(smoke_bundles, monkeypatch)
    assert [runner.closed for runner in opened] == [True]


SHORT = 150  # calibration texts in the unlabelled file of `short_of_calibration`, which asks for 20,000


@pytest.fixture(scope="module")
def short_of_calibration(smoke_bundles, tmp_path_factory):
    """The smoke cascade's build on an unlabelled file of 10 lines the transfer set reads and SHORT sentences past
    them (the smoke cascade's first calibration texts), asked for 20,000: what it printed and its metrics."""
    folder = tmp_path_factory.mktemp("short")
    smoke = load_recipe(SMOKE)
    texts, _ = calibration_texts(smoke, SHORT)
    window = [f"window sentence {i} ." for i in range(10)]
    (folder / "unlabelled.txt").write_text("\n".join(window + texts) + "\n", encoding="utf-8")
    overrides = {
        "transfer.unlabelled_files": [str(folder / "unlabelled.txt")],
        "transfer.unlabelled_max_lines": 10,
        "export.cascades.bilstm-cascade.calibration_sentences": 20_000,
    }
    members = smoke.export.cascades["bilstm-cascade"].members
    parents = {"teacher": smoke_bundles / "teacher"} | {f"bundle-{m}": smoke_bundles / f"bundle-{m}" for m in members}
    inputs = Inputs(load_recipe(SMOKE, overrides), "h", folder / "work", False, {}, parents, "k", folder / "cascade")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        built = export_cascade.build_stage(inputs, name="bilstm-cascade")
    return printed.getvalue(), built.metrics


def test_calibration_short_of_the_texts_asked_for_warns_with_both_numbers(short_of_calibration):
    printed, _ = short_of_calibration
    assert f"warning: cascade calibration found {SHORT} of the 20000 unlabelled texts" in printed


def test_calibration_short_of_the_texts_asked_for_records_both_numbers(short_of_calibration):
    _, metrics = short_of_calibration
    assert (metrics["calibration_texts"], metrics["calibration_texts_asked"]) == (SHORT, 20_000)


def test_the_stage_line_gives_each_members_accuracy_to_four_places():
    line = export_cascade.members_line({"bilstm-int8": 0.7066666666666667, "teacher-fused": 0.69})
    assert line == "bilstm-int8 0.7067, teacher-fused 0.6900"


@pytest.mark.skipif(cuda_offered, reason="checks a cascade left out where this onnxruntime build offers no CUDA")
def test_a_cascade_of_a_bundle_this_machine_cannot_run_is_left_out_with_the_reason(smoke_bundles, monkeypatch):
    recipe = load_recipe(SMOKE, parse_overrides(GPU_CASCADE))
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    result = run_here("export", "bundles", SMOKE, *GPU_CASCADE)
    assert result.returncode == 0, result.stderr
    reason = stages.missing_for(recipe, "teacher-cuda-fp16")
    assert f"[bundle-gpu-cascade] not built here: member teacher-cuda-fp16: {reason}" in result.stdout


@pytest.mark.skipif(cuda_offered, reason="checks a cascade refused where this onnxruntime build offers no CUDA")
def test_a_cascade_of_a_bundle_this_machine_cannot_run_named_with_only_fails_with_the_whole_error(
    smoke_bundles, monkeypatch
):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    assert run_here("export", "bundles", SMOKE, *GPU_CASCADE, "--only=gpu-cascade").returncode == 2


@pytest.mark.skipif(cuda_offered, reason="checks a cascade refused where this onnxruntime build offers no CUDA")
def test_a_cascade_named_with_only_that_this_machine_cannot_run_names_the_member_and_why(smoke_bundles, monkeypatch):
    recipe = load_recipe(SMOKE, parse_overrides(GPU_CASCADE))
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
    result = run_here("export", "bundles", SMOKE, *GPU_CASCADE, "--only=gpu-cascade")
    reason = stages.missing_for(recipe, "teacher-cuda-fp16")
    assert f"error: cascade gpu-cascade: member teacher-cuda-fp16: {reason}" in result.stderr
