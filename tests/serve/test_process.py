"""`python -m serve` as a process: JSON logs, SIGTERM drain, SIGHUP reload, refusal at start; the client CLI."""

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import pytest
from edgedistill.common.bundle import read_bundle
from edgedistill.serve import call as cli
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serve import conftest
from tests.serve.conftest import ROOT, serve_command, subprocess_env, write_bundle
from tests.serve.test_operations import corrupt


def queued_rows(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("edgedistill_queue_depth ")))


def test_sigterm_drains_in_flight_calls_and_exits_zero(spawn, bundle):
    server = spawn(
        bundle,
        "--max-batch-size",
        "64",
        "--access-log",
        "true",
        EDGEDISTILL_MAX_QUEUE_DELAY_MS="1500",
        EDGEDISTILL_SHUTDOWN_GRACE_S="10",
    )
    serving = server.wait_for("serving")
    address = f"127.0.0.1:{serving['port']}"
    with grpc.insecure_channel(address) as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        in_flight = [
            stub.Classify.future(pb.ClassifyRequest(texts=[t]), timeout=20, metadata=[("x-request-id", f"drain-{i}")])
            for i, t in enumerate(["great", "awful", "good fun"])
        ]
        deadline = time.monotonic() + 10
        while queued_rows(serving["metrics_port"]) < 3:
            assert time.monotonic() < deadline, "the calls never reached the queue"
            time.sleep(0.02)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=20)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        server.proc.send_signal(signal.SIGTERM)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        assert server.wait_for("draining")["reason"] == "signal SIGTERM"
        with pytest.raises(grpc.RpcError) as caught:
            stub.Classify(pb.ClassifyRequest(texts=["late"]), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert [f.result().predictions[0].label for f in in_flight] == ["positive", "negative", "positive"]
    assert server.wait(20) == 0
    server.wait_for("stopped")
    access = [e for e in server.lines if e.get("event") == "rpc" and e["method"].endswith("/Classify")]
    assert {e["request_id"] for e in access if e["code"] == "OK"} == {"drain-0", "drain-1", "drain-2"}
    assert all({"ts", "level", "msg", "ms", "peer"} <= set(e) for e in access)


def test_every_log_lines_model_is_the_models_name(spawn, bundle):
    # Elasticsearch fixes a field's type from its first document: `model` an object in one line refuses the others
    server = spawn(bundle, "--access-log", "true")  # a line for every call, naming the model of a call it served
    address = f"127.0.0.1:{server.wait_for('serving')['port']}"
    with grpc.insecure_channel(address) as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        stub.Classify(pb.ClassifyRequest(texts=["great"]), timeout=10)
        with pytest.raises(grpc.RpcError):  # refused before a model is chosen
            stub.Classify(pb.ClassifyRequest(texts=[""]), timeout=10)
    server.wait_for("rpc")
    server.proc.send_signal(signal.SIGTERM)
    server.wait(20)
    name = read_bundle(bundle)[0].spec.name
    assert {line["model"] for line in server.lines if "model" in line} == {name}


def handles_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM (its caught-signals mask in /proc)."""
    with open(f"/proc/{pid}/status") as status:
        caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    return bool(caught & 1 << (signal.SIGTERM - 1))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("count", ["1", "2"], ids=["one process", "supervisor"])
def test_a_stop_signal_while_starting_exits_zero_before_serving(spawn, bundle, count, sig):
    # A container's first process ignores a signal it has no handler for: the server must handle SIGTERM from the
    # start, not only once it serves; SIGINT (Ctrl-C) stops it the same way, not as an interrupted command
    server = spawn(bundle, EDGEDISTILL_WORKERS=count)
    deadline = time.monotonic() + 30
    while not handles_sigterm(server.proc.pid):  # set after SIGINT's
        assert time.monotonic() < deadline, "the server never handled SIGTERM"
        time.sleep(0.001)
    server.proc.send_signal(sig)
    assert server.wait(30) == 0
    assert not [line for line in server.lines if line.get("event") in ("serving", "workers_serving")]


@pytest.mark.parametrize("count", ["1", "2"], ids=["one process", "supervisor"])
def test_a_sighup_while_starting_leaves_the_server_to_start(spawn, bundle, count):
    server = spawn(bundle, EDGEDISTILL_WORKERS=count)
    deadline = time.monotonic() + 30
    while not handles_sigterm(server.proc.pid):  # set with SIGHUP's, before the server's imports
        assert time.monotonic() < deadline, "the server never handled SIGTERM"
        time.sleep(0.001)
    server.proc.send_signal(signal.SIGHUP)
    server.wait_for("serving" if count == "1" else "workers_serving", timeout=60)
    assert server.proc.poll() is None


# `python -m edgedistill.serve` whose bundle takes a second to load, saying `loading` as it begins
SLOW_LOAD = """
import json, runpy, sys, time
from edgedistill.serve import app

def create_server(*args):
    print(json.dumps({"event": "loading"}), file=sys.stderr, flush=True)
    time.sleep(1)
    return loaded(*args)

loaded, app.create_server = app.create_server, create_server
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


@pytest.fixture
def hung_up_while_loading(spawn, bundle, monkeypatch):
    """A server sent SIGHUP while its bundle loads (for a second, `SLOW_LOAD`)."""
    monkeypatch.setattr(
        conftest, "serve_command", lambda *args: [sys.executable, "-c", SLOW_LOAD, *serve_command(*args)[3:]]
    )
    server = spawn(bundle)
    server.wait_for("loading", timeout=60)
    server.proc.send_signal(signal.SIGHUP)
    return server


def test_a_sighup_while_the_bundle_loads_reloads_it_once_serving(hung_up_while_loading):
    assert hung_up_while_loading.wait_for("reload_started", timeout=60)["trigger"] == "SIGHUP"


def test_a_sighup_while_the_bundle_loads_is_taken_after_the_server_serves(hung_up_while_loading):
    hung_up_while_loading.wait_for("reload_started", timeout=60)
    events = [line.get("event") for line in hung_up_while_loading.lines]
    assert events.index("serving") < events.index("reload_started")


def test_a_sighup_while_draining_reloads_nothing_and_logs_no_error(spawn, bundle):
    # The drain outlasts a stall of the machine before the SIGHUP: queued for 1.5 s, a stall of the test until the
    # drain's end sent it as the process exited, with SIGHUP's default action again (status -1)
    server = spawn(bundle, EDGEDISTILL_MAX_QUEUE_DELAY_MS="4000", EDGEDISTILL_SHUTDOWN_GRACE_S="10")
    serving = server.wait_for("serving")
    with grpc.insecure_channel(f"127.0.0.1:{serving['port']}") as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        in_flight = stub.Classify.future(pb.ClassifyRequest(texts=["great"]), timeout=20)  # queued for 4 s
        deadline = time.monotonic() + 10
        while queued_rows(serving["metrics_port"]) < 1:
            assert time.monotonic() < deadline, "the call never reached the queue"
            time.sleep(0.02)
        server.proc.send_signal(signal.SIGTERM)
        server.wait_for("draining")
        server.proc.send_signal(signal.SIGHUP)  # while the queued call keeps the drain going
        server.wait_for("reload_failed")  # the SIGHUP taken, its reload refused as the server shuts down
        assert in_flight.result().predictions[0].label == "positive"
    assert server.wait(20) == 0
    server.wait_for("stopped")
    assert [e for e in server.lines if e.get("level") == "ERROR"] == []


# `python -m edgedistill.serve` where the process stalls for 0.2 s after each change of a signal's action, as a loaded
# machine can: a moment where SIGHUP's action is its default (to end the process) would be one a SIGHUP lands in
SLOW_SIGNALS = """
import runpy, signal, time

def slow_signal(number, handler, set_action=signal.signal):
    previous = set_action(number, handler)
    time.sleep(0.2)
    return previous

signal.signal = slow_signal
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    ("count", "loop"),
    [("1", "uvloop"), ("1", "asyncio"), ("2", "uvloop")],
    ids=["one process on uvloop", "one process on asyncio", "supervisor"],
)
def test_sighups_as_the_drained_server_exits_leave_its_exit_status_0(spawn, bundle, monkeypatch, count, loop):
    monkeypatch.setattr(
        conftest, "serve_command", lambda *args: [sys.executable, "-c", SLOW_SIGNALS, *serve_command(*args)[3:]]
    )
    server = spawn(bundle, EDGEDISTILL_WORKERS=count, EDGEDISTILL_EVENT_LOOP=loop)
    server.wait_for("serving" if count == "1" else "workers_serving", timeout=60)
    server.proc.send_signal(signal.SIGTERM)
    server.wait_for("stopped" if count == "1" else "workers_stopped", timeout=60)
    while server.proc.poll() is None:  # one after another until it exits: some land after its event loop closed
        with contextlib.suppress(ProcessLookupError):
            server.proc.send_signal(signal.SIGHUP)
        time.sleep(0.001)
    assert server.wait(20) == 0


def test_sighup_reloads_the_bundle_folder_and_survives_a_bad_one(spawn, tmp_path):
    """Both reloads happen while two clients classify back to back: not one of their calls fails."""
    folder = write_bundle(tmp_path / "bundle")
    server = spawn(folder)
    serving = server.wait_for("serving")
    versions, failures, stop = [], [], threading.Event()

    def hammer():
        with grpc.insecure_channel(f"127.0.0.1:{serving['port']}") as own:
            own_stub = classifier_pb2_grpc.ClassifierStub(own)
            while not stop.is_set():
                try:
                    versions.append(own_stub.Classify(pb.ClassifyRequest(texts=["fun"]), timeout=10).model_version)
                except grpc.RpcError as err:
                    failures.append(err.code())

    clients = [threading.Thread(target=hammer) for _ in range(2)]
    for client in clients:
        client.start()
    with grpc.insecure_channel(f"127.0.0.1:{serving['port']}") as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5).version == "1"

        write_bundle(folder, bias=3.0, version="2")
        server.proc.send_signal(signal.SIGHUP)
        assert server.wait_for("reload_started")["trigger"] == "SIGHUP"
        deadline = time.monotonic() + 20
        while stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5).version != "2":
            assert time.monotonic() < deadline, f"no reload; log: {server.lines[-5:]}"
            time.sleep(0.05)
        assert stub.Classify(pb.ClassifyRequest(texts=["great"]), timeout=5).predictions[0].label == "negative"

        corrupt(folder)
        server.proc.send_signal(signal.SIGHUP)
        failed = server.wait_for("reload_failed")
        assert "sha256" in failed["msg"]
        assert stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5).version == "2"
        assert stub.Classify(pb.ClassifyRequest(texts=["great"]), timeout=5).model_version == "2"
        stop.set()
        for client in clients:
            client.join(10)
        assert not failures
        assert versions[0] == "1"
        assert versions[-1] == "2"
        assert set(versions) == {"1", "2"}
        with pytest.raises(grpc.RpcError):
            stub.Classify(pb.ClassifyRequest(texts=["great"], model_name="nope"), timeout=5)
        failed_call = server.wait_for("rpc")  # without --access-log only failed calls are logged
        assert failed_call["code"] == "NOT_FOUND"
        assert failed_call["method"] == "/edgedistill.v1.Classifier/Classify"
        assert not [e for e in server.lines if e.get("event") == "rpc" and e["code"] == "OK"]
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait(20) == 0


def test_a_corrupted_bundle_is_refused_at_start(tmp_path):
    folder = corrupt(write_bundle(tmp_path / "bundle"))
    result = subprocess.run(
        serve_command(folder), cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    refusal = json.loads(result.stderr.strip().splitlines()[-1])
    assert refusal["event"] == "start_failed"
    assert "does not match its sha256" in refusal["msg"]


# a file mode that denies even root where the DAC capabilities are dropped, as for the image's user
NO_DAC_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []


@pytest.fixture
def unreadable_refusal(tmp_path) -> str:
    """The start_failed line of a server whose bundle's manifest it may not read."""
    folder = write_bundle(tmp_path / "bundle")
    (folder / "manifest.json").chmod(0)
    result = subprocess.run(
        [*NO_DAC_OVERRIDE, *serve_command(folder)],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(result.stderr.strip().splitlines()[-1])["msg"]


def test_a_bundle_the_server_may_not_read_is_refused_naming_its_user(unreadable_refusal):
    assert f"this server runs as uid {os.geteuid()}" in unreadable_refusal


def test_a_bundle_the_server_may_not_read_is_not_sent_to_be_built_again(unreadable_refusal):
    assert "build it again" not in unreadable_refusal


# `python -m edgedistill.serve` whose server fails with an error nobody expected
CRASHING = """
import runpy
from edgedistill.serve import app

def run(*args):
    raise RuntimeError("a bug")

app.run = run
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def crashed(bundle) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", CRASHING, *serve_command(bundle)[3:]]
    return subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60)


def test_a_server_stopped_by_an_unexpected_error_exits_70(crashed):
    assert crashed.returncode == 70


def test_a_server_stopped_by_an_unexpected_error_logs_it_as_a_json_line_with_its_traceback(crashed):
    last = json.loads(crashed.stderr.strip().splitlines()[-1])
    assert last["event"] == "crashed"
    assert last["exc"].splitlines()[-1] == "RuntimeError: a bug"


# `python -m edgedistill.serve` whose metrics port another process takes between its check and its bind
METRICS_PORT_TAKEN_SINCE_CHECKED = """
import runpy
from edgedistill.serve import app

app.check_http = lambda host, port: None
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


def test_a_start_that_fails_with_its_grpc_port_open_prints_nothing_after_its_refusal(bundle):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        flags = serve_command(bundle, "--metrics-port", str(other.getsockname()[1]))[3:]
        command = [sys.executable, "-c", METRICS_PORT_TAKEN_SINCE_CHECKED, *flags]
        result = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert '"event": "start_failed"' in result.stderr.splitlines()[-1]


def test_the_server_imports_neither_torch_nor_transformers():
    code = (
        "import sys, serve.app, serve.client, serve.call, serve.__main__, serve.backend, common.runtime\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_bad_settings_exit_2_with_the_variable_named(bundle):
    result = subprocess.run(
        serve_command(bundle),
        cwd=ROOT,
        env=subprocess_env(EDGEDISTILL_MAX_BATCH_SIZE="lots"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "EDGEDISTILL_MAX_BATCH_SIZE" in result.stderr


def test_a_metrics_host_with_the_metrics_port_off_stops_the_server_naming_it(spawn, bundle):
    server = spawn(bundle, "--metrics-port", "off", EDGEDISTILL_METRICS_HOST="0.0.0.0")
    assert (
        "EDGEDISTILL_METRICS_HOST (--metrics-host) 0.0.0.0 would do nothing" in server.wait_for("start_failed")["msg"]
    )


@pytest.mark.parametrize(("environ", "needed"), [({}, False), ({"EDGEDISTILL_TOKEN": "s3cret"}, True)])
def test_the_listening_line_says_whether_calls_need_a_token(spawn, bundle, environ, needed):
    assert spawn(bundle, **environ).wait_for("listening")["token"] is needed


def test_the_listening_line_names_the_variable_that_sets_a_token(spawn, bundle):
    assert spawn(bundle).wait_for("listening")["msg"].endswith("(set EDGEDISTILL_TOKEN to require one)")


def test_client_cli_prints_the_model_and_each_texts_label_and_probabilities(served, capsys):
    assert cli.main(["--address", served.address, "a great movie", "awful boring film"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "tiny-sentiment"
    assert [p["label"] for p in out["predictions"]] == ["positive", "negative"]
    assert set(out["predictions"][0]["probabilities"]) == {"negative", "positive"}


def test_client_cli_reads_files_and_stdin_in_order_and_skips_blank_lines(served, tmp_path, capsys):
    reviews, more = tmp_path / "reviews.txt", tmp_path / "more.txt"
    reviews.write_text("i love it\n\nworst film\n")
    more.write_text("great fun\n")
    files = ["--file", str(reviews), "--file", "-", "--file", str(more)]
    assert cli.main(["--address", served.address, *files], stdin=io.StringIO("dull plot\n")) == 0
    texts = [p["text"] for p in json.loads(capsys.readouterr().out)["predictions"]]
    assert texts == ["i love it", "worst film", "dull plot", "great fun"]


def test_client_cli_kserve_labels_texts_from_stdin(served, capsys):
    assert cli.main(["--address", served.address, "--kserve"], stdin=io.StringIO("great fun\ndull plot\n")) == 0
    kserve = json.loads(capsys.readouterr().out)
    assert [p["label"] for p in kserve["predictions"]] == ["positive", "negative"]


def test_client_cli_info_prints_the_models_labels(served, capsys):
    assert cli.main(["--address", served.address, "--info"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"] == ["negative", "positive"]


def test_client_cli_prints_the_servers_error_and_exits_1(served, capsys):
    # whitespace in all the server reads (MAX_TEXT_CHARS, 4096): the client sends it, the server refuses it
    assert cli.main(["--address", served.address, " " * 5000 + "words"]) == 1
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["code"] == "INVALID_ARGUMENT"
    assert "whitespace" in error["message"]


def test_client_cli_without_any_text_exits_2(served):
    assert cli.main(["--address", served.address], stdin=io.StringIO("")) == 2


def test_the_server_runs_on_uvloop_by_default(spawn, bundle):
    assert spawn(bundle).wait_for("serving")["event_loop"] == "uvloop"


def test_event_loop_asyncio_runs_on_asyncios_own_loop(spawn, bundle):
    assert spawn(bundle, EDGEDISTILL_EVENT_LOOP="asyncio").wait_for("serving")["event_loop"] == "asyncio"


def test_event_loop_uvloop_where_it_is_not_installed_is_refused(bundle, monkeypatch):
    from edgedistill.serve import app
    from edgedistill.serve.settings import Settings, SettingsError

    monkeypatch.setattr(app.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SettingsError, match="uvloop is not installed"):
        app.loop_factory(Settings(bundle=bundle, event_loop="uvloop"))


def test_event_loop_auto_without_uvloop_is_asyncios(bundle, monkeypatch):
    from edgedistill.serve import app
    from edgedistill.serve.settings import Settings

    monkeypatch.setattr(app.importlib.util, "find_spec", lambda name: None)
    assert app.loop_factory(Settings(bundle=bundle)) is None
