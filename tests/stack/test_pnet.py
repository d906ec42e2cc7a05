"""PNET IDs (:mod:`smcr.pnet`, ``smcr pnet``): the table as Linux's ``smc_pnettable``, and
a runtime over two shm RNICs that adds a second link only over RNICs of the group's PNET ID
(Linux ``smc_pnet_find_alt_roce``)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from smcr import pnet
from smcr.cli import main
from smcr.core import Config, LgrType
from smcr.diag.snapshot import _lgr_row
from smcr.rdma.base import Device
from smcr.rdma.roce.netif import RnicInfo
from smcr.rdma.shm import ShmDevice
from smcr.rdma.verbs import PathMtu
from smcr.stack import devices
from smcr.stack.runtime import Stack
from tests.stack import hosts as h
from tests.stack.test_multirnic import active_ports, exchange, group, until

SIZE = 1 << 16


@pytest.mark.parametrize(("text", "stored"), [("NET1", "NET1"), ("net1", "NET1"),
                                              ("  Abc9  ", "ABC9"), ("A" * 16, "A" * 16)])
def test_valid_pnetids_are_stored_as_linux_stores_them(text: str, stored: str) -> None:
    assert pnet.normalize(text) == stored


@pytest.mark.parametrize("text", ["", "   ", "A" * 17, "NET-1", "NET 1", "NET_1", "NÉT"])
def test_invalid_pnetids_are_refused_as_linux_refuses_them(text: str) -> None:
    with pytest.raises(pnet.PnetError) as info:
        pnet.normalize(text)
    assert info.value.errno_name == "EINVAL"


def test_add_del_flush_as_the_kernel_table(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "pnet"
    assert pnet.load(path) == ()
    assert pnet.add("net1", netdev="eth0", rnic="roce_eth0", path=path) == "NET1"
    pnet.add("NET2", netdev="eth1", path=path)
    with pytest.raises(pnet.PnetError) as dup:  # a name keeps its PNET ID
        pnet.add("NET3", netdev="eth1", path=path)
    assert dup.value.errno_name == "EEXIST"
    with pytest.raises(pnet.PnetError) as none:
        pnet.add("NET3", path=path)
    assert none.value.errno_name == "EINVAL"
    pnet.add("NET2", netdev="eth1", rnic="shm1", path=path)  # something new: taken
    assert pnet.load(path) == (pnet.Entry("NET1", "netdev", "eth0"),
                               pnet.Entry("NET1", "rnic", "roce_eth0"),
                               pnet.Entry("NET2", "netdev", "eth1"),
                               pnet.Entry("NET2", "rnic", "shm1"))  # fmt: skip
    assert path.stat().st_mode & 0o777 == 0o644
    pnet.remove("net1", path)  # every entry of the PNET ID
    assert [e.pnetid for e in pnet.load(path)] == ["NET2", "NET2"]
    with pytest.raises(pnet.PnetError) as gone:
        pnet.remove("NET1", path)
    assert gone.value.errno_name == "ENOENT"
    pnet.flush(path)
    assert pnet.load(path) == ()


def test_a_hand_edited_file_keeps_the_valid_lines(tmp_path: Path) -> None:
    path = tmp_path / "pnet"
    path.write_text("# site\nnet1 netdev eth0\nBAD-ID netdev eth1\nNET2 disk sda\n"
                    "NET3 rnic shm0  # comment\nNET4 netdev eth0\n")  # fmt: skip
    assert pnet.load(path) == (pnet.Entry("NET1", "netdev", "eth0"),
                               pnet.Entry("NET3", "rnic", "shm0"))  # fmt: skip


def test_an_rnic_entry_wins_over_its_net_device_s() -> None:
    entries = (pnet.Entry("NETA", "netdev", "eth0"), pnet.Entry("NETB", "rnic", "roce_eth0"))
    assert pnet.lookup(entries, "eth0", ("roce_eth0",)) == "NETB"
    assert pnet.lookup(entries, "eth0", ("roce_eth0_1",)) == "NETA"
    assert pnet.lookup(entries, "eth1", ("shm0",)) == ""


def test_smcr_pnet_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv(pnet.ENV, str(tmp_path / "pnet"))
    assert main(["pnet", "add", "net1", "-I", "eth0", "-D", "roce_eth0"]) == 0
    assert main(["pnet", "add", "NET2", "-D", "shm1"]) == 0
    assert main(["pnet", "add", "NET3", "-I", "eth0"]) == 1
    assert "EEXIST" in capsys.readouterr().err
    assert main(["pnet", "add", "NET-3", "-I", "eth9"]) == 1
    assert "EINVAL" in capsys.readouterr().err
    assert main(["pnet"]) == 0
    assert capsys.readouterr().out == "NET1 netdev eth0\nNET1 rnic roce_eth0\nNET2 rnic shm1\n"
    assert main(["pnet", "del", "NET1"]) == 0
    assert main(["pnet", "del", "NET1"]) == 1
    assert "ENOENT" in capsys.readouterr().err
    assert main(["pnet", "show"]) == 0
    assert capsys.readouterr().out == "NET2 rnic shm1\n"
    assert main(["pnet", "flush"]) == 0
    assert main(["pnet", "show"]) == 0
    assert capsys.readouterr().out == ""


@contextmanager
def hosts_with(tables: list[Path]) -> Iterator[list[Stack]]:
    """One runtime per table, each over two shm RNICs (``shm0``, ``shm1`` in its table)."""
    made = []
    try:
        for i, table in enumerate(tables):
            devs = [ShmDevice(f"t{os.getpid()}p{i}r{r}") for r in range(2)]
            made.append(Stack(Config(sndbuf_size=SIZE, rmb_size=SIZE), 64, devs[0], devs[1:],
                              pnet_table=pnet.PnetTable(table)))  # fmt: skip
        yield made
    finally:
        for stack in made:
            stack.close()


def tables(tmp_path: Path, second: str) -> list[Path]:
    """Two hosts' tables: ``shm0`` on NETA, ``shm1`` on ``second``."""
    out = []
    for side in ("server", "client"):
        path = tmp_path / side
        pnet.add("NETA", rnic="shm0", path=path)
        pnet.add(second, rnic="shm1", path=path)
        out.append(path)
    return out


