"""`python -m bench accuracy`: the dev split through a real server by both APIs, against the bundle's own predictions and
dev accuracy."""

import contextlib
import io
import json
import os
import types
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from edgedistill.bench import accuracy
from edgedistill.bench.__main__ import main
from edgedistill.bench.accuracy import AccuracyResult
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.common import manifest as mf
from edgedistill.common.config.training import DataConfig
from edgedistill.common.data import DEV_EXAMPLES, Examples, load_labelled
from edgedistill.export.quantize import int8_dynamic

from tests.serve.conftest import ROOT, pair_spec, tiny_model, write_bundle, write_cascade

SMOKE = ROOT / "recipes" / "smoke.yaml"
# The tiny model labels by its sentiment words; the last example's label is wrong, so 7 of 8 are right.
SINGLE_DEV = (
    "sentence\tlabel\ngreat fun\t1\ni love it\t1\nwonderful acting\t1\nthe best film\t1\n"
    "awful plot\t0\nboring and dull\t0\nworst movie\t0\ngreat film\t0\n"
)
# The pair decides; quotes stay as they are (no quoting in TSV); the last label is wrong: 3 of 4 right.
PAIR_DEV = (
    "sentence1\tsentence2\tlabel\n"
    'he said " good\tawful awful\t0\n'
    'awful\t"great" fun\t1\n'
    "the plot\tworst acting\t0\n"
    "dull\tgood film\t0\n"
)


def bench_accuracy(bundle, dev, runs, *extra: str) -> int:
    """`python -m bench accuracy recipes/smoke.yaml` on `bundle` with `dev` as the dev split, in `runs`."""
    argv = ["accuracy", str(SMOKE), "--bundle", str(bundle), f"--data.dev={dev}", *extra]
    with pytest.MonkeyPatch.context() as env:
        for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
            env.delenv(name)
        env.setenv("EDGEDISTILL_RUNS_DIR", str(runs))
        return main(argv)


@pytest.fixture(scope="module")
def single_dev(tmp_path_factory):
    path = tmp_path_factory.mktemp("dev") / "dev.tsv"
    path.write_text(SINGLE_DEV)
    return path


@pytest.fixture(scope="module")
def served_run(tmp_path_factory, single_dev):
    """One `--check` run on a bundle whose manifest says 0.875, and its exit status."""
    bundle = write_bundle(tmp_path_factory.mktemp("bundles") / "bundle-tiny", metrics={"dev_accuracy": 0.875})
    runs = tmp_path_factory.mktemp("runs")
    code = bench_accuracy(bundle, single_dev, runs, "--check")
    return code, runs / "smoke" / "serve-accuracy-tiny", bundle


def test_served_accuracy_equal_to_the_bundles_passes_the_check(served_run):
    code, folder, _ = served_run
    assert code == 0
    assert AccuracyResult.load(folder).passed


@pytest.mark.parametrize("api", ["classify", "kserve"])
def test_each_api_is_measured_on_the_whole_dev_split(served_run, api):
    figures = AccuracyResult.load(served_run[1]).apis[api]
    assert figures.correct == 7
    assert figures.accuracy == 0.875


@pytest.mark.parametrize("api", ["classify", "kserve"])
def test_each_api_predicts_as_the_bundle_run_in_process(served_run, api):
    assert AccuracyResult.load(served_run[1]).apis[api].differing == 0


# What the tiny model predicts on SINGLE_DEV: right but for the last example.
SERVED = [1, 1, 1, 1, 0, 0, 0, 1]


def own_logits(labels: list[int], gap: float | list[float]) -> np.ndarray:
    """Logits whose argmax is `labels`, the top two `gap` apart (one for all, or one per example): the bundle's own
    predictions, as a test sets them."""
    logits = np.zeros((len(labels), 2), np.float32)
    logits[np.arange(len(labels)), labels] = gap
    return logits


def check_against(
    tmp_path, single_dev, monkeypatch, labels: list[int], gap: float | list[float], dev_accuracy: float = 0.875
) -> tuple[int, AccuracyResult]:
    """A `--check` run on a bundle of `dev_accuracy` whose own predictions are `labels`, `gap` sure."""
    monkeypatch.setattr(accuracy, "member_logits", lambda folder, examples, size: {folder: own_logits(labels, gap)})
    bundle = write_bundle(tmp_path / "bundle-tiny", metrics={"dev_accuracy": dev_accuracy})
    code = bench_accuracy(bundle, single_dev, tmp_path / "runs", "--check")
    return code, AccuracyResult.load(tmp_path / "runs" / "smoke" / "serve-accuracy-tiny")


