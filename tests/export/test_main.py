"""`python -m export`: a failure of the recipe, the artifacts or the machine is a message and exit status 2; a missed
gate is a message and exit status 1."""

import pytest
from edgedistill.export import __main__ as export_main
from edgedistill.export import bundle_stage
from edgedistill.export.validate import ExportGateError

from tests.conftest import ROOT


@pytest.mark.parametrize("failure", export_main.failures(), ids=lambda kind: kind.__name__)
def test_a_build_failure_is_an_error_line_and_status_2(monkeypatch, capsys, failure):
    def fail(*args, **kwargs):
        raise failure("the reason")

    monkeypatch.setattr(bundle_stage, "build", fail)
    assert export_main.main(["bundles", str(ROOT / "recipes" / "smoke.yaml"), "--only", "bilstm-int8"]) == 2
    assert capsys.readouterr().err == "error: the reason\n"


def test_a_missed_gate_is_an_error_line_and_status_1(monkeypatch, capsys):
    def miss(*args, **kwargs):
        raise ExportGateError("bundle x: agrees on 90% (gate 99%)")

    monkeypatch.setattr(bundle_stage, "build", miss)
    assert export_main.main(["bundles", str(ROOT / "recipes" / "smoke.yaml"), "--only", "bilstm-int8"]) == 1
    assert capsys.readouterr().err == "error: bundle x: agrees on 90% (gate 99%)\n"


def test_an_unknown_bundle_given_to_only_lists_the_bundles_and_cascades(capsys):
    assert export_main.main(["bundles", str(ROOT / "recipes" / "smoke.yaml"), "--only", "cnn-int9"]) == 2
    assert "(teacher-onnx, teacher-fused, " in capsys.readouterr().err


def test_an_override_of_a_section_the_bundles_do_not_read_is_refused_naming_it(capsys):
    export_main.main(["bundles", str(ROOT / "recipes" / "smoke.yaml"), "--runtime.device=cuda"])
    assert "error: --runtime.device: python -m export bundles reads no runtime setting" in capsys.readouterr().err
