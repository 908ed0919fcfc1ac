"""Confidence rules and routing of a cascade, on logits with known answers."""

import math
from collections import Counter
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from edgedistill.common.cascade import RULES, CascadeMember, CascadeSpec, confidence, keeps, least_sure_first, route
from edgedistill.common.config.export import CascadeRecipe
from pydantic import ValidationError

LOGITS = np.log(np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]]))


def spec(threshold: float, rule="max_prob") -> CascadeSpec:
    """A cascade of `small`, which keeps a text at `threshold`, then `big`; the entropy rule's `threshold` as a
    negative one (its confidence is minus an entropy)."""
    threshold = -threshold if rule == "entropy" and threshold > 0 else threshold
    members = [
        CascadeMember(bundle="small", manifest_sha256="a", threshold=threshold),
        CascadeMember(bundle="big", manifest_sha256="b", threshold=None),
    ]
    return CascadeSpec(name="c", labels=["a", "b", "c"], text_inputs=["text"], rule=rule, members=members)


def test_max_prob_is_the_top_probability():
    np.testing.assert_allclose(confidence(LOGITS, "max_prob"), [0.7, 0.4])


def test_margin_is_the_gap_between_the_two_top_probabilities():
    np.testing.assert_allclose(confidence(LOGITS, "margin"), [0.5, 0.05])


def test_entropy_rule_ranks_the_peaked_row_higher():
    scores = confidence(LOGITS, "entropy")
    assert scores[0] > scores[1]


def test_temperature_above_one_flattens_the_probabilities():
    assert confidence(LOGITS, "max_prob", 2.0)[0] < 0.7


def test_route_keeps_confident_texts_at_the_first_member():
    big = np.zeros((2, 3))
    _, answered_by = route([LOGITS, big], spec(0.5))
    assert answered_by.tolist() == [0, 1]


NON_FINITE = np.array([[np.inf, 0.0, 0.0], [np.nan, 1.0, 0.0]])


@pytest.mark.filterwarnings("error")
def test_confidence_of_a_row_with_a_non_finite_logit_is_nan_without_a_warning():
    assert np.isnan(confidence(NON_FINITE, "max_prob")).all()


def test_route_passes_on_a_text_of_undefined_confidence():
    _, answered_by = route([NON_FINITE, np.zeros((2, 3))], spec(0.5))
    assert answered_by.tolist() == [1, 1]


@pytest.mark.parametrize("rule", ["max_prob", "margin", "entropy"])
def test_route_passes_on_a_text_with_a_minus_infinite_logit_though_its_confidence_reads_sure(rule):
    overflowed = np.array([[-np.inf, 3.0, 0.0]])
    _, answered_by = route([overflowed, np.zeros((1, 3))], spec(0.5, rule))
    assert answered_by.tolist() == [1]


def test_route_answers_with_the_answering_members_logits():
    big = np.full((2, 3), 9.0)
    logits, _ = route([LOGITS, big], spec(0.5))
    np.testing.assert_allclose(logits[1], big[1])


def test_spec_refuses_a_threshold_on_the_last_member():
    members = [
        CascadeMember(bundle="small", manifest_sha256="a", threshold=0.5),
        CascadeMember(bundle="big", manifest_sha256="b", threshold=0.5),
    ]
    with pytest.raises(ValueError, match="the last none"):
        CascadeSpec(name="c", labels=["a", "b"], text_inputs=["text"], rule="max_prob", members=members)


def test_a_member_refuses_a_threshold_of_nan():
    with pytest.raises(ValidationError, match="finite number"):
        CascadeMember(bundle="small", manifest_sha256="a", threshold=float("nan"))


def two_labels(rule: str, threshold: float) -> CascadeSpec:
    """A cascade of two labels whose first member keeps a text at `threshold` of `rule`'s confidence."""
    members = [
        CascadeMember(bundle="small", manifest_sha256="a", threshold=threshold),
        CascadeMember(bundle="big", manifest_sha256="b", threshold=None),
    ]
    return CascadeSpec(name="c", labels=["a", "b"], text_inputs=["text"], rule=rule, members=members)


@pytest.mark.parametrize("rule, threshold", [("max_prob", 1.5), ("max_prob", -7.0), ("margin", 1.01), ("entropy", 0.5)])
def test_spec_refuses_a_threshold_outside_its_rules_range(rule, threshold):
    with pytest.raises(ValidationError, match=f"{rule}'s confidence over 2 labels lies in"):
        two_labels(rule, threshold)


# Each rule's least confidence over two labels, that of equal probabilities: a threshold there keeps every text.
LEAST_OF_TWO = [("max_prob", 0.5), ("margin", 0.0), ("entropy", -math.log(2))]


@pytest.mark.parametrize("rule, threshold", LEAST_OF_TWO)
def test_spec_refuses_a_threshold_at_its_rules_least_confidence_over_its_labels(rule, threshold):
    with pytest.raises(ValidationError, match="it would keep every text or none"):
        two_labels(rule, threshold)


@pytest.mark.parametrize("rule, threshold", LEAST_OF_TWO)
def test_spec_refuses_a_threshold_below_its_rules_least_confidence_over_its_labels(rule, threshold):
    with pytest.raises(ValidationError, match="it would keep every text or none"):
        two_labels(rule, threshold - 0.01)


@pytest.mark.parametrize("rule, threshold", LEAST_OF_TWO)
def test_spec_accepts_a_threshold_just_above_its_rules_least_confidence_over_its_labels(rule, threshold):
    assert two_labels(rule, np.nextafter(threshold, 1.0)).members[0].threshold > threshold