class Checked(NamedTuple):
    """A `check_against` run: its exit status, its result, the result's folder and what the command said on stderr."""

    code: int
    result: AccuracyResult
    folder: Path
    said: str


@pytest.fixture(scope="module")
def checked(tmp_path_factory, single_dev):
    """`checked(labels, gap, dev_accuracy=0.875) -> Checked`: the `check_against` run of those arguments, run once for
    the module's tests that read it (each in a folder of its own)."""
    runs: dict[tuple, Checked] = {}

    def check(labels: list[int], gap: float | list[float], dev_accuracy: float = 0.875) -> Checked:
        key = (tuple(labels), tuple(gap) if isinstance(gap, list) else gap, dev_accuracy)
        if key not in runs:
            folder, err = tmp_path_factory.mktemp("checked"), io.StringIO()
            with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stderr(err):
                code, result = check_against(folder, single_dev, monkeypatch, labels, gap, dev_accuracy)
            runs[key] = Checked(code, result, folder / "runs" / "smoke" / "serve-accuracy-tiny", err.getvalue())
        return runs[key]

    return check


# The bundle's own: wrong on the first example, right on the last; served: the other way round.
UNLIKE = [0, 1, 1, 1, 0, 0, 0, 0]


def test_served_predictions_unlike_the_bundles_fail_the_check_though_as_many_are_right(checked):
    assert checked(UNLIKE, gap=5.0).code == 1


def test_served_predictions_unlike_the_bundles_are_counted_per_api(checked):
    result = checked(UNLIKE, gap=5.0).result
    assert {api: f.differing for api, f in result.apis.items()} == {"classify": 2, "kserve": 2}


def test_served_accuracy_still_matches_when_predictions_differ_in_ways_that_cancel(checked):
    result = checked(UNLIKE, gap=5.0).result
    assert all(f.matches_own for f in result.apis.values())


def test_the_markdown_counts_the_predictions_unlike_the_bundles(checked):
    report = (checked(UNLIKE, gap=5.0).folder / "accuracy.md").read_text()
    assert "| Classify predictions unlike the bundle's | 2 |" in report


def test_the_markdown_says_a_tie_flip_is_a_label_within_the_margin_of_the_bundles_top(checked):
    report = (checked(UNLIKE, gap=5.0).folder / "accuracy.md").read_text()
    assert "near-ties aside: a label within 0.1 of the bundle's top, export.tie_margin" in report


def test_a_measured_near_tie_margin_is_named_as_the_change_of_a_gap_between_two_logits():
    result = types.SimpleNamespace(tie_margin=0.1, grouping_margin=0.494, bundle={"kind": "bundle"})
    assert accuracy.margin_text(result).endswith(
        "how far batch-mates moved the gap between two logits of this per-batch quantized bundle"
    )


def test_a_cascades_measured_near_tie_margin_is_named_as_its_quantized_members():
    result = types.SimpleNamespace(tie_margin=0.1, grouping_margin=0.494, bundle={"kind": "cascade"})
    assert accuracy.margin_text(result).endswith(
        "how far batch-mates moved the gap between two logits of a per-batch quantized member of this cascade"
    )


def test_a_served_prediction_unlike_the_bundles_at_a_near_tie_passes(checked):
    labels = [*SERVED[:-1], 0]  # the last example a near-tie of the bundle's (export.tie_margin 0.1)
    assert checked(labels, gap=0.05).code == 0


def test_a_near_tie_flip_is_counted_as_one(checked):
    labels = [*SERVED[:-1], 0]
    result = checked(labels, gap=0.05).result
    assert result.apis["classify"].differing == 1
    assert result.apis["classify"].tie_flips == 1


# The last example a near-tie of the bundle's own (export.tie_margin 0.1), the others sure.
LAST_NEAR_TIE = [5.0] * 7 + [0.05]
FIRST_NEAR_TIE = [0.05] + [5.0] * 7


def test_a_count_another_padding_moved_at_a_near_tie_the_bundle_answers_wrong_passes(checked):
    # served as the bundle's own (7 of 8 right); the export stage's batches put the last near-tie the right way: 8
    assert checked(SERVED, LAST_NEAR_TIE, dev_accuracy=1.0).code == 0


