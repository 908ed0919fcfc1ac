"""`python -m bench cascade` on the smoke run's cascade: both servers measured, the figures recorded; its result files
written from canned figures."""

import asyncio
import io
import json
import os
import random
from collections import Counter

import pytest
from edgedistill.bench import BenchError, cascade
from edgedistill.bench.__main__ import main
from edgedistill.bench.cascade import PHASES, CascadeResult, counting
from edgedistill.bench.stats import pooled
from edgedistill.common import manifest as mf
from edgedistill.common.machine import usable_cores
from edgedistill.common.recipe import load_recipe
from edgedistill.common.runtime import available_providers
from edgedistill.common.stage import Inputs
from edgedistill.serve.proto import classifier_pb2 as pb
from rich.console import Console

from tests.serve.conftest import ROOT, write_bundle, write_cascade

SMOKE = ROOT / "recipes" / "smoke.yaml"
GPU_DEPLOYED = ["--export.cascades.gpu-cascade.members=[bilstm-int8,teacher-cuda-fp16]", "--export.deploy=gpu-cascade"]
cuda_offered = "CUDAExecutionProvider" in available_providers()


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


def test_an_unknown_cascade_is_answered_with_the_nearest_cascade_by_name():
    message = (
        r"^--cascade bilstm-cascad: not in export\.cascades of smoke \(bilstm-cascade\): did you mean bilstm-cascade\?$"
    )
    with pytest.raises(BenchError, match=message):
        cascade.default_name(load_recipe(SMOKE), "bilstm-cascad")


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
    assert answers == {("a", None, "small", False): 1, ("b", None, "big", False): 1, ("c", None, "small", True): 1}


def test_bench_cascade_table_names_the_cascade_and_its_last_member(measured):
    table = (measured[1] / "cascade.md").read_text()
    assert "| bilstm-cascade |" in table
    assert "| teacher-fused |" in table


def test_bench_cascade_records_the_paced_p99_from_the_due_time_of_both(measured):
    metrics = mf.load(measured[1]).metrics
    assert metrics["cascade_paced_p99_from_due_ms"] > 0
    assert metrics["last_paced_p99_from_due_ms"] > 0


def test_bench_cascade_table_gives_the_paced_calls_sent_late_and_never_sent(measured_without_servers):
    assert "| 3.00 | 2 / 1 |" in (measured_without_servers / "cascade.md").read_text()


def test_bench_cascade_table_gives_a_figure_the_rounds_agree_on_once_as_the_serving_benchmarks_tables_do(
    measured_without_servers,
):
    assert "| 100 | 1.00 | 2.00 | 3.00 |" in (measured_without_servers / "cascade.md").read_text()


def test_bench_cascade_table_sums_a_models_failed_calls_over_every_phase(measured_without_servers):
    assert "| 2 / 1 | 3 |" in (measured_without_servers / "cascade.md").read_text()


def test_bench_serving_points_a_cascade_to_the_cascade_command(smoke_bundles, capsys):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
        status = main(["serving", str(SMOKE), "--bundle", str(smoke_bundles / "bundle-bilstm-cascade")])
    assert status == 2
    assert "bench cascade" in capsys.readouterr().err


@pytest.fixture
def deployed_cascade_run(tmp_path, monkeypatch):
    """A runs folder whose smoke run deploys a tiny cascade as bilstm-cascade; the arguments that deploy it."""
    tiny = write_bundle(tmp_path / "bundle-tiny")
    sure = write_bundle(tmp_path / "bundle-sure", bias=10.0)
    cascade_folder = tmp_path / "runs" / "smoke" / "bundle-bilstm-cascade"
    write_cascade(cascade_folder, {"tiny": tiny, "sure": sure}, [0.9])
    for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "runs"))
    return cascade_folder, [str(SMOKE), "--export.deploy=bilstm-cascade"]


def test_bench_serving_of_a_deployed_cascade_leaves_it_to_the_cascade_benchmark(deployed_cascade_run, capsys):
    main(["serving", *deployed_cascade_run[1]])
    assert "bench cascade` measures" in capsys.readouterr().out


