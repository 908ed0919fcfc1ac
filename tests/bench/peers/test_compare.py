"""The peer comparison: the ratios against the best peer, and a whole run."""

import json
import os
import sys
from pathlib import Path

import pytest
from edgedistill.bench import BenchError
from edgedistill.bench.__main__ import main
from edgedistill.bench.peers import compare, launch
from edgedistill.bench.peers.model import BundleClassifier
from edgedistill.bench.records import ServingResult, Spread
from edgedistill.bench.targets import Example
from edgedistill.common.config.measure import PeersBenchConfig
from edgedistill.serve import workers

from tests.bench.test_h2load import needs_h2load
from tests.serve.conftest import ROOT

SMOKE = ROOT / "recipes" / "smoke.yaml"
PEER_ENVS = {peer: ROOT / ".venv-peers" / peer / "bin" / "python" for peer in launch.PEERS}


def summary(capacity: dict[str, float], p99: dict[str, float], failed: dict[str, int] | None = None) -> dict:
    """Each server's medians, its paced phase with the `failed` calls of a repeat (default none)."""
    figures = {}
    for server in capacity:
        figures[f"{server} capacity"] = {"requests_per_s": Spread.of([capacity[server]])}
        paced = {"p99_ms": Spread.of([p99[server]]), "failures": Spread.of([0, (failed or {}).get(server, 0)])}
        figures[f"{server} paced"] = paced
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
    assert [t["passed"] for t in targets] == [False, True, True]


@pytest.mark.parametrize("server", ["edgedistill", "kserve"])
def test_failed_paced_calls_of_the_server_or_the_best_peer_miss_the_p99_target(server):
    cfg = PeersBenchConfig(max_p99_vs_best_peer=1.0)
    _, targets = compare.evaluate(summary(CAPACITY, P99, failed={server: 3}), cfg)
    assert {t["name"]: t["passed"] for t in targets}["failed paced calls, edgedistill or kserve"] is False


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
    assert sorted(result.runs) == sorted(f"{s} {p}" for s in launch.SERVERS for p in compare.PHASES)
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
    assert sorted(runs) == sorted(f"{server} {phase}" for server in servers for phase in compare.PHASES)


def test_the_targets_are_written_with_every_digit_the_recipe_gave():
    cfg = PeersBenchConfig(min_capacity_vs_best_peer=1.305, max_p99_vs_best_peer=0.805)
    _, targets = compare.evaluate(summary(CAPACITY, P99), cfg)
    assert [t["limit"] for t in targets[:2]] == [">= 1.305", "<= 0.805"]