def test_a_passed_check_records_no_verdict_of_an_api_that_failed(checked):
    # served 7 right, the export stage's count 8: the near-tie allows it
    apis = json.loads((checked(SERVED, LAST_NEAR_TIE, dev_accuracy=1.0).folder / "accuracy.json").read_text())["apis"]
    assert all(value for figures in apis.values() for value in figures.values() if isinstance(value, bool))


def test_a_binary_tie_flip_passes_though_it_changes_the_count(checked):
    # the bundle's own right on all 8, as the export stage counted; served wrong on the last, a near-tie: 7
    assert checked([*SERVED[:-1], 0], LAST_NEAR_TIE, dev_accuracy=1.0).code == 0


def test_a_count_beyond_the_near_ties_that_could_move_it_fails(checked):
    # the only near-tie is answered right, so no padding makes the bundle's own 7 right the export stage's 8
    assert checked(SERVED, FIRST_NEAR_TIE, dev_accuracy=1.0).code == 1


def test_a_failed_count_says_which_part_failed_and_by_how_much(checked):
    said = "the bundle's dev_accuracy counts 8 correct, its own predictions 7: 1 more than their 0 near-ties answered"
    assert said in checked(SERVED, FIRST_NEAR_TIE, dev_accuracy=1.0).said


def test_served_predictions_unlike_the_bundles_say_how_many_per_api(checked):
    assert "KServe ModelInfer: 2 predictions unlike the bundle's own, near-ties aside" in checked(UNLIKE, gap=5.0).said


@pytest.mark.parametrize(
    ("field", "value"),
    [("correct", 7), ("near_ties", 1), ("may_lose", 0), ("may_gain", 1), ("matches_bundle", True)],
)
def test_the_bundles_own_figures_are_recorded(checked, field, value):
    assert getattr(checked(SERVED, LAST_NEAR_TIE, dev_accuracy=1.0).result.own, field) == value


def test_the_bundles_dev_accuracy_is_recorded_as_a_count(checked):
    assert checked(SERVED, LAST_NEAR_TIE, dev_accuracy=1.0).result.bundle_dev_correct == 8


def test_the_markdown_gives_the_range_the_near_ties_allow(checked):
    report = (checked(SERVED, LAST_NEAR_TIE, dev_accuracy=1.0).folder / "accuracy.md").read_text()
    assert "| bundle (export stage) correct | 8 | 7 to 8: the bundle's own 7," in report


# Three labels; gold 0. Rows: right and sure; right at a near-tie; wrong at a near-tie with gold the runner-up;
# wrong at a near-tie of two other labels, gold far below.
THREE_LABELS = np.array([[3.0, 0.0, 0.0], [1.0, 0.95, 0.0], [0.95, 1.0, 0.0], [0.0, 1.0, 0.95]], np.float32)


@pytest.mark.parametrize(("field", "value"), [("correct", 2), ("near_ties", 3), ("may_lose", 1), ("may_gain", 1)])
def test_only_near_ties_within_reach_of_gold_may_gain(field, value):
    assert getattr(accuracy.own_accuracy([0, 0, 0, 0], THREE_LABELS, 0.1, 2), field) == value


@pytest.mark.parametrize(("expected", "matches"), [(0, False), (1, True), (3, True), (4, False)])
def test_the_export_stages_count_may_lie_only_as_far_as_the_near_ties_reach(expected, matches):
    assert accuracy.own_accuracy([0, 0, 0, 0], THREE_LABELS, 0.1, expected).matches_bundle is matches


def test_a_served_label_far_below_the_bundles_near_tie_is_no_tie_flip():
    # the bundle's top two within 0.05; the served label, the third, 1.0 below its top
    assert accuracy.compare([2], [0], THREE_LABELS[1:2], 0.1).tie_flips == 0


def test_a_served_label_within_reach_of_the_bundles_top_is_a_tie_flip():
    assert accuracy.compare([1], [0], THREE_LABELS[1:2], 0.1).tie_flips == 1


def test_a_cascades_own_predictions_are_routed_as_the_server_routes_them(tmp_path):
    tiny = write_bundle(tmp_path / "bundle-tiny")  # sure (max_prob over 0.9) of texts with two sentiment words
    sure = write_bundle(tmp_path / "bundle-sure", bias=10.0)  # sure of "negative" for every text
    cascade = write_cascade(tmp_path / "bundle-cascade", {"tiny": tiny, "sure": sure}, thresholds=[0.9])
    # answered by tiny, escalated to sure (no sentiment word), answered by tiny
    examples = Examples(["great fun", "the plot", "awful boring"], None, None, "test")
    first, last = BundleClassifier(tiny).logits(examples.texts), BundleClassifier(sure).logits(examples.texts)
    expected = np.stack([first[0], last[1], first[2]])
    np.testing.assert_allclose(
        accuracy.routed(cascade, accuracy.member_logits(cascade, examples, 2)), expected, atol=1e-6
    )