def test_bench_serving_refusing_options_for_a_deployed_cascade_says_what_the_cascade_benchmark_measures(
    deployed_cascade_run, capsys
):
    main(["serving", *deployed_cascade_run[1], "--check"])
    said = "measures against its last member served alone, on the recipe's dev split and with no targets to check"
    assert said in capsys.readouterr().err


def test_bench_serving_of_a_deployed_cascade_given_as_make_all_gives_it_exits_zero(deployed_cascade_run):
    folder, argv = deployed_cascade_run
    assert main(["serving", *argv, "--bundle", str(folder)]) == 0


@pytest.mark.parametrize("flags", [["--check"], ["--texts", str(SMOKE)], ["--check", "--pairs", str(SMOKE)]])
def test_bench_serving_of_a_deployed_cascade_refuses_the_options_it_would_ignore(deployed_cascade_run, flags):
    assert main(["serving", *deployed_cascade_run[1], *flags]) == 2


def test_bench_serving_of_a_deployed_cascade_names_the_options_it_would_ignore(deployed_cascade_run, capsys):
    main(["serving", *deployed_cascade_run[1], "--check", "--texts", str(SMOKE)])
    assert "--check and --texts would do nothing here; drop them" in capsys.readouterr().err


def test_bench_serving_of_a_cascade_not_deployed_names_the_option_that_measures_it(deployed_cascade_run, capsys):
    # the cascade benchmark measures the deployed cascade, else the first, unless --cascade says which
    main(["serving", str(SMOKE), "--bundle", str(deployed_cascade_run[0])])
    assert "`edgedistill bench cascade RECIPE --cascade NAME`" in capsys.readouterr().err


@pytest.fixture
def empty_runs(tmp_path, monkeypatch):
    for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))


def test_bench_cascade_takes_name_as_the_run_name_as_every_command_does(empty_runs, capsys):
    main(["cascade", str(SMOKE), "--name=other-run"])  # as `edgedistill all RECIPE --name=other-run` forwards it
    assert "other-run/bundle-bilstm-cascade is not a finished artifact" in capsys.readouterr().err


@pytest.mark.skipif(cuda_offered, reason="checks a cascade this machine cannot run: its onnxruntime offers no CUDA")
def test_bench_cascade_of_a_deployed_cascade_this_machine_cannot_run_exits_zero(empty_runs):
    assert main(["cascade", str(SMOKE), *GPU_DEPLOYED]) == 0


@pytest.mark.skipif(cuda_offered, reason="checks a cascade this machine cannot run: its onnxruntime offers no CUDA")
def test_bench_cascade_of_a_deployed_cascade_this_machine_cannot_run_names_the_member_and_why(empty_runs, capsys):
    main(["cascade", str(SMOKE), *GPU_DEPLOYED])
    assert "[serve-cascade] none here: cascade gpu-cascade's member teacher-cuda-fp16: CUDA" in capsys.readouterr().out


@pytest.mark.skipif(cuda_offered, reason="checks a cascade this machine cannot run: its onnxruntime offers no CUDA")
def test_bench_cascade_named_with_cascade_that_this_machine_cannot_run_fails(empty_runs):
    assert main(["cascade", str(SMOKE), *GPU_DEPLOYED, "--cascade=gpu-cascade"]) == 2


def test_bench_cascade_of_a_cascade_built_otherwise_than_the_recipe_has_it_is_refused(smoke_bundles, capsys):
    with pytest.MonkeyPatch.context() as env:
        for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
            env.delenv(name)
        env.setenv("EDGEDISTILL_RUNS_DIR", str(smoke_bundles.parent))
        status = main(["cascade", str(SMOKE), "--export.cascades.bilstm-cascade.target_agreement=0.9"])
    assert status == 2
    err = capsys.readouterr().err
    assert "bundle-bilstm-cascade is not the cascade the recipe has (export.cascades.bilstm-cascade" in err


