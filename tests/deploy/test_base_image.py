"""deploy/base-image.sh: an existing base image is enough for any user, a user other than root is told that making
one needs root (or that podman is not installed), under sudo the image goes to the store of the user who ran sudo, its apt sources name the updates and
security suites, and REFRESH=1 makes it again. podman, id, sudo and debootstrap are stubs on PATH; nothing is built."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/edgedistill-base:bookworm"
MIRROR, SECURITY_MIRROR = "http://mirror.invalid/debian", "http://security.invalid/debian-security"


def stub(folder: Path, name: str, script: str) -> None:
    (folder / name).write_text(f"#!/bin/sh\n{script}\n")
    (folder / name).chmod(0o755)


def script_env(tmp_path, refresh: bool, **variables: str) -> dict[str, str]:
    """The environment with the stubs first on PATH, and REFRESH=1 or none."""
    env = {name: value for name, value in os.environ.items() if name != "REFRESH"}
    env |= {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", **variables}
    return env | {"REFRESH": "1"} if refresh else env


def base_image_as_a_user(tmp_path, image_exists: bool, refresh: bool = False) -> subprocess.CompletedProcess:
    """The script for IMAGE, run by user 1000 (id's stub), with podman's stub saying whether IMAGE exists."""
    stub(tmp_path, "id", "echo 1000")
    stub(tmp_path, "podman", f'[ "$1 $2 $3" = "image exists {IMAGE}" ] && exit {0 if image_exists else 1}; exit 125')
    env = script_env(tmp_path, refresh)
    command = [str(ROOT / "deploy" / "base-image.sh"), IMAGE]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_an_existing_base_image_passes_for_a_user_other_than_root(tmp_path):
    assert base_image_as_a_user(tmp_path, image_exists=True).returncode == 0


def test_an_existing_base_image_is_skipped(tmp_path):
    assert f"{IMAGE} exists, skipped" in base_image_as_a_user(tmp_path, image_exists=True).stderr


def test_a_missing_base_image_for_a_user_other_than_root_fails(tmp_path):
    assert base_image_as_a_user(tmp_path, image_exists=False).returncode == 1


@pytest.mark.parametrize("fix", ["run sudo make base-image", "set BASE_IMAGE to an image your podman has"])
def test_a_missing_base_image_for_a_user_other_than_root_names_the_fix(tmp_path, fix):
    assert fix in base_image_as_a_user(tmp_path, image_exists=False).stderr


def base_image_without_podman(tmp_path) -> subprocess.CompletedProcess:
    """The script for IMAGE, run by user 1000 (id's stub) on a PATH of id's stub and bash alone: no podman."""
    stub(tmp_path, "id", "echo 1000")
    (tmp_path / "bash").symlink_to(shutil.which("bash"))
    env = script_env(tmp_path, refresh=False) | {"PATH": str(tmp_path)}
    command = [str(ROOT / "deploy" / "base-image.sh"), IMAGE]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_a_user_without_podman_is_told_it_is_not_installed_and_how_to_get_it(tmp_path):
    assert "podman is not installed: run sudo make base-image, which installs it" in (
        base_image_without_podman(tmp_path).stderr
    )


def test_a_user_without_podman_is_not_told_of_its_image_store(tmp_path):
    assert "image store" not in base_image_without_podman(tmp_path).stderr


def base_image_under_sudo(
    tmp_path, stores: str, refresh: bool = False
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The script for IMAGE run by root under sudo for alice, with IMAGE in the podman stores named in `stores`
    (`root`, `alice`); its result and the podman and debootstrap calls, each as `<user> <command line>`. debootstrap's
    stub writes the sources it would (`debootstrap --variant=minbase SUITE ROOTFS MIRROR`); podman's unpacks what it
    imports into tmp_path/imported."""
    calls = tmp_path / "calls.log"
    stub(tmp_path, "id", "echo 0")
    stub(tmp_path, "sudo", '[ "$1 $3" = "-u -H" ] || exit 1; user=$2; shift 3; AS=$user exec "$@"')
    podman = f"""echo "${{AS:-root}} podman $*" >> {calls}
case "$1 $2" in
  "image exists") case " {stores} " in *" ${{AS:-root}} "*) exit 0;; *) exit 1;; esac;;
  "image inspect") echo 1;;
  "save "*) echo archive;;
  "import "*) mkdir -p {tmp_path}/imported && tar -x -C {tmp_path}/imported;;
  "load "*) cat >/dev/null;;
esac"""
    stub(tmp_path, "podman", podman)
    debootstrap = f'echo "root debootstrap $*" >> {calls}; mkdir -p "$3/etc/apt"; echo "deb $4 $2 main" > "$3/etc/apt/sources.list"'
    stub(tmp_path, "debootstrap", debootstrap)
    stub(tmp_path, "runc", "exit 0")
    env = script_env(tmp_path, refresh, SUDO_USER="alice", DEBIAN_MIRROR=MIRROR, DEBIAN_SECURITY_MIRROR=SECURITY_MIRROR)
    command = [str(ROOT / "deploy" / "base-image.sh"), IMAGE]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    return done, calls.read_text().splitlines() if calls.exists() else []


def first(calls: list[str], prefix: str) -> int:
    """The index of the first call that starts with `prefix`."""
    return next(i for i, call in enumerate(calls) if call.startswith(prefix))


def test_a_base_image_made_under_sudo_succeeds(tmp_path):
    done, _ = base_image_under_sudo(tmp_path, stores="")
    assert done.returncode == 0, done.stderr


def test_a_base_image_made_under_sudo_is_loaded_into_the_invoking_users_store_after_the_import(tmp_path):
    _, calls = base_image_under_sudo(tmp_path, stores="")
    assert first(calls, "alice podman load") > first(calls, "root podman import")


def test_a_base_image_in_roots_store_alone_is_loaded_into_the_invoking_users_store_under_sudo(tmp_path):
    _, calls = base_image_under_sudo(tmp_path, stores="root")
    assert "alice podman load --quiet" in calls


def test_a_base_image_in_roots_store_alone_is_not_made_again_under_sudo(tmp_path):
    _, calls = base_image_under_sudo(tmp_path, stores="root")
    assert not any(call.startswith("root debootstrap") for call in calls)


def test_a_base_image_in_the_invoking_users_store_is_skipped_under_sudo(tmp_path):
    _, calls = base_image_under_sudo(tmp_path, stores="alice")
    assert calls == [f"alice podman image exists {IMAGE}"]


def test_the_base_images_apt_sources_name_the_updates_and_security_suites(tmp_path):
    base_image_under_sudo(tmp_path, stores="")
    assert (tmp_path / "imported/etc/apt/sources.list").read_text().splitlines() == [
        f"deb {MIRROR} bookworm main",
        f"deb {MIRROR} bookworm-updates main",
        f"deb {SECURITY_MIRROR} bookworm-security main",
    ]


@pytest.mark.parametrize("stores", ["root", "root alice"])
def test_refresh_makes_an_existing_base_image_again_under_sudo(tmp_path, stores):
    done, calls = base_image_under_sudo(tmp_path, stores=stores, refresh=True)
    assert done.returncode == 0, done.stderr
    assert first(calls, "alice podman load") > first(calls, "root podman import") > first(calls, "root debootstrap")


def test_refresh_by_a_user_other_than_root_fails_naming_sudo(tmp_path):
    done = base_image_as_a_user(tmp_path, image_exists=True, refresh=True)
    assert done.returncode == 1
    assert "run sudo make base-image REFRESH=1" in done.stderr
