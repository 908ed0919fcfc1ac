"""Reloads of a folder a Reload call named through a symlink: the link is followed anew at every reload."""

import grpc
from edgedistill.serve.client import Client

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
