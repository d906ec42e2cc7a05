"""``smcr device`` finds the shm RNICs in reach: this user's rendezvous sockets and every
user's abstract ones in the network namespace (:func:`smcr.tools.device.shm_gids`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from smcr.rdma.shm import rendezvous
from smcr.tools.device import shm_gids

HEADER = "Num       RefCount Protocol Flags    Type St Inode Path\n"


def test_abstract_sockets_of_any_user_and_own_paths_are_listed_once(tmp_path: Path) -> None:
    """An abstract listener (another user's), its accepted connection (same name), a
    path of ours and a foreign abstract name: two GIDs, each once."""
    ours, theirs = rendezvous.new_gid(), rendezvous.new_gid()
    directory = tmp_path / "rdv"
    directory.mkdir(mode=0o700)
    (directory / f"{ours.hex()}.sock").touch()
    name = rendezvous.abstract_address(theirs).replace("\0", "@")
    table = tmp_path / "unix"
    table.write_text(HEADER
                     + f"0000: 00000002 00000000 00010000 0005 01 11 {name}\n"
                     + f"0001: 00000003 00000000 00000000 0005 03 12 {name}\n"
                     + "0002: 00000002 00000000 00010000 0005 01 13 @other-program\n"
                     + "0003: 00000003 00000000 00000000 0001 03 14\n")  # fmt: skip
    assert shm_gids(directory, table) == [ours, theirs]
    assert shm_gids(tmp_path / "missing", tmp_path / "no-table") == []


def test_another_programs_name_of_any_bytes_is_passed_over(tmp_path: Path) -> None:
    """An abstract name of another program's that is not UTF-8, or holds a line break (the
    kernel prints a name's bytes as they are): the table is still read, our device found."""
    theirs = rendezvous.new_gid()
    name = rendezvous.abstract_address(theirs).replace("\0", "@").encode()
    table = tmp_path / "unix"
    table.write_bytes(HEADER.encode()
                      + b"0000: 00000002 00000000 00010000 0002 01 11 @\x9b\xff\x1c\x85odd\n"
                      + b"0001: 00000002 00000000 00010000 0002 01 12 @two\nlines\n"
                      + b"0002: 00000002 00000000 00010000 0005 01 13 " + name + b"\n")  # fmt: skip
    assert shm_gids(tmp_path / "missing", table) == [theirs]


def test_a_live_device_is_found_by_its_abstract_name(tmp_path: Path) -> None:
    """A device whose directory we do not look in is still listed (the real table)."""
    from smcr.rdma.shm import ShmDevice  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="smcr-t") as short:  # socket paths < 108 bytes
        os.chmod(short, 0o700)
        dev = ShmDevice("listed", directory=Path(short))
        try:
            assert dev.gid in shm_gids(tmp_path / "elsewhere")
        finally:
            dev.close()