def test_the_result_is_an_artifact_with_the_bundle_as_parent(served_run):
    _, folder, bundle = served_run
    manifest = mf.load(folder)
    assert sorted(manifest.files) == ["accuracy.json", "accuracy.md", "server.log"]
    assert manifest.parents["bundle"].path == str(bundle.resolve())


def test_the_markdown_gives_both_apis_and_the_bundle(served_run):
    report = (served_run[1] / "accuracy.md").read_text()
    assert "| Classify | 7 / 8 | 0.8750 |" in report
    assert "| KServe ModelInfer | 7 / 8 | 0.8750 |" in report
    assert "| bundle (export stage) |  | 0.8750 |" in report


def test_each_bundle_keeps_its_own_result(tmp_path, single_dev):
    checked = {"tiny": 0.875, "other": 1.0}
    for name, figure in checked.items():
        bundle = write_bundle(tmp_path / f"bundle-{name}", metrics={"dev_accuracy": figure})
        bench_accuracy(bundle, single_dev, tmp_path / "runs")
    kept = {name: AccuracyResult.load(tmp_path / "runs" / "smoke" / f"serve-accuracy-{name}") for name in checked}
    assert {name: result.bundle_dev_accuracy for name, result in kept.items()} == checked


def test_a_served_accuracy_unlike_the_bundles_fails_the_check(tmp_path, single_dev):
    bundle = write_bundle(tmp_path / "bundle-tiny", metrics={"dev_accuracy": 1.0})
    assert bench_accuracy(bundle, single_dev, tmp_path / "runs", "--check") == 1
    result = AccuracyResult.load(tmp_path / "runs" / "smoke" / "serve-accuracy-tiny")
    assert not result.passed
    assert result.bundle_dev_accuracy == 1.0


def test_without_check_a_difference_still_exits_0(tmp_path, single_dev):
    bundle = write_bundle(tmp_path / "bundle-tiny", metrics={"dev_accuracy": 1.0})
    assert bench_accuracy(bundle, single_dev, tmp_path / "runs") == 0


def test_a_dev_limit_serves_only_that_many_dev_texts(tmp_path, single_dev):
    measured_on = dev_examples(single_dev, limit=4)  # as the export stage under the same dev_limit records them
    bundle = write_bundle(tmp_path / "bundle-tiny", metrics={"dev_accuracy": 1.0}, info=measured_on)
    assert bench_accuracy(bundle, single_dev, tmp_path / "runs", "--data.dev_limit=4", "--check") == 0
    assert AccuracyResult.load(tmp_path / "runs" / "smoke" / "serve-accuracy-tiny").texts["count"] == 4


def test_pairs_go_through_both_apis(tmp_path):
    dev = tmp_path / "dev.tsv"
    dev.write_text(PAIR_DEV)
    bundle = write_bundle(tmp_path / "bundle-pairs", metrics={"dev_accuracy": 0.75}, **pair_spec())
    columns = ["--data.text_column=sentence1", "--data.text_pair_column=sentence2"]
    assert bench_accuracy(bundle, dev, tmp_path / "runs", *columns, "--check") == 0
    result = AccuracyResult.load(tmp_path / "runs" / "smoke" / "serve-accuracy-pairs")
    assert result.texts["pairs"]
    assert {api: f.correct for api, f in result.apis.items()} == {"classify": 3, "kserve": 3}


def test_a_pair_split_for_a_single_text_bundle_exits_2(tmp_path, capsys):
    dev = tmp_path / "dev.tsv"
    dev.write_text(PAIR_DEV)
    bundle = write_bundle(tmp_path / "bundle-tiny", metrics={"dev_accuracy": 0.75})
    columns = ["--data.text_column=sentence1", "--data.text_pair_column=sentence2"]
    assert bench_accuracy(bundle, dev, tmp_path / "runs", *columns) == 2
    assert "the model takes single texts" in capsys.readouterr().err


def test_a_bundle_without_dev_accuracy_exits_2(tmp_path, single_dev, capsys):
    bundle = write_bundle(tmp_path / "bundle-tiny")
    assert bench_accuracy(bundle, single_dev, tmp_path / "runs") == 2
    assert "no dev_accuracy" in capsys.readouterr().err


