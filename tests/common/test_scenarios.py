"""A load test's scenario weights: parsed from `--scenarios` or the variable, and refused beside an override of the
profile's own, which would do nothing."""

import pytest
from edgedistill.common import scenarios


def test_scenario_weights_parse():
    assert scenarios.parse_scenarios("single=3, batch=1,kserve=0") == {"single": 3, "batch": 1, "kserve": 0}


@pytest.mark.parametrize("bad", ["single", "single=x", "nope=1"])
def test_a_malformed_scenario_weight_is_refused_naming_the_form_it_wants(bad):
    with pytest.raises(
        ValueError, match=rf"^--scenarios: scenario weight '{bad}': want NAME=INT with NAME one of single, "
    ):
        scenarios.parse_scenarios(bad)


@pytest.mark.parametrize("bad", ["single=\u00b2", "single=\u0663"], ids=["superscript-two", "arabic-indic-three"])
def test_a_weight_of_digits_outside_ascii_is_refused_naming_the_form_it_wants(bad):
    with pytest.raises(ValueError, match=rf"^--scenarios: scenario weight '{bad}': want NAME=INT"):
        scenarios.parse_scenarios(bad)


def test_scenario_weights_all_zero_are_refused_asking_for_one_above_zero():
    with pytest.raises(ValueError, match=r"^--scenarios: scenarios 'single=0': give at least one a weight above 0$"):
        scenarios.parse_scenarios("single=0")


def test_a_scenario_given_twice_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"scenario single is given twice \('single=1,batch=1,single=2'\)"):
        scenarios.parse_scenarios("single=1,batch=1,single=2")


def test_an_empty_option_is_refused_rather_than_left_for_the_recipes_weights(monkeypatch):
    monkeypatch.delenv("EDGEDISTILL_LOADTEST_SCENARIOS", raising=False)
    with pytest.raises(ValueError, match=r"^--scenarios: scenarios '': give at least one a weight above 0$"):
        scenarios.scenario_weights({}, "smoke", "")


def test_weights_of_the_variable_that_do_not_parse_are_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_LOADTEST_SCENARIOS", "single=1;batch=1")
    with pytest.raises(ValueError, match=r"^EDGEDISTILL_LOADTEST_SCENARIOS: scenario weight 'single=1;batch=1'"):
        scenarios.scenario_weights({}, "smoke")


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_weights_under_the_old_name_that_do_not_parse_are_refused_naming_the_old_name(monkeypatch):
    monkeypatch.delenv("EDGEDISTILL_LOADTEST_SCENARIOS", raising=False)
    monkeypatch.setenv("LOADTEST_SCENARIOS", "single=1;batch=1")
    with pytest.raises(ValueError, match=r"^LOADTEST_SCENARIOS: scenario weight "):
        scenarios.scenario_weights({}, "smoke")


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_weights_under_the_old_name_beside_an_override_are_refused_naming_the_old_name(monkeypatch):
    monkeypatch.delenv("EDGEDISTILL_LOADTEST_SCENARIOS", raising=False)
    monkeypatch.setenv("LOADTEST_SCENARIOS", "batch=1")
    with pytest.raises(ValueError, match=r"\$LOADTEST_SCENARIOS='batch=1' gives the weights"):
        scenarios.scenario_weights({"loadtest.smoke.scenarios.single": 1}, "smoke")


def test_the_option_gives_the_weights_over_the_variable(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_LOADTEST_SCENARIOS", "batch=1")
    assert scenarios.scenario_weights({}, "smoke", "single=2") == {"single": 2}


def test_the_variable_gives_the_weights_without_the_option(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_LOADTEST_SCENARIOS", "batch=1")
    assert scenarios.scenario_weights({}, "smoke") == {"batch": 1}


def test_neither_leaves_the_profiles_weights(monkeypatch):
    monkeypatch.delenv("EDGEDISTILL_LOADTEST_SCENARIOS", raising=False)
    assert scenarios.scenario_weights({"loadtest.smoke.scenarios": {"batch": 1}}, "smoke") is None


def test_an_override_of_another_profiles_scenarios_is_no_clash(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_LOADTEST_SCENARIOS", "batch=1")
    assert scenarios.scenario_weights({"loadtest.steady.scenarios": {"single": 1}}, "smoke") == {"batch": 1}
