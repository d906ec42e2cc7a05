"""An SMC-R connection over the RoCE RNIC between two namespaces, captured and decoded.

What Wireshark must see (issue 5): the TCP handshake and the CLC messages on
the TCP connection, then RoCEv2 packets whose payloads it names as SMC-R LLC
(CONFIRM LINK and its response) and CDC messages, and RDMA WRITEs carrying the
data; scapy's RoCE layer checks every ICRC.  The capture runs with dumpcap on
host A's veth end, in that namespace; both SMC-R ends are spawned peers moved
into their namespaces (``smc_peer.in_netns``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import UDP
from scapy.layers.l2 import Ether

from smcr.tools.tshark import HEURISTIC_FIRST
from tests.roce.netns import Hosts
from tests.socket import smc_peer
from tests.socket.conftest import Peer
from tests.support import pcap_frames, stop_capture, wait_for_mark

pytestmark = [
    pytest.mark.root,
    pytest.mark.tshark,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
    pytest.mark.skipif(shutil.which("dumpcap") is None, reason="needs dumpcap/tshark"),
]


@pytest.fixture
def pcap() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="smcr-cap"))
    os.chmod(path, 0o755)  # dumpcap may drop to another user
    yield path / "smcr-roce.pcapng"
    shutil.rmtree(path, ignore_errors=True)


def _mark(hosts: Hosts, payload: bytes) -> None:
    """A UDP datagram (port 9, discard) from host A to host B, for :func:`wait_for_mark`."""
    hosts.exec(0, sys.executable, "-c", "import socket; socket.socket(socket.AF_INET, "
               f"socket.SOCK_DGRAM).sendto({payload!r}, ('{hosts.addr[1]}', 9))")  # fmt: skip


def _capture(hosts: Hosts, path: Path) -> subprocess.Popen[bytes]:
    """dumpcap on host A's veth, once it is live (else the CLC would be missed)."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", hosts.ns[0], "dumpcap", "-q", "-i", hosts.ifs[0], "-w", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for_mark(path, lambda payload: _mark(hosts, payload))
    return proc


def test_smcr_over_roce_capture_decodes_tcp_clc_llc_cdc_and_writes(
        pcap: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("SMCR_RNIC", "roce")
    with Hosts() as hosts:
        monkeypatch.setenv(smc_peer.HOST_ENV, hosts.addr[1])
        for i in (0, 1):  # segment GSO runs before the capture point: one frame per packet
            hosts.exec(i, sys.executable, "-m", "tests.roce.ethtool", hosts.ifs[i],
                       "tx-udp-segmentation", "off")  # fmt: skip
        cap = _capture(hosts, pcap)
        peers = []
        try:
            server = Peer(smc_peer.in_netns, hosts.ns[1], smc_peer.echo_server)
            peers.append(server)
            port = server.recv()
            client = Peer(smc_peer.in_netns, hosts.ns[0], smc_peer.echo_client, hosts.addr[1],
                          port, 10_000)  # fmt: skip
            peers.append(client)
            assert client.recv() == ("SMCR", True)
            assert server.recv() == ("SMCR", 0, 0)
            for p in peers:
                p.stop()
            wait_for_mark(pcap, lambda payload: _mark(hosts, payload))  # the close is in
        finally:
            stop_capture(cap)
            for p in peers:
                p.stop()
    rows = _fields(pcap)
    clc = [(n, int(r[1])) for n, r in enumerate(rows) if r[1]]
    assert [t for _, t in clc] == [1, 2, 3]  # Proposal, Accept, Confirm
    syn = next(n for n, r in enumerate(rows) if r[4] and int(r[4], 0) & 0x12 == 0x02)
    assert syn < clc[0][0]  # the TCP handshake before the CLC
    llc = [(n, int(r[2], 0)) for n, r in enumerate(rows) if r[2]]
    assert [t for _, t in llc].count(0x01) == 2  # CONFIRM LINK and its response
    assert [t for _, t in llc].count(0xFE) >= 2  # CDC messages both ways
    first_llc = min(n for n, _ in llc)
    assert first_llc > clc[-1][0]  # the link comes up after the CLC Confirm
    # every SEND (CDC, LLC) solicited and no WRITE, as Linux posts them (the golden
    # capture: SE on all 36 SEND Only frames, on none of the WRITEs)
    se = {(int(r[3], 0), r[5]) for r in rows if r[3] and int(r[3], 0) in (4, 6, 7, 8, 10)}
    assert {op for op, flag in se if flag == "1"} == {4} and (4, "0") not in se, se
    writes = [n for n, r in enumerate(rows) if r[3] and int(r[3], 0) in (6, 7, 8, 10)]
    ops = {int(rows[n][3], 0) for n in writes}
    assert {6, 8} <= ops, ops  # 10,000 bytes at path MTU 1024: FIRST ... LAST, both ways
    assert min(writes) > first_llc
    roce = 0
    for frame in pcap_frames(pcap):
        pkt = Ether(frame)
        if UDP in pkt and pkt[UDP].dport == 4791:
            roce += 1
            assert pkt[BTH].compute_icrc(b"") == frame[-4:], pkt.summary()
    # every RoCE frame is InfiniBand to tshark (ICMP errors quoting one are not counted)
    assert roce == sum(1 for r in rows if r[0].startswith("eth:ethertype:ip:udp:infiniband"))
    assert roce >= 20


def _fields(pcap: Path) -> list[list[str]]:
    """Per frame: protocols, CLC type, LLC/CDC type, BTH opcode, TCP flags, BTH solicited
    event (tshark's view)."""
    out = subprocess.run(
        ["tshark", *HEURISTIC_FIRST, "-r", str(pcap), "-T", "fields", "-e", "frame.protocols",
         "-e", "smc.clc_msg", "-e", "smc.llc_msg", "-e", "infiniband.bth.opcode", "-e", "tcp.flags",
         "-e", "infiniband.bth.se"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return [line.split("\t") for line in out.splitlines() if line.strip()]
