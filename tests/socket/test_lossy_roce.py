"""SMC-R over a lossy RoCE path: two namespaces, random loss of RoCEv2 packets both ways.

nftables in each namespace drops a share of the UDP 4791 packets arriving there
(RoCE only: the TCP connection, and so the CLC handshake, is untouched), with a
counter, so the test knows loss happened.  Over that path an SMCSocket streams
both directions at once (the client's random bytes, the server's pattern) and
each side checks the SHA-256 of what came: the RC transport's go-back-N and
retransmission timer must recover every lost WRITE, CDC and ACK, in order,
whatever SMC-R's LLC and CDC messages meet on the way.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

import smcr
from tests.roce.netns import Hosts
from tests.socket import smc_peer
from tests.socket.conftest import Peer, rnics

PeerFactory = Callable[..., Peer]
TABLE = "smcrlossy"

pytestmark = pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables")


def drop_roce(hosts: Hosts, percent: int) -> None:
    """Drop ``percent``% of the RoCE packets arriving in each namespace, counting them."""
    rules = (
        f"table inet {TABLE} {{\n chain input {{\n"
        "  type filter hook input priority 0; policy accept;\n"
        f"  udp dport 4791 numgen random mod 100 < {percent} counter drop\n"
        " }\n}\n"
    )
    for ns in hosts.ns:
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True,
                       check=True, timeout=30)  # fmt: skip


def dropped(hosts: Hosts, i: int) -> int:
    """Packets the rule of namespace ``i`` dropped so far."""
    out = hosts.exec(i, "nft", "list", "table", "inet", TABLE).stdout
    match = re.search(r"counter packets (\d+)", out)
    assert match, out
    return int(match.group(1))


@pytest.fixture
def lossy(roce_hosts: Hosts, request: pytest.FixtureRequest) -> Iterator[Hosts]:
    """``roce_hosts`` with the loss of the test's ``percent`` parameter; removed after.

    UDP segmentation offload is off on both veths, so the kernel cuts our UDP GSO sends
    into packets before the input hook, and the loss falls on single packets (with it
    on, one drop takes a whole GSO run of up to 64 packets).
    """
    for i in (0, 1):
        roce_hosts.exec(i, sys.executable, "-m", "tests.roce.ethtool", roce_hosts.ifs[i],
                        "tx-udp-segmentation", "off")  # fmt: skip
    drop_roce(roce_hosts, request.node.callspec.params["percent"])
    try:
        yield roce_hosts
    finally:
        for i in (0, 1):
            roce_hosts.exec(i, "nft", "delete", "table", "inet", TABLE, check=False)


@rnics(kinds=("roce",))
@pytest.mark.parametrize(("percent", "total"), [(1, 4 << 20), (10, 1 << 20)],
                         ids=["1pct-4MiB", "10pct-1MiB"])  # fmt: skip
def test_smcr_stream_both_ways_over_lossy_roce_bytes_intact(
        peer: PeerFactory, lossy: Hosts, percent: int, total: int) -> None:  # fmt: skip
    p = peer(smc_peer.sink_server)
    s = smcr.create_connection((smc_peer.host(), p.recv()), timeout=120)
    seed = os.urandom(8)
    p.ctl.send((total, seed))
    assert s.smc_info().mode == "SMCR"
    sent_hash, recv_hash = hashlib.sha256(), hashlib.sha256()
    expect = hashlib.sha256()
    block = hashlib.sha256(seed).digest() * 2048  # the server's pattern (smc_peer)
    for off in range(0, total, len(block)):
        expect.update(block[: min(len(block), total - off)])
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            left = total
            while left:
                chunk = os.urandom(min(left, 65536))
                s.sendall(chunk)
                sent_hash.update(chunk)
                left -= len(chunk)
            s.shutdown(socket.SHUT_WR)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    buf = bytearray(1 << 16)
    got = 0
    while n := s.recv_into(buf):
        recv_hash.update(buf[:n])
        got += n
    t.join(120)
    assert not t.is_alive() and not errors, errors
    theirs_in, theirs_out = p.recv(120)
    assert got == total
    assert recv_hash.hexdigest() == theirs_out == expect.hexdigest()
    assert theirs_in == sent_hash.hexdigest()
    assert s.smc_info().mode == "SMCR"  # no fallback on the way
    assert dropped(lossy, 0) > 0 and dropped(lossy, 1) > 0  # loss happened, both ways
    s.close()