@pytest.fixture(scope="module")
def measured_with_a_token(tmp_path_factory):
    """Both phases of a tiny cascade and its last member, each served with EDGEDISTILL_TOKEN set."""
    folder = tmp_path_factory.mktemp("token")
    tiny = write_bundle(folder / "bundle-tiny")
    sure = write_bundle(folder / "bundle-sure", bias=10.0)
    folders = {"cascade": write_cascade(folder / "bundle-cascade", {"tiny": tiny, "sure": sure}, [0.9]), "last": sure}
    dev = folder / "dev.tsv"
    dev.write_text("sentence\tlabel\ngreat fun\t1\nthe plot\t0\nawful boring\t0\n")
    overrides = {"data.dev": str(dev), "bench.serving.duration_s": 0.3, "bench.serving.repeats": 1}
    with pytest.MonkeyPatch.context() as env:
        for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
            env.delenv(name)
        env.setenv("EDGEDISTILL_TOKEN", "s3cret")
        return asyncio.run(cascade._measure(load_recipe(SMOKE, overrides), folders, folder, Counter()))


@pytest.mark.parametrize("model", ["cascade", "last"])
def test_a_server_with_a_token_is_called_with_it(measured_with_a_token, model):
    records = [record for records in measured_with_a_token[model].values() for record in records]
    assert pooled(records)["failures"] == 0


def test_a_phase_without_one_successful_call_is_named_with_its_model_and_round(tmp_path, monkeypatch):
    tiny = write_bundle(tmp_path / "bundle-tiny")
    sure = write_bundle(tmp_path / "bundle-sure", bias=10.0)
    folders = {"cascade": write_cascade(tmp_path / "bundle-cascade", {"tiny": tiny, "sure": sure}, [0.9]), "last": sure}
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\ngreat fun\t1\nthe plot\t0\n")
    recipe = load_recipe(SMOKE, {"data.dev": str(dev), "bench.serving.duration_s": 0.2, "bench.serving.repeats": 1})
    for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EDGEDISTILL_TOKEN", "s3cret")
    monkeypatch.setattr(cascade, "call_metadata", lambda settings: ())  # every call refused: UNAUTHENTICATED
    with pytest.raises(BenchError, match=r"^repeat 1/1 cascade capacity: no call succeeded"):
        asyncio.run(cascade._measure(recipe, folders, tmp_path, Counter()))


def test_a_dev_text_a_member_reads_as_nothing_is_refused_naming_it_and_the_member(tmp_path):
    tiny = write_bundle(tmp_path / "bundle-tiny")
    sure = write_bundle(tmp_path / "bundle-sure", bias=10.0, text_style="ptb_lower")  # removes HTML markup
    folders = {"cascade": write_cascade(tmp_path / "bundle-cascade", {"tiny": tiny, "sure": sure}, [0.9]), "last": sure}
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\ngreat fun\t1\n<br />\t0\n")
    with pytest.raises(BenchError, match=r"dev\.tsv: text '<br />' holds nothing the tokenizer of sure keeps"):
        asyncio.run(cascade._measure(load_recipe(SMOKE, {"data.dev": str(dev)}), folders, tmp_path, Counter()))


def test_a_last_member_rebuilt_since_the_cascade_is_refused_naming_the_rebuild(tmp_path):
    tiny = write_bundle(tmp_path / "bundle-tiny")
    sure = write_bundle(tmp_path / "bundle-sure", bias=10.0)
    folders = {"cascade": write_cascade(tmp_path / "bundle-cascade", {"tiny": tiny, "sure": sure}, [0.9]), "last": sure}
    manifest = json.loads((sure / mf.MANIFEST).read_text())
    manifest["metrics"]["rebuilt"] = 1  # the standalone bundle rebuilt after the cascade copied it
    (sure / mf.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BenchError, match=r"rebuild the cascade \(`edgedistill bundles RECIPE --only cascade`\)"):
        asyncio.run(cascade._measure(load_recipe(SMOKE), folders, tmp_path, Counter()))


SURE_TEXT, UNSURE_TEXT = "great good love fun", "the movie"  # the tiny member's confidence above 0.9, below


def tiny_cascade(folder, dev_escalated: float) -> dict:
    """The folders of a cascade of the tiny model ("small") and the same model sure of "negative" ("big"), which
    keeps SURE_TEXT at "small" and escalates UNSURE_TEXT; its manifest gives `dev_escalated`."""
    small = write_bundle(folder / "bundle-small")
    big = write_bundle(folder / "bundle-big", bias=10.0)
    cascade_folder = write_cascade(folder / "bundle-cascade", {"small": small, "big": big}, [0.9])
    manifest = json.loads((cascade_folder / mf.MANIFEST).read_text())
    manifest["metrics"]["dev_escalated"] = dev_escalated  # as the export stage records it
    (cascade_folder / mf.MANIFEST).write_text(json.dumps(manifest))
    return {"cascade": cascade_folder, "last": big}


