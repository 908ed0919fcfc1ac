"""kill -9 in the middle of pipeline stages of recipes/smoke.yaml, then rerun: the stage resumes and
ends where an uninterrupted run ended; a half-written bundle is never served.

Each test works in its own run name under EDGEDISTILL_RUNS_DIR, with the finished upstream artifacts of the
session's `smoke_run` linked in, so the teacher is not trained again.
"""

import glob
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from edgedistill.common import manifest as mf
from edgedistill.common.recipe import load_recipe

from tests.conftest import PYTHON, ROOT, run_here
from tests.serve.conftest import serve_command, subprocess_env, write_bundle

pytestmark = pytest.mark.slow
SMOKE = ROOT / "recipes" / "smoke.yaml"


def run_with(name: str, smoke_run: Path, *artifacts: str) -> Path:
    """EDGEDISTILL_RUNS_DIR/<name>/ with `artifacts` of `smoke_run` linked in."""
    folder = Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / name
    folder.mkdir(parents=True)
    for artifact in artifacts:
        os.symlink(smoke_run / artifact, folder / artifact)
    return folder


PAUSED = Path(__file__).with_name("paused.py")


def kill_9_when(after: str, awaited: Path, what: str, *args: str, timeout: float = 300) -> None:
    """Run `python *args` and SIGKILL it once a file matching the glob path `awaited` exists; fails if it finished
    first. The stage stops itself after the call of `after` (`module:name`) that leaves that file (`paused.py`), so
    that a stall of the machine cannot let it run on past the point the test kills it at."""
    log = Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / f"killed-{time.monotonic_ns()}.log"
    with open(log, "w") as out:  # a file, not a pipe nobody reads: a full pipe would stall the stage
        proc = subprocess.Popen(
            [PYTHON, str(PAUSED), after, str(awaited), *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so kill -9 reaches any worker it started
        )
    deadline = time.monotonic() + timeout
    while not glob.glob(str(awaited)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {what} before the stage ended or {timeout} s passed: {log.read_text()[-2000:]}")
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL


def rerun(*args: str) -> subprocess.CompletedProcess:
    """`python -m MODULE ...` as `kill_9_when` took it (`args`), run again in this process (`run_here`); fails the
    caller if it fails."""
    option, module, *rest = args
    assert option == "-m"
    result = run_here(module, *rest)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_kill_9_while_labelling_the_transfer_set_resumes_with_identical_logits(smoke_run):
    run = run_with("killed-transfer", smoke_run, "teacher")
    work = run / ".work" / "transfer"
    args = ("-m", "distill", "transfer", str(SMOKE), "--name=killed-transfer")
    shard = work / "logits-00000.npy"
    kill_9_when("edgedistill.distill.labelling:atomic_write", shard, "finished logit shard", *args)
    assert not (run / "transfer").exists(), "a killed stage must not publish an artifact"
    kept = {path.name: np.load(path) for path in work.glob("logits-[0-9][0-9][0-9][0-9][0-9].npy")}  # not .tmp.npy

    resumed = rerun(*args)
    done, total = map(int, re.search(r"resuming labelling: (\d+) of (\d+)", resumed.stdout).groups())
    assert done == sum(len(logits) for logits in kept.values())
    assert 0 < done < total
    logits = np.load(run / "transfer" / "logits.npy")
    shard = load_recipe(SMOKE).transfer.shard_size
    for name, part in kept.items():  # the shards written before the kill are used as they are
        index = int(name.split("-")[1].split(".")[0])
        np.testing.assert_array_equal(logits[index * shard : index * shard + len(part)], part)
    straight = smoke_run / "transfer"
    assert (run / "transfer" / "texts.txt").read_bytes() == (straight / "texts.txt").read_bytes()
    np.testing.assert_array_equal(logits, np.load(straight / "logits.npy"))
    print(f"\nkilled after {done} of {total} sentences were labelled; the rerun labelled the rest only")


def test_kill_9_while_training_a_student_resumes_to_the_same_evaluations_and_accuracy(smoke_run):
    run = run_with("killed-student", smoke_run, "teacher", "transfer")
    checkpoint = run / ".work" / "student-bilstm" / "checkpoint.pt"
    args = ("-m", "distill", "distill", str(SMOKE), "--only", "bilstm", "--no-baseline", "--name=killed-student")
    kill_9_when("edgedistill.distill.trainer:atomic_write", checkpoint, "training checkpoint", *args)
    assert not (run / "student-bilstm").exists(), "a killed stage must not publish an artifact"

    resumed = rerun(*args)
    assert "[transfer] up to date" in resumed.stdout
    assert "resumed from step" in resumed.stdout
    killed, straight = mf.load(run / "student-bilstm"), mf.load(smoke_run / "student-bilstm")
    assert killed.info["resumed_from_step"] > 0
    assert killed.info["steps"] == straight.info["steps"]
    # The kill comes at the first checkpoint, often the best evaluation: the published model may predate the resume,
    # so the evaluations after it are what tell a faithful resume.
    history = [json.loads((folder / "student-bilstm" / "history.json").read_text()) for folder in (run, smoke_run)]
    assert history[0] == history[1], "the evaluations of the resumed run differ from an uninterrupted run's"
    assert killed.metrics["dev_accuracy"] == pytest.approx(straight.metrics["dev_accuracy"], abs=0.01)
    print(
        f"\nresumed from step {killed.info['resumed_from_step']} of {killed.info['steps']}: dev accuracy "
        f"{killed.metrics['dev_accuracy']:.4f} (uninterrupted: {straight.metrics['dev_accuracy']:.4f})"
    )


def refusal(bundle: Path) -> str:
    """`python -m serve --bundle <bundle>` must exit 2 at once; the message of its start_failed log line."""
    result = subprocess.run(
        serve_command(bundle), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr[-2000:]
    entry = json.loads(result.stderr.strip().splitlines()[-1])
    assert entry["event"] == "start_failed"
    return entry["msg"]


def test_a_bundle_killed_while_exported_is_never_served(smoke_run):
    run = run_with("killed-export", smoke_run, "teacher", "transfer", "student-bilstm")
    args = ("-m", "export", "bundles", str(SMOKE), "--only", "bilstm-fp32", "--name=killed-export")
    work = run / ".work" / "bundle-bilstm-fp32"  # the model is built and checked there, then published
    kill_9_when("edgedistill.export.bundle_stage:export_onnx", work / "*.onnx", "bundle being built", *args)
    assert not (run / "bundle-bilstm-fp32").exists()
    leftover = work
    assert not (leftover / mf.MANIFEST).exists()
    assert "manifest.json is missing" in refusal(leftover)
    assert "manifest.json is missing" in refusal(run / "bundle-bilstm-fp32")


def half_written(folder: Path, kind: str) -> Path:
    """A bundle folder as a crash at some point of writing it would leave it."""
    write_bundle(folder)
    if kind == "no manifest":
        (folder / mf.MANIFEST).unlink()
    elif kind == "truncated manifest":
        text = (folder / mf.MANIFEST).read_text()
        (folder / mf.MANIFEST).write_text(text[: len(text) // 2])
    elif kind == "truncated model":
        model = folder / "model.onnx"
        model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    elif kind == "model missing":
        (folder / "model.onnx").unlink()
    return folder


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("no manifest", "manifest.json is missing"),
        ("truncated manifest", "is not a valid manifest"),
        ("truncated model", "the manifest says"),
        ("model missing", "model.onnx is listed in the manifest but missing"),
    ],
)
def test_a_half_written_bundle_is_refused_at_start(tmp_path, kind, message):
    assert message in refusal(half_written(tmp_path / "bundle", kind))
