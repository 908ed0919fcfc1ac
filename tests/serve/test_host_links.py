"""Reloads of a folder a Reload call named through a symlink: the link is followed anew at every reload, off the
event loop."""

import threading
import time
from pathlib import Path

import grpc
import pytest
from edgedistill.serve.client import Client
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc
from edgedistill.serve.watchdog import LoopWatchdog

from tests.serve.conftest import settings_for, write_bundle

ADMIN_TOKEN = "admin-token"
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)


def served_through_a_link(start_server, tmp_path):
    """A server of `root/v1` with `root/current -> v1` reloaded by name (Reload "current"); the server, the link."""
    root = tmp_path / "root"
    first = write_bundle(root / "v1")
    link = root / "current"
    link.symlink_to("v1")
    server = start_server(settings_for(first, reload_root=root, admin_token=ADMIN_TOKEN))
    with Client(server.address, token=ADMIN_TOKEN) as client:
        client.reload("current")
    return server, link


def repoint(link, target) -> None:
    link.unlink()
    link.symlink_to(target)


def test_a_reload_without_a_path_follows_the_named_link_where_it_points_now(start_server, tmp_path):
    server, link = served_through_a_link(start_server, tmp_path)
    second = write_bundle(link.parent / "v2", bias=3.0)
    repoint(link, "v2")
    with Client(server.address, token=ADMIN_TOKEN) as client:
        client.reload()
        assert client.model_info()["bundle_path"] == str(second.resolve())


def test_a_reload_without_a_path_refuses_the_named_link_once_it_leads_outside_the_reload_root(start_server, tmp_path):
    server, link = served_through_a_link(start_server, tmp_path)
    repoint(link, write_bundle(tmp_path / "outside", bias=3.0))
    refusal = server.refused_reload(None, ADMIN)
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "EDGEDISTILL_RELOAD_ROOT" in refusal.details
    assert refusal.serving.bundle_path == str((link.parent / "v1").resolve())


def test_a_reload_naming_a_symlink_loop_is_refused_as_an_unusable_path(start_server, tmp_path):
    root = tmp_path / "root"
    first = write_bundle(root / "v1")
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    server = start_server(settings_for(first, reload_root=root, admin_token=ADMIN_TOKEN))
    assert server.refused_reload(root / "a", ADMIN).code == grpc.StatusCode.INVALID_ARGUMENT


STALL_S = 3.0  # how long resolving the reloaded folder takes, as on a network mount that stops answering a while
LOOP_LIMIT_S = 2.0  # the loop watchdog's limit and the Classify call's deadline meanwhile: under STALL_S


@pytest.fixture
def reload_on_a_stalled_mount(start_server, tmp_path, monkeypatch) -> tuple[grpc.StatusCode, list[float]]:
    """A Reload call naming `v2` of a reload root whose path takes STALL_S to resolve the first time: the code of a Classify call
    made meanwhile, and the stalls a loop watchdog (LOOP_LIMIT_S) saw on the server's loop."""
    root = tmp_path / "root"
    first = write_bundle(root / "v1")
    write_bundle(root / "v2")
    server = start_server(settings_for(first, reload_root=root, admin_token=ADMIN_TOKEN))
    resolving, resolve = threading.Event(), Path.resolve

    def stalled(path, strict=False):
        if path.name == "v2" and not resolving.is_set():  # the first time only: then the mount answers
            resolving.set()
            time.sleep(STALL_S)
        return resolve(path, strict)

    monkeypatch.setattr(Path, "resolve", stalled)
    stalls = []
    watchdog = LoopWatchdog(server.loop, LOOP_LIMIT_S, stalls.append)
    watchdog.start()
    try:
        with server.channel() as channel:
            stub = classifier_pb2_grpc.ClassifierStub(channel)
            reload = stub.Reload.future(pb.ReloadRequest(bundle_path="v2"), metadata=ADMIN, timeout=30)
            resolving.wait(10)
            try:
                stub.Classify(pb.ClassifyRequest(texts=["good"]), timeout=LOOP_LIMIT_S)
                code = grpc.StatusCode.OK
            except grpc.RpcError as err:
                code = err.code()
            reload.result()
    finally:
        watchdog.stop()
    return code, stalls


@pytest.mark.serial  # bounds on time
def test_a_reload_whose_folder_is_slow_to_resolve_leaves_the_server_answering(reload_on_a_stalled_mount):
    code, _ = reload_on_a_stalled_mount
    assert code == grpc.StatusCode.OK


@pytest.mark.serial  # bounds on time
def test_a_reload_whose_folder_is_slow_to_resolve_leaves_the_event_loop_running(reload_on_a_stalled_mount):
    _, stalls = reload_on_a_stalled_mount
    assert stalls == []