@pytest.fixture(scope="module")
def built_on_texts_past_those_sent(tmp_path_factory):
    """The benchmark's figures on a dev split of 600 texts whose 88 not among the 512 sent (`load_texts`) are all
    UNSURE_TEXT, and one in 8 of those sent; and that split's escalated share."""
    folder = tmp_path_factory.mktemp("past-sent")
    order = list(range(600))
    random.Random(0).shuffle(order)  # as load_texts shuffles
    sent = order[:512]
    unsure = set(order[512:]) | set(sent[::8])
    rows = [f"{UNSURE_TEXT if i in unsure else SURE_TEXT}\t1" for i in range(600)]
    (folder / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    folders = tiny_cascade(folder, dev_escalated=len(unsure) / 600)
    overrides = {"data.dev": str(folder / "dev.tsv"), "data.dev_limit": None, "bench.serving.duration_s": 0.5}
    recipe = load_recipe(SMOKE, overrides | {"bench.serving.repeats": 1})
    with pytest.MonkeyPatch.context() as env:
        for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
            env.delenv(name)
        built = cascade._build(
            Inputs(recipe, "h", folder / "work", False, {}, folders, "k", folder / "serve-cascade"),
            Console(file=io.StringIO()),
        )
    return built.metrics, len(unsure) / 600


def test_the_routing_share_is_that_of_the_texts_sent(built_on_texts_past_those_sent):
    metrics, _ = built_on_texts_past_those_sent
    assert metrics["routed_escalated"] == pytest.approx(metrics["served_escalated"], abs=1e-12)


def test_the_routing_share_of_texts_sent_differs_from_the_whole_dev_splits(built_on_texts_past_those_sent):
    metrics, whole_split = built_on_texts_past_those_sent
    assert metrics["routed_escalated"] < whole_split - 0.05


def test_the_routing_share_counts_each_text_as_often_as_it_was_sent(measured_without_servers):
    assert "escalates 25.0% of the same texts" in (measured_without_servers / "cascade.md").read_text()


@pytest.fixture
def measured_without_servers(tmp_path, monkeypatch):
    """The cascade benchmark's artifact written from canned figures, as `_build` writes it after measuring."""
    record = {"texts_per_s": 100.0, "p50_ms": 1.0, "p99_ms": 2.0, "requests": 100, "error_codes": {}}
    record |= {"p99_from_due_ms": 3.0, "late_calls": 2, "unsent_calls": 1}  # of the paced phase
    failures = {"capacity": 1, "paced": 2}

    async def canned(recipe, folders, work, answers):
        answers.update({(SURE_TEXT, None, "small", False): 3, (UNSURE_TEXT, None, "big", False): 1})
        return {model: {phase: [record | {"failures": failures[phase]}] for phase in PHASES} for model in folders}

    monkeypatch.setattr(cascade, "_measure", canned)
    folders = tiny_cascade(tmp_path, dev_escalated=0.3)
    inputs = Inputs(load_recipe(SMOKE), "h", tmp_path / "work", False, {}, folders, "k", tmp_path / "serve-cascade")
    cascade._build(inputs, Console(file=io.StringIO()))
    return tmp_path / "work"


def test_cascade_json_ends_with_a_newline_as_every_result_file(measured_without_servers):
    assert (measured_without_servers / "cascade.json").read_text(encoding="utf-8").endswith("}\n")


def test_cascade_json_loads_back_as_its_result(measured_without_servers):
    assert CascadeResult.load(measured_without_servers).answered == [("small", False, 3), ("big", False, 1)]


def test_cascade_json_records_the_machine_it_ran_on(measured_without_servers):
    assert CascadeResult.load(measured_without_servers).machine["cores"] == usable_cores()


def test_cascade_json_records_the_package_versions_it_ran_with(measured_without_servers):
    assert CascadeResult.load(measured_without_servers).machine["versions"] == mf.package_versions()


def test_cascade_json_records_the_rate_of_its_paced_phase(measured_without_servers):
    assert CascadeResult.load(measured_without_servers).options["rate"] == load_recipe(SMOKE).bench.serving.rate
