"""The verbs RNIC's parts that need no device (this host's kernel has no RDMA): the GID table
read from sysfs (a fake tree, laid out as Linux's), and a clear reason where pyverbs is
missing.  The device itself is tested in the interop guests (tests/interop/test_verbs.py)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smcr.rdma import VerbsError, ibverbs
from smcr.rdma.ibverbs import binding, sysfs
from smcr.rdma.ibverbs.device import VerbsDevice
from smcr.tools import device


def fake_port(root: Path, device: str, port: int,
              entries: list[tuple[int, str, str, str | None]]) -> None:  # fmt: skip
    """A port's GID table: (index, GID text, type, net device) per used entry, and two
    unused entries (zero GIDs, whose attributes fail to read as on Linux)."""
    base = root / device / "ports" / str(port)
    for d in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (base / d).mkdir(parents=True, exist_ok=True)
    last = 0
    for index, gid, kind, netdev in entries:
        (base / "gids" / str(index)).write_text(gid + "\n")
        (base / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
        if netdev is not None:
            (base / "gid_attrs" / "ndevs" / str(index)).write_text(netdev + "\n")
        last = max(last, index)
    for index in (last + 1, last + 2):
        (base / "gids" / str(index)).write_text("0000:" * 7 + "0000\n")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    fake_port(tmp_path, "rxe0", 1, [
        (0, "fe80:0000:0000:0000:5054:00ff:fe99:0011", "RoCE v2", "eth0"),
        (1, "0000:0000:0000:0000:0000:ffff:0a63:000b", "IB/RoCE v1", "eth0"),
        (2, "0000:0000:0000:0000:0000:ffff:0a63:000b", "RoCE v2", "eth0"),
        (3, "fd00:0000:0000:0000:0000:0000:0000:0002", "RoCE v2", "eth0"),
    ])  # fmt: skip
    fake_port(tmp_path, "mlx5_0", 1, [
        (0, "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2", "ens1"),
    ])  # fmt: skip
    return tmp_path


def test_the_roce_v2_gid_of_an_address_is_found(tree: Path) -> None:
    entry = sysfs.find_gid("10.99.0.11", tree)
    assert entry == sysfs.GidEntry("rxe0", 1, 2, sysfs.address_gid("10.99.0.11"), "RoCE v2",
                                   "eth0")  # fmt: skip  (the v1 entry of index 1 passed over)
    assert sysfs.find_gid("fd00::2", tree) is not None
    assert sysfs.find_gid("fd00::2", tree).index == 3  # type: ignore[union-attr]
    assert sysfs.find_gid("10.0.0.1", tree).device == "mlx5_0"  # type: ignore[union-attr]
    assert sysfs.find_gid("10.0.0.1", tree, device="rxe0") is None
    assert sysfs.find_gid("192.0.2.9", tree) is None


def test_the_gid_tables_leave_unused_entries_out(tree: Path) -> None:
    assert sysfs.device_names(tree) == ["mlx5_0", "rxe0"]
    assert [e.index for e in sysfs.gid_entries("rxe0", tree)] == [0, 1, 2, 3]
    assert sysfs.address_gid("10.99.0.11") == bytes(10) + b"\xff\xff" + bytes([10, 99, 0, 11])
    assert sysfs.device_names(tree / "absent") == []
    assert sysfs.gid_entries("absent", tree) == []


def test_a_table_is_read_up_to_a_run_of_unused_entries(tmp_path: Path) -> None:
    """Entries sit at the start of a table (the kernel takes the lowest free index): a hole
    shorter than EMPTY_RUN is passed over, the scan ends at a longer one; one entry is read
    by its index alone (the device's look at its own GID, every second)."""
    near = sysfs.EMPTY_RUN  # after a hole of EMPTY_RUN - 1
    far = near + sysfs.EMPTY_RUN + 1  # after one of EMPTY_RUN
    fake_port(tmp_path, "rxe0", 1, [
        (0, "fe80:0000:0000:0000:5054:00ff:fe99:0011", "RoCE v2", "eth0"),
        (near, "0000:0000:0000:0000:0000:ffff:0a63:000b", "RoCE v2", "eth0"),
        (far, "0000:0000:0000:0000:0000:ffff:0a63:000c", "RoCE v2", "eth0"),
    ])  # fmt: skip
    gids = tmp_path / "rxe0" / "ports" / "1" / "gids"
    for index in range(far):
        if not (gids / str(index)).exists():
            (gids / str(index)).write_text("0000:" * 7 + "0000\n")
    assert [e.index for e in sysfs.gid_entries("rxe0", tmp_path)] == [0, near]
    assert sysfs.find_gid("10.99.0.11", tmp_path) is not None
    assert sysfs.find_gid("10.99.0.12", tmp_path) is None
    entry = sysfs.gid_entry("rxe0", 1, far, tmp_path)
    assert entry is not None and entry.gid == sysfs.address_gid("10.99.0.12")
    assert sysfs.gid_entry("rxe0", 1, 1, tmp_path) is None  # unused
    assert sysfs.gid_entry("rxe0", 1, 99999, tmp_path) is None  # beyond the table


def test_a_host_without_pyverbs_says_why_and_refuses_the_device() -> None:
    pytest.importorskip("smcr")  # (always there: the test is about pyverbs' absence)
    reason = binding.missing()
    try:
        import pyverbs  # type: ignore[import-not-found]  # noqa: F401, PLC0415
    except ImportError:
        assert reason is not None and "pyverbs" in reason
        with pytest.raises(VerbsError) as info:
            VerbsDevice("127.0.0.1")
        assert info.value.errno == errno.ENODEV and "pyverbs" in str(info.value)
    else:
        assert reason is None


def test_smcr_device_lists_each_port_with_its_ipv4_gid(tree: Path) -> None:
    (tree / "rxe0" / "ports" / "1" / "state").write_text("4: ACTIVE\n")
    rows = device.verbs_rows("10.99.0.11", tree)
    assert [(r.name, r.type, r.netdev, r.gid, r.state, r.default) for r in rows] == [
        ("mlx5_0", "verbs", "ens1", "::ffff:10.0.0.1", "-", False),
        ("rxe0", "verbs", "eth0", "::ffff:10.99.0.11", "ACTIVE", True),
    ]  # fmt: skip


def test_smcr_device_says_in_one_line_why_verbs_cannot_be_used() -> None:
    out = subprocess.run([sys.executable, "-m", "smcr", "device"], capture_output=True,
                         text=True, check=True, timeout=60,
                         env=os.environ | {"SMCR_RNIC": "verbs"})  # fmt: skip
    reason = ibverbs.unusable()
    if reason is None:
        return  # (a host with a usable device and pyverbs: nothing to say)
    assert out.stdout.splitlines()[-1] == f"verbs RNIC unusable: {reason}", out.stdout
    shm = subprocess.run([sys.executable, "-m", "smcr", "device"], capture_output=True,
                         text=True, check=True, timeout=60,
                         env=os.environ | {"SMCR_RNIC": "shm"})  # fmt: skip
    assert "verbs RNIC unusable" not in shm.stdout