def measured_cascade(folder: Path, members: dict[str, Path], dev_accuracy: float) -> Path:
    """A cascade of `members` (the first's threshold 0.9) whose manifest gives `dev_accuracy`, as the export stage
    records it."""
    cascade = write_cascade(folder, members, thresholds=[0.9])
    manifest = json.loads((cascade / mf.MANIFEST).read_text())
    manifest["metrics"]["dev_accuracy"] = dev_accuracy
    (cascade / mf.MANIFEST).write_text(json.dumps(manifest))
    return cascade


def test_a_bundle_whose_labels_are_not_the_recipes_is_refused_naming_both(tmp_path, single_dev, capsys):
    bundle = write_bundle(tmp_path / "bundle-tiny", metrics={"dev_accuracy": 0.875}, labels=["positive", "negative"])
    assert bench_accuracy(bundle, single_dev, tmp_path / "runs") == 2
    said = "answers with the labels ['positive', 'negative'], and the recipe's data.label_names are ['negative', 'positive']"
    assert said in capsys.readouterr().err


def test_a_label_names_override_unlike_the_cascades_labels_is_refused(tmp_path, single_dev, capsys):
    tiny, sure = write_bundle(tmp_path / "bundle-tiny"), write_bundle(tmp_path / "bundle-sure", bias=10.0)
    cascade = measured_cascade(tmp_path / "bundle-cascade", {"tiny": tiny, "sure": sure}, dev_accuracy=0.875)
    assert bench_accuracy(cascade, single_dev, tmp_path / "runs", "--data.label_names=[positive,negative]") == 2
    assert "the recipe's data.label_names are ['positive', 'negative']" in capsys.readouterr().err


def dev_examples(dev: Path, limit: int | None = None) -> dict:
    """`info.dev_examples` of a bundle whose export stage read `dev` (its first `limit` examples) as the smoke recipe
    reads it."""
    data = DataConfig(train="unused", dev="unused", label_names=["negative", "positive"])
    return {DEV_EXAMPLES: load_labelled(str(dev), data, limit).digest()}


def test_a_bundle_measured_on_other_dev_examples_is_refused_naming_both(tmp_path, single_dev, capsys):
    measured_on = dev_examples(single_dev, limit=4)
    bundle = write_bundle(tmp_path / "bundle-tiny", metrics={"dev_accuracy": 1.0}, info=measured_on)
    assert bench_accuracy(bundle, single_dev, tmp_path / "runs") == 2
    said = capsys.readouterr().err
    assert f"measured on 4 dev examples (sha256 {measured_on[DEV_EXAMPLES]['sha256'][:12]})" in said
    assert f"the recipe's dev split ({single_dev}) holds 8 others" in said


def test_a_bundle_measured_on_these_dev_examples_records_them_checked(tmp_path, single_dev):
    info = dev_examples(single_dev)
    bundle = write_bundle(tmp_path / "bundle-tiny", metrics={"dev_accuracy": 0.875}, info=info)
    assert bench_accuracy(bundle, single_dev, tmp_path / "runs", "--check") == 0
    assert AccuracyResult.load(tmp_path / "runs" / "smoke" / "serve-accuracy-tiny").examples_checked


def test_a_bundle_that_records_no_dev_examples_is_recorded_unchecked(served_run):
    assert not AccuracyResult.load(served_run[1]).examples_checked


def test_the_markdown_says_the_dev_examples_of_a_bundle_that_records_none_could_not_be_checked(served_run):
    report = (served_run[1] / "accuracy.md").read_text()
    assert "that its dev_accuracy was measured on these 8 could not be checked" in report


def dynamic_int8_bundle(folder):
    """The tiny bundle with its weights INT8 and its activations quantized per batch, as the export stage writes it."""
    fp32 = folder.parent / "fp32.onnx"
    fp32.write_bytes(tiny_model(0.0).SerializeToString())
    applied = int8_dynamic(fp32, folder.parent / "int8.onnx", op_types=["MatMul"])
    model = (folder.parent / "int8.onnx").read_bytes()
    return write_bundle(folder, model=model, info={"quantization": applied}, precision="int8")


# Texts of several lengths: batched together they pad and share a quantization range; one by one they do not.
GROUPED = Examples(
    texts=["great fun", "awful plot and dull acting, the worst", "good", "boring film"] * 4,
    pairs=None,
    labels=[1, 0, 1, 0] * 4,
    source="test",
)


