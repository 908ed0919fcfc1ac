"""The serving benchmark end to end on the tiny bundle, its helpers, and the echo server."""

import asyncio
import json
import os

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serve import bench
from serve.batching import pad_rows
from serve.echo import create_echo_server
from serve.proto import classifier_pb2 as pb
from serve.proto import classifier_pb2_grpc
from tests.serve.conftest import settings_for

WORDS = ["a", "great", "movie", "the", "plot", "was", "dull", "and", "boring", "fun", "acting", "very", "good"]
RATE = 50.0


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory):
    """40 texts of 1 to 40 words."""
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, size=n)) for n in range(1, 41)]
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def out(bundle, texts_file, tmp_path_factory):
    """The results folder of one short benchmark run with `--check` (its exit status checked against the JSON)."""
    folder = tmp_path_factory.mktemp("bench") / "out"
    argv = ["--bundle", str(bundle), "--texts", str(texts_file), "--out", str(folder), "--check"]
    argv += ["--rate", str(RATE), "--duration", "1", "--repeats", "1", "--concurrency", "4"]
    with pytest.MonkeyPatch.context() as env:
        for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
            env.delenv(name)
        code = bench.main(argv)
    assert code == (0 if json.loads((folder / "bench.json").read_text())["passed"] else 1)
    return folder


@pytest.fixture(scope="module")
def result(out):
    return json.loads((out / "bench.json").read_text())


def test_bench_end_to_end(result, out, texts_file):
    assert sorted(p.name for p in out.iterdir()) == ["bare.log", "bench.json", "bench.md", "echo.log", "server.log"]
    report = (out / "bench.md").read_text()
    assert "| server, paced 50/s |" in report and "| bare server 4x1 |" in report
    assert f"reached {result['ratios']['bare_vs_echo']:.2f} of the echo server's" in report
    assert result["texts"]["source"] == str(texts_file) and result["texts"]["count"] == 40
    assert result["settings"]["threads"] == 1 and result["settings"]["metrics_port"] is None
    for phase, runs in result["runs"].items():
        (record,) = runs
        assert record["calls"] > 0 and record["errors"] == 0, phase
        assert 0 < record["p50_ms"] <= record["p95_ms"] <= record["p99_ms"] <= record["max_ms"], phase
        assert record["client_cpu"] > 0 and (phase == "raw") == ("server_cpu" not in record), phase
        assert result["summary"][phase]["p99_ms"] == dict.fromkeys(("median", "min", "max"), record["p99_ms"])
    paced = result["runs"]["paced"][0]
    assert 0.8 * RATE <= paced["calls_per_s"] <= 1.1 * RATE
    batched = result["runs"]["batched"][0]
    assert batched["texts_per_s"] == pytest.approx(bench.BATCH * batched["calls_per_s"])


def test_bench_ratios_and_targets_follow_the_recorded_numbers(result):
    median = {phase: {key: s["median"] for key, s in fields.items()} for phase, fields in result["summary"].items()}
    capacity = median["capacity"]["calls_per_s"] / median["echo"]["calls_per_s"]
    batched = median["batched"]["texts_per_s"] / median["raw"]["texts_per_s"]
    bare = median["bare"]["calls_per_s"]
    assert result["ratios"] == pytest.approx(
        {
            "capacity_vs_echo": capacity,
            "batched_vs_raw": batched,
            "bare_vs_echo": bare / median["echo"]["calls_per_s"],
            "capacity_vs_bare": median["capacity"]["calls_per_s"] / bare,
        }
    )
    p99, capacity_target, batched_target = result["targets"]
    assert p99["measured"] == median["paced"]["p99_ms"]
    assert p99["passed"] == (median["paced"]["p99_ms"] <= 3.0 and median["paced"]["calls_per_s"] >= 0.95 * RATE)
    assert capacity_target["passed"] == (capacity >= 0.80)
    assert batched_target["passed"] == (batched >= 0.70)
    assert result["passed"] == all(t["passed"] for t in result["targets"])


def test_texts_batches_and_padding(texts_file, bundle):
    texts, source = bench.load_texts(texts_file, count=10)
    assert len(texts) == 10 and source == str(texts_file)
    assert len({len(t) for t in texts}) > 5  # varied lengths
    groups = bench.batches_of(texts, 4)
    assert len(groups) == 2 and groups[0] == texts[:4] and all(len(g) == 4 for g in groups)
    assert bench.batches_of(texts[:3], 4) == [texts[:3] + texts[:1]]  # wraps round to one full batch
    rows = [{"input_ids": np.array([2, 5, 3]), "attention_mask": np.ones(3, int)}, {"input_ids": np.array([2, 3])}]
    rows[1]["attention_mask"] = np.ones(2, int)
    batch = pad_rows(rows, {"input_ids": 0, "attention_mask": 0})
    np.testing.assert_array_equal(batch["input_ids"], [[2, 5, 3], [2, 3, 0]])
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1], [1, 1, 0]])


def test_default_out_is_beside_the_bundle(bundle):
    options = bench.parse_options(["--bundle", str(bundle)])
    assert options.out == bundle.resolve().parent / "serve-bench"
    assert (options.rate, options.duration, options.repeats, options.check) == (200.0, 20.0, 3, False)


def classify_baseline(texts: list[str], bundle=None):
    """Start a baseline server of `serve.echo` (the bare one with `bundle`), classify `texts`, check health, stop."""

    async def exercise():
        server, port = await create_echo_server("127.0.0.1", 0, bundle)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await classifier_pb2_grpc.ClassifierStub(channel).Classify(
                    pb.ClassifyRequest(texts=texts), timeout=10
                )
                status = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        finally:
            await server.stop(None)
        return reply, status

    return asyncio.run(exercise())


def test_echo_server_answers_classify_and_health():
    reply, status = classify_baseline(["one", "two", "three"])
    assert [p.label for p in reply.predictions] == ["positive"] * 3
    assert list(reply.predictions[0].probabilities) == pytest.approx([0.25, 0.75])
    assert status.status == health_pb2.HealthCheckResponse.SERVING


def test_a_folder_that_is_not_a_bundle_exits_2(tmp_path, texts_file, capsys):
    assert bench.main(["--bundle", str(tmp_path), "--texts", str(texts_file), "--out", str(tmp_path / "out")]) == 2
    assert "python -m serve.bench:" in capsys.readouterr().err


def test_bare_server_answers_as_the_server_does(bundle, start_server):
    texts = ["a great movie", "the plot was dull and boring", "fun"]
    with start_server(settings_for(bundle)).channel() as channel:
        expected = classifier_pb2_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(texts=texts), timeout=10)
    reply, status = classify_baseline(texts, bundle)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    assert (reply.model_name, reply.model_version) == (expected.model_name, expected.model_version)
    assert [p.label for p in reply.predictions] == [p.label for p in expected.predictions]
    assert len({p.label for p in reply.predictions}) == 2  # the texts do not all get one label
    for got, want in zip(reply.predictions, expected.predictions, strict=True):
        assert list(got.logits) == pytest.approx(list(want.logits), abs=1e-5)
        assert list(got.probabilities) == pytest.approx(list(want.probabilities), abs=1e-6)
