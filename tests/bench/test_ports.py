"""Ports for measured servers: picked below the kernel's ephemeral range, claimed against other pickers."""

import fcntl
import socket
from pathlib import Path

from edgedistill.bench import ports
from edgedistill.bench.ports import free_port


def test_a_picked_port_lies_below_the_kernels_ephemeral_range(tmp_path):
    (tmp_path / "range").write_text("32768\t60999\n")
    assert ports.PICK_FLOOR <= free_port(tmp_path / "range") < 32768


def test_ports_picked_one_after_another_differ():
    assert len({free_port() for _ in range(50)}) == 50


def test_a_port_someone_holds_is_not_picked(tmp_path, monkeypatch):
    (tmp_path / "range").write_text("32768 60999")
    first = free_port(tmp_path / "range")
    monkeypatch.setattr(ports, "_next_pick", first - ports.PICK_FLOOR)  # look at `first` first again
    monkeypatch.setattr(ports, "CLAIMS", tmp_path / "claims")  # where this process holds no claim of `first`
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        assert free_port(tmp_path / "range") != first


def locked_elsewhere(claims: Path, port: int) -> bool:
    """Whether `port`'s claim in `claims` is held: a lock of another open file fails, as in another process."""
    with (claims / str(port)).open("a") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def test_a_picked_port_stays_claimed_against_other_pickers(tmp_path, monkeypatch):
    monkeypatch.setattr(ports, "CLAIMS", tmp_path)
    assert locked_elsewhere(tmp_path, free_port())


def test_a_port_another_picker_claimed_is_not_picked(tmp_path, monkeypatch):
    monkeypatch.setattr(ports, "CLAIMS", tmp_path / "claims")
    (tmp_path / "range").write_text("32768 60999")
    first = free_port(tmp_path / "range")
    monkeypatch.setattr(ports, "_next_pick", first - ports.PICK_FLOOR)  # look at `first` first again
    assert free_port(tmp_path / "range") != first


def test_a_folder_where_claims_cannot_be_written_still_gives_a_port(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(ports, "CLAIMS", tmp_path / "file" / "claims")
    assert ports.PICK_FLOOR <= free_port() < ports.ephemeral_low()


def test_a_kernel_without_an_ephemeral_range_gives_a_port_of_port_0(tmp_path):
    assert free_port(tmp_path / "absent") >= ports.ephemeral_low()
