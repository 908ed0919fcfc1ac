"""`python -m bench cascade` on the smoke run's cascade: both servers measured, the figures recorded."""

import asyncio
import os
from collections import Counter

import pytest
from edgedistill.bench.__main__ import main
from edgedistill.bench.cascade import counting, failed_calls
from edgedistill.common import manifest as mf
from edgedistill.serve.proto import classifier_pb2 as pb

from tests.serve.conftest import ROOT

SMOKE = ROOT / "recipes" / "smoke.yaml"


@pytest.fixture(scope="module")
def measured(smoke_bundles):
    with pytest.MonkeyPatch.context() as env:
        for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
            env.delenv(name)
        env.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
        status = main(["cascade", str(SMOKE)])
    return status, smoke_bundles / "serve-cascade-bilstm-cascade"


def test_bench_cascade_exits_zero(measured):
    assert measured[0] == 0


def test_bench_cascade_records_the_capacity_of_both(measured):
    metrics = mf.load(measured[1]).metrics
    assert metrics["cascade_capacity_texts_per_s"] > 0
    assert metrics["last_capacity_texts_per_s"] > 0


def test_bench_cascade_records_the_share_of_its_answers_escalated(measured):
    metrics = mf.load(measured[1]).metrics
    assert 0 < metrics["served_escalated"] < 1
    assert metrics["escalation_refused"] == 0
    assert "escalated past bilstm-int8" in (measured[1] / "cascade.md").read_text()


def test_counting_tallies_each_answers_member_and_refused_escalation():
    predictions = [
        pb.Prediction(answered_by="small"),
        pb.Prediction(answered_by="big"),
        pb.Prediction(answered_by="small", escalation_refused=True),
    ]

    async def classify(request):
        return pb.ClassifyResponse(predictions=predictions)

    answers = Counter()
    asyncio.run(counting(classify, answers)(pb.ClassifyRequest(texts=["a", "b", "c"])))
    assert answers == {("small", False): 1, ("big", False): 1, ("small", True): 1}


def test_bench_cascade_table_names_the_cascade_and_its_last_member(measured):
    table = (measured[1] / "cascade.md").read_text()
    assert "| bilstm-cascade |" in table
    assert "| teacher-fused |" in table


def test_bench_serving_points_a_cascade_to_the_cascade_command(smoke_bundles, capsys):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
        status = main(["serving", str(SMOKE), "--bundle", str(smoke_bundles / "bundle-bilstm-cascade")])
    assert status == 2
    assert "bench cascade" in capsys.readouterr().err


def test_a_models_failed_calls_are_summed_over_every_phase_and_round():
    phases = {"capacity": [{"failures": 5}, {"failures": 0}], "paced": [{"failures": 3}, {"failures": 4}]}
    assert failed_calls(phases) == 12
