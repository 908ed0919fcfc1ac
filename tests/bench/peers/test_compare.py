"""The peer comparison: the ratios against the best peer, and a whole run."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from edgedistill.bench import BenchError
from edgedistill.bench.__main__ import main
from edgedistill.bench.peers import compare, launch
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.bench.records import ServingResult, Spread
from edgedistill.bench.targets import PHASES, Example
from edgedistill.common.config.measure import PeersBenchConfig
from edgedistill.common.recipe import load_recipe
from edgedistill.common.stage import Built
from edgedistill.serve import workers

from tests.bench.test_h2load import needs_h2load
from tests.serve.conftest import ROOT

SMOKE = ROOT / "recipes" / "smoke.yaml"
PEER_ENVS = {peer: ROOT / ".venv-peers" / peer / "bin" / "python" for peer in launch.PEERS}


def summary(
    capacity: dict[str, float],
    p99: dict[str, float],
    failed: dict[str, int] | None = None,
    share: dict[str, float] | None = None,
) -> dict:
    """Each server's medians, its paced phase with the `failed` calls and the `share` of the calls due answered of a
    repeat (default none failed, all answered)."""
    figures = {}
    for server in capacity:
        figures[f"{server} capacity"] = {"requests_per_s": Spread.of([capacity[server]])}
        figures[f"{server} paced"] = {
            "p99_ms": Spread.of([p99[server]]),
            "failures": Spread.of([0, (failed or {}).get(server, 0)]),
            "rate_share": Spread.of([1.0, (share or {}).get(server, 1.0)]),
        }
    return figures


CAPACITY = {"edgedistill": 1300.0, "kserve": 1000.0, "mlserver": 500.0, "echo": 2000.0}
P99 = {"edgedistill": 4.0, "kserve": 5.0, "mlserver": 8.0, "echo": 2.0}


def test_a_peer_whose_every_call_failed_is_refused_naming_it():
    with pytest.raises(BenchError, match=r"no call succeeded in the median repeat of mlserver capacity"):
        compare.evaluate(summary(CAPACITY | {"mlserver": 0.0}, P99), PeersBenchConfig())


def test_capacity_is_compared_with_the_best_peer():
    ratios, _ = compare.evaluate(summary(CAPACITY, P99), PeersBenchConfig())
    assert ratios["capacity_vs_best_peer"] == pytest.approx(1.3)


def test_p99_is_compared_with_the_best_peers():
    ratios, _ = compare.evaluate(summary(CAPACITY, P99), PeersBenchConfig())
    assert ratios["p99_vs_best_peer"] == pytest.approx(0.8)


def test_targets_are_checked_when_the_recipe_sets_them():
    cfg = PeersBenchConfig(min_capacity_vs_best_peer=1.4, max_p99_vs_best_peer=1.0)
    _, targets = compare.evaluate(summary(CAPACITY, P99), cfg)
    assert [t["passed"] for t in targets] == [False, True, True, True]


@pytest.mark.parametrize("server", ["edgedistill", "kserve"])
def test_failed_paced_calls_of_the_server_or_the_best_peer_miss_the_p99_target(server):
    cfg = PeersBenchConfig(max_p99_vs_best_peer=1.0)
    _, targets = compare.evaluate(summary(CAPACITY, P99, failed={server: 3}), cfg)
    assert {t["name"]: t["passed"] for t in targets}["failed paced calls, edgedistill or kserve"] is False


@pytest.mark.parametrize("server", ["edgedistill", "kserve"])
def test_paced_calls_the_server_or_the_best_peer_left_unanswered_miss_the_p99_target(server):
    cfg = PeersBenchConfig(max_p99_vs_best_peer=1.0)
    _, targets = compare.evaluate(summary(CAPACITY, P99, share={server: 71 / 800}), cfg)
    verdicts = {t["name"]: t["passed"] for t in targets}
    assert verdicts["paced calls answered of those due, edgedistill or kserve"] is False


def test_no_target_is_checked_by_default():
    _, targets = compare.evaluate(summary(CAPACITY, P99), PeersBenchConfig())
    assert targets == []


def test_the_server_and_mlserver_run_the_same_count_of_workers_where_memory_holds_fewer_than_the_cores(
    tmp_path, bundle, monkeypatch
):
    monkeypatch.setattr(workers, "usable_cores", lambda: 4)
    monkeypatch.setattr(workers, "usable_memory", lambda: 2 * workers.WORKER_BASE_BYTES)
    cfg = PeersBenchConfig(peers=["mlserver"], workers=0)
    servers = compare.launched(cfg, bundle, "tiny-sentiment", {"mlserver": Path(sys.executable)}, tmp_path)
    ours = servers["edgedistill"].command
    mlserver = json.loads((tmp_path / "mlserver" / "settings.json").read_text())
    assert mlserver["parallel_workers"] == int(ours[ours.index("--workers") + 1])


def set_kserve_version(environment: Path, version: str) -> None:
    """KServe's package metadata in the Python `environment` at `version`, in place of any other."""
    (site,) = environment.glob("lib/python*/site-packages")
    for installed in site.glob("kserve-*.dist-info"):
        shutil.rmtree(installed)
    metadata = site / f"kserve-{version}.dist-info" / "METADATA"
    metadata.parent.mkdir()
    metadata.write_text(f"Metadata-Version: 2.1\nName: kserve\nVersion: {version}\n", encoding="utf-8")


