"""`python -m loadtests` end to end on the tiny bundle, with the seconds-long profiles of recipes/smoke.yaml."""

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from edgedistill.bench import BenchError
from edgedistill.bench.texts import PairsFile
from edgedistill.common import manifest as mf
from edgedistill.common.recipe import load_recipe
from edgedistill.loadtests import runner
from edgedistill.loadtests.recorder import UNSENT_NAME  # not from pacing: locust patches the process it is imported in

from tests.serve.conftest import ROOT, pair_spec, write_bundle

FILES = ("locust_stats.csv", "locust_stats_history.csv", "report.html", "requests.npz", "plan.json", "summary.md")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return write_bundle(tmp_path_factory.mktemp("loadtests") / "bundle-tiny")


@pytest.fixture(scope="module")
def pair_bundle(tmp_path_factory) -> Path:
    return write_bundle(tmp_path_factory.mktemp("loadtests") / "bundle-pairs", **pair_spec())


def loadtest(
    bundle: Path, profile: str, *overrides: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The load test with the server and plan settings of the flags and `env` alone.

    Its rate is not checked unless `overrides` set `min_rate_share`: a bound on time runs alone, marked `serial`.
    """
    command = [sys.executable, "-m", "loadtests", "recipes/smoke.yaml", "--profile", profile, "--bundle", str(bundle)]
    server = ("EDGEDISTILL_", "LOADTEST_")
    kept = {k: v for k, v in os.environ.items() if k == "EDGEDISTILL_RUNS_DIR" or not k.startswith(server)}
    rate_bound = (
        [] if any(".slo.min_rate_share=" in o for o in overrides) else [f"--loadtest.{profile}.slo.min_rate_share=null"]
    )
    run = [*command, *rate_bound, *overrides]
    return subprocess.run(run, cwd=ROOT, env=kept | (env or {}), capture_output=True, text=True, timeout=300)


def results(profile: str, bundle: str = "tiny") -> tuple[Path, dict]:
    """The folder and summary of `profile` on the bundle `bundle-<bundle>` (`echo`: against the echo server)."""
    folder = Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke" / f"loadtest-{profile}-{bundle}"
    return folder, json.loads((folder / "summary.json").read_text())


def called(summary: dict) -> set[str]:
    """The calls a summary gives figures for, without the calls due that a user held up at the end never sent (a
    stall of the machine then), which it counts under their own name."""
    return set(summary["by_name"]) - {UNSENT_NAME}


def test_smoke_profile_passes_and_writes_its_folder(bundle):
    run = loadtest(bundle, "smoke")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    folder, summary = results("smoke")
    manifest = mf.load(folder)  # every file present and matching its sha256
    assert set(FILES) <= set(manifest.files)
    assert manifest.stage == "loadtest-smoke-tiny"
    assert manifest.parents["bundle"].path == str(bundle)
    assert manifest.metrics["passed"] is True
    overall = summary["overall"]
    assert overall["requests"] > 0
    assert overall["failures"] == 0
    assert 0 < overall["p50_ms"] <= overall["p99_ms"]
    assert called(summary) == {"Classify", "Classify x4", "ClassifyStream x3", "ModelInfer"}
    assert len(summary["series"]["t_s"]) == 3
    assert sum(summary["series"]["requests_per_s"]) == overall["requests"]
    assert summary["texts"]["count"] > 100
    assert summary["texts"]["chars"]["min"] < summary["texts"]["chars"]["max"]
    with open(folder / "locust_stats.csv", newline="") as handle:
        calls = [row for row in csv.DictReader(handle) if row["Type"] == "grpc"]
    assert sum(int(row["Request Count"]) for row in calls) > 0
    assert sum(int(row["Failure Count"]) for row in calls) == 0
    assert "SLO" in run.stdout
    assert "overall" in run.stdout


def test_missed_slo_fails_the_run_and_names_the_threshold(bundle):
    run = loadtest(bundle, "smoke", "--loadtest.smoke.slo.p99_ms=0.001", "--loadtest.smoke.scenarios={single: 1}")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "SLO missed: p99_from_due_ms" in run.stderr
    assert "wanted <= 0.001" in run.stderr
    _, summary = results("smoke")
    assert summary["passed"] is False
    assert [c["name"] for c in summary["checks"] if not c["passed"]] == ["p99_from_due_ms"]


def test_calls_the_server_refuses_are_reported_by_their_status(bundle, tmp_path):
    texts = tmp_path / "long.txt"
    texts.write_text("a great movie " * 150 + "\n")  # over the server's 1024 bytes a message
    limit = {"EDGEDISTILL_MAX_MESSAGE_BYTES": "1024"}
    run = loadtest(bundle, "smoke", "--texts", str(texts), "--loadtest.smoke.scenarios={single: 1}", env=limit)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    _, summary = results("smoke")
    overall = summary["overall"]
    # every call sent is refused; those a slow refusal left unsent on a busy machine are no failures
    assert overall["error_codes"] == {"RESOURCE_EXHAUSTED": overall["failures"]}
    assert f"failed calls by status: RESOURCE_EXHAUSTED {overall['failures']}" in run.stderr


def test_failed_calls_within_the_error_rate_the_slo_allows_are_reported_by_their_status(bundle, tmp_path):
    texts = tmp_path / "long.txt"
    texts.write_text("a great movie " * 150 + "\n")  # over the server's 1024 bytes a message
    limit = {"EDGEDISTILL_MAX_MESSAGE_BYTES": "1024"}
    tolerated = ["--loadtest.smoke.slo.max_error_rate=1", "--loadtest.smoke.slo.p99_ms=null"]
    run = loadtest(
        bundle, "smoke", "--texts", str(texts), "--loadtest.smoke.scenarios={single: 1}", *tolerated, env=limit
    )
    assert "failed calls by status: RESOURCE_EXHAUSTED" in run.stderr, run.stdout[-3000:] + run.stderr[-3000:]


def test_a_server_that_wants_a_token_is_sent_it(bundle):
    scenarios = "--loadtest.smoke.scenarios={single: 1, stream: 1, kserve: 1}"
    without = loadtest(bundle, "smoke", scenarios)
    assert without.returncode == 0, without.stdout[-3000:] + without.stderr[-3000:]
    run = loadtest(bundle, "smoke", scenarios, env={"EDGEDISTILL_TOKEN": "s3cret"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "[loadtest-smoke-tiny] building again" in run.stdout
    _, summary = results("smoke")
    assert summary["overall"]["failures"] == 0


def test_locust_variables_exported_leave_the_run_as_it_is(bundle):
    run = loadtest(bundle, "smoke", "--loadtest.smoke.scenarios={single: 1}", env={"LOCUST_TAGS": "none"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert results("smoke")[1]["overall"]["requests"] > 0


def test_the_locust_variables_and_conf_left_out_are_named_in_one_line(bundle, tmp_path):
    (tmp_path / ".locust.conf").write_text("tags = none\n")
    env = {"LOCUST_TAGS": "none", "LOCUST_LOGLEVEL": "INFO", "HOME": str(tmp_path)}
    run = loadtest(bundle, "smoke", "--loadtest.smoke.scenarios={single: 1}", env=env)
    said = "locust runs without LOCUST_LOGLEVEL, LOCUST_TAGS, ~/.locust.conf: the load test sets its options\n"
    assert said in run.stderr


def test_a_locust_conf_in_the_home_folder_leaves_the_run_as_it_is(bundle, tmp_path):
    (tmp_path / ".locust.conf").write_text("tags = none\n")
    run = loadtest(bundle, "smoke", "--loadtest.smoke.scenarios={single: 1}", env={"HOME": str(tmp_path)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert results("smoke")[1]["overall"]["requests"] > 0


def test_step_profile_finds_capacity(bundle):
    run = loadtest(bundle, "step", "--loadtest.step.slo.p99_ms=10000")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _, summary = results("step")
    stages = summary["stages"]
    assert [s["users"] for s in stages] == [1, 3, 5]
    assert [s["offered_rate"] for s in stages] == [20, 60, 100]
    assert summary["capacity"]["requests_per_s"] == max(s["requests_per_s"] for s in stages)
    assert all(s["locust_cpu_pct"] is not None for s in stages)
    assert all(s["server_cpu_pct"] is not None for s in stages)


def test_echo_run_measures_the_client_floor_in_its_own_folder(bundle):
    refused = loadtest(bundle, "smoke", "--echo")
    assert refused.returncode == 2
    assert "drop scenarios ['kserve', 'stream']" in refused.stderr
    run = loadtest(bundle, "smoke", "--echo", "--loadtest.smoke.scenarios={single: 1, batch: 1}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    folder, summary = results("smoke", "echo")
    manifest = mf.load(folder)
    assert manifest.stage == "loadtest-smoke-echo"
    assert manifest.parents == {}
    assert manifest.info["echo"] is True
    assert summary["echo"] is True
    assert summary["bundle"]["arch"] == "echo"
    assert summary["server"] is None  # the model server's settings, which the echo server does not take
    assert called(summary) == {"Classify", "Classify x4"}
    assert summary["overall"]["failures"] == 0
    assert "echo server" in run.stdout


def test_spike_profile_reports_each_phase(bundle):
    run = loadtest(bundle, "spike", "--loadtest.spike.slo.p99_ms=10000")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _, summary = results("spike")
    stages = summary["stages"]
    assert [s["users"] for s in stages] == [1, 4, 1]
    assert all(s["requests"] > 0 for s in stages)
    assert stages[1]["requests_per_s"] > stages[0]["requests_per_s"]
    assert summary["overall"]["failures"] == 0


def test_users_stopped_at_the_end_of_a_spike_finish_their_calls(bundle):
    """Every call takes a 500 ms batching delay: the one user left after the spike returns at most 2 calls in the
    after stage's second; the 3 users stopped at the spike's end were in the middle of a call each."""
    slow = {"EDGEDISTILL_MAX_QUEUE_DELAY_MS": "500"}
    # at 20 calls/s a user falls behind: the calls it never sends count as unsent, not as failed calls or requests
    run = loadtest(bundle, "spike", "--loadtest.spike.slo.p99_ms=10000", env=slow)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _, summary = results("spike")
    assert summary["stages"][2]["requests"] > 2


@pytest.mark.serial  # a bound on time: 15 of the 20 samples, and the 100 calls the growth fit needs in the last 5 s
def test_soak_profile_samples_server_memory_and_gates_its_growth(bundle):
    gate = ("--loadtest.soak.duration_s=10", "--loadtest.soak.max_rss_growth_mb_per_10k=1000")
    run = loadtest(bundle, "soak", *gate, "--loadtest.soak.slo.p99_ms=10000")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    folder, summary = results("soak")
    resources = summary["resources"]
    assert len(resources["t_s"]) >= 15
    assert min(resources["server_rss_mb"]) > 10
    done = resources["requests_done"]  # sampled twice a second, so the last sample may miss the final calls
    assert done == sorted(done)
    assert 0.8 * summary["overall"]["requests"] <= done[-1] <= summary["overall"]["requests"]
    assert all(v is not None for v in resources["server_cpu_pct"] + resources["locust_cpu_pct"])
    growth = summary["rss_growth_mb_per_10k"]
    assert growth is not None
    assert mf.load(folder).metrics["rss_growth_mb_per_10k"] == growth
    assert [c["name"] for c in summary["checks"]].count("rss_growth_mb_per_10k") == 1


@pytest.mark.serial  # a bound on time: the run holds at least half its offered rate
def test_steady_profile_holds_its_rate(bundle):
    run = loadtest(bundle, "steady", "--loadtest.steady.slo.p99_ms=10000", "--loadtest.steady.slo.min_rate_share=0.5")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    _, summary = results("steady")
    overall = summary["overall"]
    assert overall["failures"] == 0
    assert overall["requests_per_s"] >= 0.5 * 40
    assert [c["name"] for c in summary["checks"]] == [
        "p99_from_due_ms",
        "error_rate",
        "rate_share",
        "locust_task_errors",
    ]


@pytest.fixture(scope="module")
def single_run(bundle, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The smoke load test of the single-text scenario alone: what it did, and the runs folder it wrote, which each
    test that runs it again copies into its own (`copy_of_single_run`)."""
    runs = tmp_path_factory.mktemp("single-run")
    env = {"EDGEDISTILL_RUNS_DIR": str(runs)}
    return loadtest(bundle, "smoke", "--loadtest.smoke.scenarios={single: 1}", env=env), runs


def copy_of_single_run(single_run) -> subprocess.CompletedProcess:
    """`single_run` copied into this test's runs folder, as if the test had run it there; what it did."""
    first, runs = single_run
    shutil.copytree(runs / "smoke", Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "smoke")
    return first


def test_an_unchanged_run_is_up_to_date_until_forced(bundle, single_run):
    first = copy_of_single_run(single_run)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    folder, _ = results("smoke")
    created = mf.load(folder).created
    again = loadtest(bundle, "smoke", "--loadtest.smoke.scenarios={single: 1}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[loadtest-smoke-tiny] up to date" in again.stdout, again.stderr[-3000:]
    assert mf.load(folder).created == created
    forced = loadtest(bundle, "smoke", "--loadtest.smoke.scenarios={single: 1}", "--force")
    assert forced.returncode == 0, forced.stdout[-3000:] + forced.stderr[-3000:]
    assert mf.load(folder).created != created


def test_a_changed_server_setting_runs_again(bundle, single_run):
    first = copy_of_single_run(single_run)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    again = loadtest(bundle, "smoke", "--loadtest.smoke.scenarios={single: 1}", env={"EDGEDISTILL_MAX_QUEUED": "512"})
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[loadtest-smoke-tiny] building again" in again.stdout
    _, summary = results("smoke")
    assert summary["server"]["max_queued"] == 512


def test_pairs_of_the_recipes_dev_split_go_to_a_pair_model_in_every_scenario(pair_bundle, data_dir):
    mrpc = ["--data.dev=" + str(data_dir / "mrpc" / "dev.tsv"), "--data.text_column=sentence1"]
    run = loadtest(pair_bundle, "smoke", *mrpc, "--data.text_pair_column=sentence2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    folder, summary = results("smoke", "pairs")
    assert summary["texts"]["pairs"]
    assert summary["texts"]["source"] == str(data_dir / "mrpc" / "dev.tsv")
    assert called(summary) == {"Classify", "Classify x4", "ClassifyStream x3", "ModelInfer"}
    assert summary["overall"]["failures"] == 0  # the pair model refuses a text without its pair
    assert len((folder / "pairs.txt").read_text().splitlines()) == summary["texts"]["count"]


def test_pairs_holding_a_line_separator_stay_with_their_texts(pair_bundle, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"film {n}\u2028part two\tplot {n}\n" for n in range(40)), encoding="utf-8")
    run = loadtest(pair_bundle, "smoke", "--pairs", str(pairs), "--loadtest.smoke.scenarios={single: 1}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_the_columns_of_a_pairs_file_name_the_texts_and_pairs_sent(pair_bundle, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("label\tpremise\thypothesis\n" + "".join(f"0\tfilm {n}\tplot {n}\n" for n in range(40)))
    columns = ["--columns", "premise", "hypothesis"]
    run = loadtest(pair_bundle, "smoke", "--pairs", str(pairs), *columns, "--loadtest.smoke.scenarios={single: 1}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    sent = sorted((results("smoke", "pairs")[0] / "texts.txt").read_text().splitlines())
    assert sent == sorted(f"film {n}" for n in range(40))


def test_a_load_test_of_a_bundle_writes_a_folder_named_after_the_profile_and_the_bundle(bundle):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    assert runner.stage(recipe, "steady", bundle).folder.name == "loadtest-steady-tiny"


def test_load_tests_of_two_bundles_keep_two_folders(bundle, pair_bundle):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    assert runner.stage(recipe, "smoke", bundle).folder != runner.stage(recipe, "smoke", pair_bundle).folder


def test_a_load_test_of_the_echo_server_keeps_one_folder_whatever_bundle_gave_its_texts(bundle, pair_bundle):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    stages = [runner.stage(recipe, "smoke", b, scenarios={"single": 1}, echo=True) for b in (bundle, pair_bundle)]
    assert {stage.folder.name for stage in stages} == {"loadtest-smoke-echo"}


def test_an_echo_load_test_takes_scenarios_it_cannot_run_at_weight_0(bundle):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    stage = runner.stage(recipe, "smoke", bundle, scenarios={"single": 1, "stream": 0, "kserve": 0}, echo=True)
    assert stage.folder.name == "loadtest-smoke-echo"


def test_an_echo_load_test_refuses_only_the_weighted_scenarios_it_cannot_run(bundle):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    with pytest.raises(runner.LoadtestError, match=r"drop scenarios \['kserve'\] or give them weight 0"):
        runner.stage(recipe, "smoke", bundle, scenarios={"single": 1, "stream": 0, "kserve": 1}, echo=True)


def test_an_echo_load_test_refuses_a_blank_token_as_the_bundles_does(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_TOKEN", "")
    with pytest.raises(ValueError, match="EDGEDISTILL_TOKEN: must not be empty"):
        runner.stage(load_recipe(ROOT / "recipes" / "smoke.yaml"), "smoke", bundle, scenarios={"single": 1}, echo=True)


def test_an_echo_load_test_refuses_tls_as_the_bundles_does(bundle, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEDISTILL_TLS_CERT", str(tmp_path / "cert.pem"))
    monkeypatch.setenv("EDGEDISTILL_TLS_KEY", str(tmp_path / "key.pem"))
    with pytest.raises(BenchError, match="measurements call the server over plaintext loopback"):
        runner.stage(load_recipe(ROOT / "recipes" / "smoke.yaml"), "smoke", bundle, scenarios={"single": 1}, echo=True)


def test_an_echo_load_test_refuses_a_bundle_that_is_not_there(tmp_path):
    with pytest.raises(mf.ArtifactError, match="is not a finished artifact"):
        runner.stage(
            load_recipe(ROOT / "recipes" / "smoke.yaml"), "smoke", tmp_path / "gone", scenarios={"single": 1}, echo=True
        )


def test_a_single_text_load_runs_against_a_server_taking_fewer_texts_than_batch_size(bundle):
    run = loadtest(bundle, "steady", env={"EDGEDISTILL_MAX_TEXTS": "2"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_a_batch_size_over_the_servers_max_texts_is_refused_before_the_stage_runs_where_batch_has_a_weight(
    bundle, monkeypatch
):
    monkeypatch.setenv("EDGEDISTILL_MAX_TEXTS", "2")
    with pytest.raises(runner.LoadtestError, match=r"loadtest\.batch_size=4 exceeds the server's max_texts=2"):
        runner.stage(
            load_recipe(ROOT / "recipes" / "smoke.yaml"), "steady", bundle, scenarios={"single": 1, "batch": 1}
        )


def test_a_bundle_whose_load_test_folder_would_be_the_echo_servers_is_refused(tmp_path):
    echo = write_bundle(tmp_path / "bundle-echo")
    with pytest.raises(runner.LoadtestError, match="would share the echo server's folder loadtest-smoke-echo"):
        runner.stage(load_recipe(ROOT / "recipes" / "smoke.yaml"), "smoke", echo)


BARE_FILE_STAGES = {  # the stage given a texts or pairs file named bare, in the working directory
    "texts": lambda recipe, bundle: runner.stage(recipe, "smoke", bundle, Path("sent.txt")),
    "pairs": lambda recipe, bundle: runner.stage(recipe, "smoke", bundle, pairs_file=PairsFile(Path("sent.txt"))),
}


@pytest.mark.parametrize("sent", BARE_FILE_STAGES)
def test_an_edited_texts_file_named_in_the_working_directory_runs_again(sent, bundle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    Path("sent.txt").write_text("good\tfilm\n")
    before = BARE_FILE_STAGES[sent](recipe, bundle).config_hash
    Path("sent.txt").write_text("bad\tplot\n")
    assert BARE_FILE_STAGES[sent](recipe, bundle).config_hash != before


STDIN_STAGES = {  # the stage given texts or pairs on stdin
    "texts": lambda recipe, bundle: runner.stage(recipe, "smoke", bundle, Path("-")),
    "pairs": lambda recipe, bundle: runner.stage(recipe, "smoke", bundle, pairs_file=PairsFile(Path("-"))),
}


@pytest.mark.parametrize("sent", STDIN_STAGES)
def test_other_texts_on_stdin_run_again(sent, bundle, monkeypatch):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    monkeypatch.setattr(sys, "stdin", io.StringIO("good\tfilm\n"))
    before = STDIN_STAGES[sent](recipe, bundle).config_hash
    monkeypatch.setattr(sys, "stdin", io.StringIO("bad\tplot\n"))
    assert STDIN_STAGES[sent](recipe, bundle).config_hash != before


def smoke_hash(bundle: Path, overrides: dict) -> str:
    """The smoke load test's config hash on the smoke recipe with `overrides`."""
    return runner.stage(load_recipe(ROOT / "recipes" / "smoke.yaml", overrides), "smoke", bundle).config_hash


def test_another_profiles_change_leaves_a_load_test_current(bundle):
    assert smoke_hash(bundle, {"loadtest.steady.rate": 7.0}) == smoke_hash(bundle, {})


def test_a_change_of_its_own_profile_runs_a_load_test_again(bundle):
    assert smoke_hash(bundle, {"loadtest.smoke.rate": 7.0}) != smoke_hash(bundle, {})


def test_a_change_of_a_setting_every_profile_shares_runs_a_load_test_again(bundle):
    assert smoke_hash(bundle, {"loadtest.timeout_s": 3.0}) != smoke_hash(bundle, {})


def test_a_dev_text_holding_a_line_break_exits_2_naming_its_split(bundle, tmp_path):
    dev = tmp_path / "dev.csv"
    dev.write_text('sentence,label\n"line one\nline two",1\ngood,0\n', encoding="utf-8")
    run = loadtest(bundle, "smoke", f"--data.dev={dev}")
    assert run.returncode == 2
    assert f"{dev}: the text 'line one\\nline two' holds a line break" in run.stderr


def test_a_texts_file_that_does_not_exist_is_refused_as_the_flag_is_read(bundle, tmp_path):
    run = loadtest(bundle, "smoke", "--texts", str(tmp_path / "nope.txt"))
    assert run.returncode == 2
    assert f"argument --texts: {tmp_path / 'nope.txt'}: no such file" in run.stderr


def test_single_texts_for_a_pair_model_exit_2(pair_bundle):
    run = loadtest(pair_bundle, "smoke")
    assert run.returncode == 2
    assert "the model takes text pairs" in run.stderr