def test_rnics_of_one_pnetid_make_a_second_link(tmp_path: Path) -> None:
    with hosts_with(tables(tmp_path, "NETA")) as (server, client):
        ends = h.connect(server, client)
        for stack in (server, client):
            until(lambda stack=stack: active_ports(stack) == [0, 1])  # type: ignore[misc]
            with stack.lock:
                lgr = group(stack)
                assert lgr.lgr_type is LgrType.SYMMETRIC and lgr.pnet_id == "NETA"
                assert _lgr_row(stack, lgr)["pnet_id"] == "NETA"
        exchange(server, client, ends, 1 << 18)


def test_rnics_of_another_pnetid_make_no_second_link(tmp_path: Path) -> None:
    with hosts_with(tables(tmp_path, "NETB")) as (server, client):
        ends = h.connect(server, client)
        # the server offers a link over its only RNIC of NETA (asymmetric, as Linux); the
        # client, with no other RNIC of NETA either, sees the same path and rejects it
        with server.lock:
            lgr = group(server)

        def offer_over() -> bool:
            with server.lock, client.lock:
                return (lgr.next_link_id >= 2 and lgr.flow is None and not lgr.flow_queue
                        and group(client).remote_add is None)  # fmt: skip

        until(offer_over)
        for stack in (server, client):
            with stack.lock:
                g = group(stack)
                assert [x.port for x in g.links] == [0]
                assert g.lgr_type is LgrType.SINGLE and g.pnet_id == "NETA"
        exchange(server, client, ends, 1 << 18)


def test_a_table_changed_reaches_the_runtime_at_its_next_connection(tmp_path: Path) -> None:
    path = tmp_path / "pnet"
    with hosts_with([path, path]) as (server, client):
        h.connect(server, client)
        with server.lock:
            assert [p.pnetid for p in server.engine.identity.ports] == ["", ""]
        pnet.add("NETA", rnic="shm1", path=path)
        h.connect(server, client)
        with server.lock:
            assert [p.pnetid for p in server.engine.identity.ports] == ["", "NETA"]


def _rnic(name: str, ifname: str, address: str) -> RnicInfo:
    return RnicInfo(name, ifname, address, bytes(16), bytes(6), 1500, PathMtu.MTU_1024, "up",
                    prefix_len=24)  # fmt: skip


def test_first_contact_takes_the_rnic_of_the_tcp_net_device_s_pnetid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """smc_pnet_find_roce_resource: the TCP connection's net device's PNET ID picks the
    RNIC; without one (or when its own RNIC has it), the net device's own RNIC."""
    infos = [_rnic("roce_eth0", "eth0", "10.1.0.1"), _rnic("roce_eth1", "eth1", "10.2.0.1"),
             _rnic("roce_eth2", "eth2", "10.3.0.1")]  # fmt: skip
    monkeypatch.setattr(devices, "list_devices", lambda: infos)
    path = tmp_path / "pnet"
    monkeypatch.setenv(pnet.ENV, str(path))
    tcp = ipaddress.ip_address("10.1.0.1")
    assert devices.roce_key(tcp) == "10.1.0.1"  # no table
    pnet.add("NETA", netdev="eth0", rnic="roce_eth0", path=path)
    pnet.add("NETB", rnic="roce_eth1", path=path)
    assert devices.roce_key(tcp) == "10.1.0.1"  # its own RNIC has its PNET ID
    pnet.flush(path)
    pnet.add("NETA", netdev="eth0", path=path)
    pnet.add("NETB", rnic="roce_eth0", path=path)
    pnet.add("NETA", rnic="roce_eth2", path=path)
    assert devices.roce_key(tcp) == "10.3.0.1"  # the RNIC of eth0's PNET ID
    # the CLC prefix stays the TCP connection's
    dev = SimpleNamespace(info=infos[2])
    assert devices.prefix_ip(cast(Device, dev), tcp) == ipaddress.ip_interface("10.1.0.1/24")
