"""RNIC choice (``smcr.stack.devices``), the CLC prefix over RoCE, and ``smcr device``."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from smcr.cli import main
from smcr.core.handshake import prefix_area
from smcr.rdma.shm import ShmDevice
from smcr.stack import devices, runtime
from smcr.stack.runtime import close_stacks


def test_rnic_kind_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(devices.RNIC_ENV, raising=False)
    assert devices.rnic_kind() == "shm"
    monkeypatch.setenv(devices.RNIC_ENV, "RoCE")
    assert devices.rnic_kind() == "roce"
    monkeypatch.setenv(devices.RNIC_ENV, "rxe")
    with pytest.raises(ValueError, match="SMCR_RNIC"):
        devices.rnic_kind()


def test_max_links_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SMCR_MAX_LINKS`` as Linux's ``net.smc.smcr_max_links_per_lgr`` (1 or 2), default 1;
    a runtime made afterwards offers that many in its SMC-Rv2.1 Proposal."""
    monkeypatch.delenv(runtime.MAX_LINKS_ENV, raising=False)
    assert runtime.max_links() == 1
    monkeypatch.setenv(runtime.MAX_LINKS_ENV, "2")
    assert runtime.max_links() == 2
    close_stacks()
    try:
        assert runtime.get_stack().config.max_links_v2 == 2
    finally:
        close_stacks()
    for bad in ("0", "3", "two"):
        monkeypatch.setenv(runtime.MAX_LINKS_ENV, bad)
        with pytest.raises(ValueError, match="SMCR_MAX_LINKS"):
            runtime.max_links()


def test_testlink_time_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SMCR_TESTLINK_TIME`` as Linux's ``net.smc.smcr_testlink_time``: seconds, 0 off,
    default 30; a runtime made afterwards keeps its keepalive at that interval."""
    monkeypatch.delenv(runtime.TESTLINK_ENV, raising=False)
    assert runtime.testlink_time() == 30.0
    monkeypatch.setenv(runtime.TESTLINK_ENV, "1.5")
    assert runtime.testlink_time() == 1.5
    close_stacks()
    try:
        assert runtime.get_stack().config.testlink_time == 1.5
    finally:
        close_stacks()
    monkeypatch.setenv(runtime.TESTLINK_ENV, "0")
    assert runtime.testlink_time() == 0.0
    for bad in ("-1", "nan", "soon"):
        monkeypatch.setenv(runtime.TESTLINK_ENV, bad)
        with pytest.raises(ValueError):
            runtime.testlink_time()


def test_loopback_rnic_addresses_differ_per_process_and_stay_in_127_8() -> None:
    seen = {devices.loopback_address(pid) for pid in range(1, 1 << 22, 997)}
    assert len(seen) == len(range(1, 1 << 22, 997))
    for text in seen:
        ip = ipaddress.ip_address(text)
        assert ip.is_loopback and text != "127.0.0.1"


def test_loopback_connections_use_the_loopback_rnic() -> None:
    assert devices.roce_key(ipaddress.ip_address("127.0.0.1")) == devices.LOOPBACK
    assert devices.roce_key(ipaddress.ip_address("::ffff:127.0.0.1")) == devices.LOOPBACK


def test_prefix_of_an_interface_address_is_its_subnet() -> None:
    area = prefix_area(ipaddress.ip_interface("10.77.3.2/24"))
    assert (str(area.outgoing_subnet), area.prefix_len) == ("10.77.3.0", 24)
    assert area == prefix_area(ipaddress.ip_interface("10.77.3.1/24"))
    assert area != prefix_area(ipaddress.ip_address("10.77.3.2"))  # shm: same host only
    six = prefix_area(ipaddress.ip_interface("fd77:3::2/64"))
    assert [(str(p.prefix), p.prefix_len) for p in six.ipv6_prefixes] == [("fd77:3::", 64)]


def test_smcr_device_lists_roce_and_shm_rnics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SMCR_SHM_DIR", str(tmp_path / "rdv"))
    monkeypatch.setenv(devices.RNIC_ENV, "roce")
    with ShmDevice("shmtest") as dev:
        assert main(["device", "--json"]) == 0
        table = json.loads(capsys.readouterr().out)
        assert main(["device", "show"]) == 0
        text = capsys.readouterr().out
    lo = next(r for r in table if r["name"] == "roce_lo")
    assert (lo["type"], lo["netdev"], lo["gid"]) == ("roce", "lo", "::ffff:127.0.0.1")
    # ours (other smcr processes of this network namespace list theirs too)
    shm = [r for r in table if r["type"] == "shm" and r["gid"] == dev.gid.hex()]
    assert len(shm) == 1
    assert sum(r["default"] for r in table) == 1
    assert text.splitlines()[0].split() == ["Name", "Type", "Netdev", "GID", "MAC", "MTU", "State",
                                            "Crit", "#Links"]  # (smcr.diag: no process, no link)
    assert all((r["links"], r["crit"]) == (0, "No") for r in shm)
    assert "roce_lo" in text