@pytest.mark.parametrize("rule, threshold", LEAST_OF_TWO)
def test_a_threshold_at_a_rules_least_confidence_keeps_equal_probabilities(rule, threshold):
    """What the refusal above is for: a spec built past its validation keeps the least sure text there."""
    spec = two_labels("max_prob", 0.9).model_copy(update={"rule": rule}, deep=True)
    spec.members[0].threshold = threshold
    assert keeps(np.zeros((1, 2)), spec, 0).all()


def test_spec_of_three_labels_accepts_a_top_probability_threshold_its_two_label_least_refuses():
    assert spec(0.5).members[0].threshold == 0.5


@pytest.mark.parametrize("rule", get_args(CascadeRecipe.model_fields["rule"].annotation))
def test_every_rule_the_recipe_accepts_has_a_confidence_within_its_range(rule):
    scores = confidence(LOGITS, rule)
    assert ((RULES[rule].least(3) <= scores) & (scores <= RULES[rule].most)).all()


@pytest.mark.parametrize("rule", list(RULES))
def test_equal_probabilities_give_a_rules_least_confidence(rule):
    assert confidence(np.zeros((1, 3)), rule)[0] == pytest.approx(RULES[rule].least(3))


def test_a_member_refuses_an_infinite_temperature():
    with pytest.raises(ValidationError, match="finite number"):
        CascadeMember(bundle="small", manifest_sha256="a", threshold=0.5, temperature=float("inf"))


def test_spec_refuses_a_member_listed_twice():
    members = [
        CascadeMember(bundle="small", manifest_sha256="a", threshold=0.9),
        CascadeMember(bundle="small", manifest_sha256="a", threshold=None),
    ]
    with pytest.raises(ValidationError, match="a member is listed twice"):
        CascadeSpec(name="c", labels=["a", "b"], text_inputs=["text"], rule="max_prob", members=members)


def test_load_served_describes_a_cascade_by_its_members(tmp_path):
    from edgedistill.common.cascade import load_served

    from tests.serve.conftest import write_bundle, write_cascade

    small, big = write_bundle(tmp_path / "small"), write_bundle(tmp_path / "big")
    folder = write_cascade(tmp_path / "cascade", {"small": small, "big": big}, [0.9])
    assert [m["bundle"] for m in load_served(folder).description["members"]] == ["small", "big"]


def test_load_served_describes_a_bundle_by_its_runtime(tmp_path):
    from edgedistill.common.cascade import load_served

    from tests.serve.conftest import write_bundle

    assert load_served(write_bundle(tmp_path / "b")).description["kind"] == "bundle"


def test_load_cascade_refuses_a_member_name_too_long_for_the_file_system(tmp_path):
    import json

    from edgedistill.common import manifest as mf
    from edgedistill.common.cascade import load_cascade

    from tests.serve.conftest import write_bundle, write_cascade

    small, big = write_bundle(tmp_path / "small"), write_bundle(tmp_path / "big")
    folder = write_cascade(tmp_path / "cascade", {"small": small, "big": big}, [0.9])
    manifest = json.loads((folder / mf.MANIFEST).read_text())
    manifest["info"]["cascade"]["members"][0]["bundle"] = "x" * 300
    (folder / mf.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(mf.ArtifactError, match="cannot be read: File name too long"):
        load_cascade(folder)


def checks_counted(monkeypatch) -> Counter:
    """How often each file (by its resolved path) is checked against a manifest's sha256 from now on."""
    from edgedistill.common import manifest as mf

    checked, real = Counter(), mf._checked

    def counting(folder, name, entry, keep):
        checked[(Path(folder) / name).resolve()] += 1
        return real(folder, name, entry, keep)

    monkeypatch.setattr(mf, "_checked", counting)
    return checked


def test_load_cascade_hashes_each_members_model_file_once(tmp_path, monkeypatch):
    from edgedistill.common.cascade import load_cascade

    from tests.serve.conftest import write_bundle, write_cascade

    small, big = write_bundle(tmp_path / "small"), write_bundle(tmp_path / "big")
    folder = write_cascade(tmp_path / "cascade", {"small": small, "big": big}, [0.9])
    checked = checks_counted(monkeypatch)
    load_cascade(folder)
    assert [checked[(folder / "members" / m / "model.onnx").resolve()] for m in ("small", "big")] == [1, 1]


@pytest.mark.parametrize("verify", [True, False])
def test_load_cascade_refuses_a_member_copied_from_a_bundle_changed_since_it_was_built(tmp_path, verify):
    from edgedistill.common import manifest as mf
    from edgedistill.common.cascade import load_cascade

    from tests.serve.conftest import write_bundle, write_cascade

    small, big = write_bundle(tmp_path / "small"), write_bundle(tmp_path / "big")
    (big / "model.onnx").write_bytes((big / "model.onnx").read_bytes() + b"changed")
    folder = write_cascade(tmp_path / "cascade", {"small": small, "big": big}, [0.9])
    with pytest.raises(mf.ArtifactError, match="member big's files are not those its manifest lists"):
        load_cascade(folder, verify)


def test_least_sure_first_orders_rows_by_their_confidence():
    assert least_sure_first(LOGITS[::-1], spec(0.5), 0).tolist() == [0, 1]


@pytest.mark.parametrize("rule", ["max_prob", "margin", "entropy"])
def test_least_sure_first_puts_a_row_with_a_minus_infinite_logit_first_though_its_confidence_reads_sure(rule):
    logits = np.array([[0.1, 0.0, 0.0], [-np.inf, 3.0, 0.0]])
    assert least_sure_first(logits, spec(0.5, rule), 0).tolist() == [1, 0]