def test_a_bundle_that_quantizes_per_batch_has_a_grouping_margin(tmp_path):
    bundle = dynamic_int8_bundle(tmp_path / "bundle-int8")
    assert accuracy.grouping_margin(GROUPED, accuracy.member_logits(bundle, GROUPED, 16)) > 0


def test_the_grouping_margin_runs_only_the_other_groupings_again(tmp_path, monkeypatch):
    bundle = dynamic_int8_bundle(tmp_path / "bundle-int8")
    members = accuracy.member_logits(bundle, GROUPED, 16)
    sizes, run = [], accuracy._logits
    monkeypatch.setattr(
        accuracy, "_logits", lambda folder, examples, size: sizes.append(size) or run(folder, examples, size)
    )
    accuracy.grouping_margin(GROUPED, members)
    assert sizes == list(accuracy.GROUPINGS)


def test_the_grouping_margin_is_the_largest_change_of_a_gap_between_two_logits(tmp_path, monkeypatch):
    # in other groupings the top falls by 0.1 as the other label rises by 0.1: their gap closes by 0.2
    bundle = tmp_path / "bundle-int8"
    monkeypatch.setattr(accuracy, "quantizes_per_batch", lambda folder: True)
    monkeypatch.setattr(accuracy, "_logits", lambda folder, examples, size: np.array([[0.9, 0.6]], np.float32))
    margin = accuracy.grouping_margin(GROUPED, {bundle: np.array([[1.0, 0.5]], np.float32)})
    assert margin == pytest.approx(0.2)


def test_a_bundle_whose_logits_do_not_depend_on_batch_mates_has_no_grouping_margin(tmp_path):
    bundle = write_bundle(tmp_path / "bundle-tiny")
    assert accuracy.grouping_margin(GROUPED, accuracy.member_logits(bundle, GROUPED, 16)) is None


def test_a_served_label_within_the_grouping_margin_of_a_per_batch_quantized_bundle_passes(
    tmp_path, single_dev, monkeypatch
):
    monkeypatch.setattr(accuracy, "grouping_margin", lambda examples, members: 0.5)
    own = [0, 1, 1, 1, 0, 0, 0, 1]  # the first text served as 1: 0.3 below the bundle's own top, within 0.5
    code, _ = check_against(tmp_path, single_dev, monkeypatch, own, [0.3] + [1.0] * 7)
    assert code == 0


def test_the_grouping_margin_is_recorded(tmp_path, single_dev, monkeypatch):
    monkeypatch.setattr(accuracy, "grouping_margin", lambda examples, members: 0.5)
    _, result = check_against(tmp_path, single_dev, monkeypatch, [1, 1, 1, 1, 0, 0, 0, 1], 1.0)
    assert result.grouping_margin == 0.5


def test_a_bundle_named_as_one_of_the_runs_own_is_refused_before_the_server_starts(tmp_path, single_dev, capsys):
    write_bundle(tmp_path / "runs" / "smoke" / "bundle-tiny")
    other = write_bundle(tmp_path / "other" / "bundle-tiny")
    assert bench_accuracy(other, single_dev, tmp_path / "runs") == 2
    assert "has a bundle of that name of its own" in capsys.readouterr().err


def test_a_dev_example_the_bundle_reads_as_nothing_is_refused_naming_it(tmp_path, capsys):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\ngreat fun\t1\n<br />\t0\n")
    bundle = write_bundle(tmp_path / "bundle-tiny", metrics={"dev_accuracy": 0.5}, text_style="ptb_lower")
    assert bench_accuracy(bundle, dev, tmp_path / "runs") == 2
    assert f"{dev}: text '<br />' holds nothing the tokenizer of bundle-tiny keeps" in capsys.readouterr().err


def test_a_dev_example_a_cascades_member_reads_as_nothing_is_refused_naming_the_member(tmp_path, capsys):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\ngreat fun\t1\n<br />\t0\n")
    tiny = write_bundle(tmp_path / "bundle-tiny")
    sure = write_bundle(tmp_path / "bundle-sure", bias=10.0, text_style="ptb_lower")
    cascade = measured_cascade(tmp_path / "bundle-cascade", {"tiny": tiny, "sure": sure}, dev_accuracy=0.5)
    bench_accuracy(cascade, dev, tmp_path / "runs")
    assert "holds nothing the tokenizer of sure keeps" in capsys.readouterr().err
