"""A capture of the RNIC's traffic between two namespaces: tshark decodes it, scapy agrees.

The frames are what the kernel really put on the veth, so this also checks
what the sender only assumes about the IPv4 ID, which the ICRC covers (spec
rocev2 §4.4): an unconnected ``IP_PMTUDISC_DO`` socket sends ID 0 with DF, and
a UDP GSO send is cut into packets with IDs 0, 1, 2...  For the second, UDP
segmentation offload is switched off on the veths, so the kernel segments
before the capture point instead of handing the veth one large packet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from smcr.wire.roce_packet import verify_icrc
from tests.roce.netns import Hosts, PeerProc, connect
from tests.support import pcap_frames, stop_capture, wait_for_mark

pytestmark = [
    pytest.mark.root,
    pytest.mark.tshark,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
    pytest.mark.skipif(shutil.which("dumpcap") is None, reason="needs dumpcap/tshark"),
]


@pytest.fixture
def capture_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="smcr-cap"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def mark(hosts: Hosts, payload: bytes) -> None:
    """A UDP datagram (port 9, discard) from host A to host B, for :func:`wait_for_mark`."""
    hosts.exec(0, sys.executable, "-c", "import socket; socket.socket(socket.AF_INET, "
               f"socket.SOCK_DGRAM).sendto({payload!r}, ('{hosts.addr[1]}', 9))")  # fmt: skip


def start_capture(hosts: Hosts, path: Path) -> subprocess.Popen[bytes]:
    """dumpcap on host A's veth (RoCE and the markers), once it is live."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", hosts.ns[0], "dumpcap", "-q", "-i", hosts.ifs[0], "-w", str(path),
         "-f", "udp port 4791 or udp port 9"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_for_mark(path, lambda payload: mark(hosts, payload))
    return proc


@pytest.mark.parametrize("family", [4, 6])
def test_capture_decodes_in_tshark_and_every_icrc_is_right(capture_dir: Path, family: int) -> None:
    pcap = capture_dir / "roce.pcapng"
    with Hosts(mtu=1500) as hosts:
        addrs = hosts.addr if family == 4 else hosts.addr6
        a, b = PeerProc(hosts, 0, addrs[0]), PeerProc(hosts, 1, addrs[1])
        try:
            connect(a, b, timeout=12)
            for i in (0, 1):
                hosts.exec(i, sys.executable, "-m", "tests.roce.ethtool", hosts.ifs[i],
                           "tx-udp-segmentation", "off")  # fmt: skip
            cap = start_capture(hosts, pcap)
            try:
                a.ask("fill", seed=11, n=10_000)
                b.ask("post_recv", count=1)
                got = a.ask("post", remote=b.info, expect=3, wrs=[
                    ["RDMA_WRITE", 0, 5000, 0, True, 0, None],
                    ["SEND_WITH_IMM", 0, 45, 0, True, 7, None],
                    ["RDMA_READ", 8192, 3000, 0, True, 0, None],
                ])  # fmt: skip
                assert [w[1] for w in got["wcs"]] == ["SUCCESS"] * 3
                b.ask("post_recv", count=1)  # a WRITE of whole packets and a SEND behind it
                got = a.ask("post", remote=b.info, expect=2, wrs=[
                    ["RDMA_WRITE", 0, 3 * 1024, 0, True, 0, None],
                    ["SEND", 0, 44, 0, True, 0, None],
                ])  # fmt: skip
                assert [w[1] for w in got["wcs"]] == ["SUCCESS"] * 2
                got = a.ask("post", remote=b.info, expect=1,
                            wrs=[["RDMA_WRITE", 0, 8, 0, True, 0, 0x1234]])  # a NAK
                assert got["wcs"][0][1] == "REM_ACCESS_ERR"
                wait_for_mark(pcap, lambda payload: mark(hosts, payload))  # the NAK is in
            finally:
                stop_capture(cap)
        finally:
            a.close()
            b.close()
    frames = list(pcap_frames(pcap))
    frames = [f for f in frames if Ether(f)[UDP].dport == 4791]  # not the markers
    assert len(frames) >= 10
    ids: Counter[int] = Counter()
    for frame in frames:
        pkt = Ether(frame)
        assert pkt[UDP].dport == 4791 and len(frame) <= 14 + 1500
        if family == 4:
            ip = pkt[IP]
            assert ip.flags == "DF" and ip.ttl == 1  # what rxe/SMC-R send
            ids[ip.id] += 1
        else:
            assert pkt[IPv6].hlim == 1 and pkt[IPv6].fl == 0
        expected = pkt[BTH].compute_icrc(b"")
        assert expected == frame[-4:], pkt.summary()
        assert verify_icrc(frame[14:])
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-Y", "udp.dstport == 4791", "-T", "fields",
         "-e", "infiniband.bth.opcode",
         "-e", "infiniband.aeth.syndrome", "-e", "infiniband.reth.dmalen"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split("\n")  # fmt: skip
    if family == 4:
        assert ids[0] >= 1 and ids[1] >= 1 and ids[2] >= 1  # single packets, and GSO runs
        # the SEND went in the GSO run of the WRITE's Middle and Last (IDs 0, 1): the
        # kernel cut one sendmsg into the three (QueuePair._send_run)
        sends = [Ether(f)[IP].id for f in frames if Ether(f)[BTH].opcode == 0x04]
        assert sends == [2], sends
    rows = [line.split("\t") for line in out if line.strip()]
    assert len(rows) == len(frames)  # tshark decoded every frame as InfiniBand
    ops = Counter(int(r[0], 0) for r in rows)
    for op in (0x06, 0x07, 0x08, 0x05, 0x0C, 0x0D, 0x0F, 0x11, 0x0A):
        assert ops[op] >= 1, (hex(op), ops)
    assert any(r[0] == "17" and r[1] and int(r[1], 0) == 0x62 for r in rows), rows  # the NAK