def peer_environment(folder: Path, version: str | None = "0.21.0") -> Path:
    """The interpreter of a Python environment made in `folder`, KServe's package metadata at `version` in it (None:
    none)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    if version is not None:
        set_kserve_version(folder, version)
    return folder / "bin" / "python"


@pytest.fixture
def comparison_env(tmp_path, monkeypatch):
    """The environment `bench peers` runs in: results under `tmp_path`, no `EDGEDISTILL_*` setting."""
    for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "runs"))


def kserve_stage(bundle, python: Path):
    """The comparison of `bundle` with KServe alone, from the environment of `python`."""
    recipe = load_recipe(SMOKE, {"bench.peers.peers": ["kserve"]})
    return compare.stage(recipe, bundle, compare.environments(["kserve"], {"kserve": python}))


@pytest.fixture
def compared(tmp_path, bundle, comparison_env) -> Path:
    """A current comparison of `bundle` with KServe (no figure in it), from the environment whose interpreter it
    gives."""
    python = peer_environment(tmp_path / "kserve")

    def build(inputs):
        ServingResult(
            bundle={},
            settings={},
            options={},
            texts={},
            machine={},
            runs={},
            summary={},
            ratios={},
            targets=[],
            passed=True,
        ).save(inputs.fresh_work(), "")
        return Built()

    replace(kserve_stage(bundle, python), build=build).run()
    return python


def test_a_comparison_is_current_while_its_peers_environment_is_unchanged(bundle, compared):
    assert kserve_stage(bundle, compared).staleness() is None


def test_a_new_version_of_a_peer_makes_the_comparison_stale(tmp_path, bundle, compared):
    set_kserve_version(tmp_path / "kserve", "0.22.0")
    assert 'peers.kserve.version "0.21.0" -> "0.22.0"' in kserve_stage(bundle, compared).staleness()


def test_another_environment_of_a_peer_makes_the_comparison_stale(tmp_path, bundle, compared):
    other = peer_environment(tmp_path / "other")
    assert other.as_uri() in kserve_stage(bundle, other).staleness()


def test_a_missing_peer_environment_is_refused_though_the_comparison_is_current(tmp_path, bundle, compared, capsys):
    shutil.rmtree(tmp_path / "kserve")
    code = main(
        ["peers", str(SMOKE), "--bundle", str(bundle), f"--kserve-python={compared}", "--bench.peers.peers=[kserve]"]
    )
    assert code == 2
    assert "make peers-setup" in capsys.readouterr().err


def test_an_environment_without_the_peers_package_is_refused(tmp_path):
    with pytest.raises(BenchError, match=r"no kserve in .* run `make peers-setup`"):
        compare.environments(["kserve"], {"kserve": peer_environment(tmp_path / "kserve", version=None)})


def bench_peers(bundle, runs: Path, *extra: str) -> int:
    with pytest.MonkeyPatch.context() as env:
        for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
            env.delenv(name)
        env.setenv("EDGEDISTILL_RUNS_DIR", str(runs))
        return main(["peers", str(SMOKE), "--bundle", str(bundle), *extra])


def test_a_missing_peer_environment_fails_the_command_with_status_2(tmp_path, bundle, capsys):
    code = bench_peers(bundle, tmp_path, "--kserve-python", str(tmp_path / "none"))
    assert code == 2
    assert "make peers-setup" in capsys.readouterr().err


@pytest.mark.skipif(
    not all(path.is_file() for path in PEER_ENVS.values()),
    reason="needs the peers' environments (make peers-setup) and network access to build them",
)
def test_a_short_comparison_measures_every_server(tmp_path, bundle):
    code = bench_peers(
        bundle,
        tmp_path,
        *(f"--{peer}-python={path}" for peer, path in PEER_ENVS.items()),
        "--bench.peers.duration_s=0.5",
        "--bench.peers.warmup_s=0.2",
        "--bench.peers.repeats=1",
    )
    result = ServingResult.load(tmp_path / "smoke" / "serve-peers-tiny")
    assert code == 0
    servers = ["edgedistill", "kserve", "mlserver", "echo"]
    assert sorted(result.runs) == sorted(f"{server} {phase}" for server in servers for phase in PHASES)
    assert all(records[0]["failures"] == 0 for records in result.runs.values())
    assert (tmp_path / "smoke" / "serve-peers-tiny" / "bench.md").is_file()


@needs_h2load
def test_measure_runs_both_phases_on_every_server_it_is_given(tmp_path, bundle, monkeypatch):
    for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
        monkeypatch.delenv(name)
    model = BundleClassifier(bundle)
    text = "a gripping, funny film"
    example = Example(text, None, model.logits([text]), model.spec)
    servers = {"edgedistill": launch.edgedistill(bundle, model.spec.name, 1, 1), "echo": launch.echo()}
    cfg = PeersBenchConfig(duration_s=0.3, warmup_s=0.1, repeats=1)
    runs = compare.measure(cfg, servers, example, tmp_path)
    assert sorted(runs) == sorted(f"{server} {phase}" for server in servers for phase in PHASES)


def test_the_targets_are_written_with_every_digit_the_recipe_gave():
    cfg = PeersBenchConfig(min_capacity_vs_best_peer=1.305, max_p99_vs_best_peer=0.805)
    _, targets = compare.evaluate(summary(CAPACITY, P99), cfg)
    assert [t["limit"] for t in targets[:2]] == [">= 1.305", "<= 0.805"]


def test_the_heading_of_a_tensorrt_bundle_gives_it_no_intra_op_threads():
    bundle = {"name": "tiny", "arch": "cnn", "precision": "fp16", "runtime": "tensorrt"}
    result = ServingResult(
        bundle=bundle,
        settings={"edgedistill": {"workers": 2}},
        options=PeersBenchConfig().model_dump(mode="json"),
        texts={},
        machine={"cpus": 16, "cores": 16},
        runs={},
        summary={},
        ratios={},
        targets=[],
        passed=True,
    )
    assert "behind each server, no intra-op threads (a TensorRT engine), 2 worker(s)" in compare.heading(result)
