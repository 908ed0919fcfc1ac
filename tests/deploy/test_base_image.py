"""deploy/base-image.sh before it makes anything: an existing base image is enough for any user, and a user
other than root is told that making one needs root. podman and id are stubs on PATH; nothing is built."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/edgedistill-base:bookworm"


def stub(folder: Path, name: str, script: str) -> None:
    (folder / name).write_text(f"#!/bin/sh\n{script}\n")
    (folder / name).chmod(0o755)


def base_image_as_a_user(tmp_path, image_exists: bool) -> subprocess.CompletedProcess:
    """The script for IMAGE, run by user 1000 (id's stub), with podman's stub saying whether IMAGE exists."""
    stub(tmp_path, "id", "echo 1000")
    stub(tmp_path, "podman", f'[ "$1 $2 $3" = "image exists {IMAGE}" ] && exit {0 if image_exists else 1}; exit 125')
    env = os.environ | {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    command = [str(ROOT / "deploy" / "base-image.sh"), IMAGE]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_an_existing_base_image_passes_for_a_user_other_than_root(tmp_path):
    assert base_image_as_a_user(tmp_path, image_exists=True).returncode == 0


def test_an_existing_base_image_is_skipped(tmp_path):
    assert f"{IMAGE} exists, skipped" in base_image_as_a_user(tmp_path, image_exists=True).stderr


def test_a_missing_base_image_for_a_user_other_than_root_fails(tmp_path):
    assert base_image_as_a_user(tmp_path, image_exists=False).returncode == 1


@pytest.mark.parametrize("fix", ["run make base-image as root", "set BASE_IMAGE to an image podman has"])
def test_a_missing_base_image_for_a_user_other_than_root_names_the_fix(tmp_path, fix):
    assert fix in base_image_as_a_user(tmp_path, image_exists=False).stderr
