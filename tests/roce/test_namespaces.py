"""The RoCEv2 RNIC between processes on two hosts (network namespaces joined by a veth pair).

The issue's proofs: RDMA WRITE/SEND/READ between processes; 10% random loss
with every byte intact; a link taken down ends in RETRY_EXC_ERR within the
bound; a bad rkey gives REM_ACCESS_ERR and leaves memory untouched; two
processes per host share UDP port 4791.  Each test builds and removes its own
namespaces; every wait is bounded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.roce.netns import Hosts, PeerProc, connect
from tests.roce.roce_peer import digest, pattern

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)"),
]
MB = 1 << 20


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    with Hosts(mtu=1500) as h:
        yield h


@pytest.fixture
def two(hosts: Hosts) -> Iterator[tuple[PeerProc, PeerProc]]:
    a, b = PeerProc(hosts, 0), PeerProc(hosts, 1)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def write(n: int, roff: int = 0, sig: bool = True, rkey: int | None = None,
          loff: int = 0) -> list[object]:  # fmt: skip
    """An RDMA WRITE of ``n`` bytes from the local buffer at ``loff`` to the peer's RMB."""
    return ["RDMA_WRITE", loff, n, roff, sig, 0, rkey]


@pytest.mark.parametrize("family", [4, 6])
def test_write_send_read_between_processes(hosts: Hosts, family: int) -> None:
    addrs = hosts.addr if family == 4 else hosts.addr6
    a, b = PeerProc(hosts, 0, addrs[0]), PeerProc(hosts, 1, addrs[1])
    try:
        _write_send_read(a, b)
    finally:
        a.close()
        b.close()


def _write_send_read(a: PeerProc, b: PeerProc) -> None:
    connect(a, b, timeout=12)
    want = a.ask("fill", seed=1, n=MB)
    assert b.ask("post_recv", count=2) == "ok"
    # a WRITE, then a SEND with immediate data: RC order puts the data first
    got = a.ask("post", remote=b.info, expect=2,
                wrs=[write(MB, roff=4096), ["SEND_WITH_IMM", 0, 3000, 0, True, 0xABCD, None]])
    assert [w[1] for w in got["wcs"]] == ["SUCCESS", "SUCCESS"]
    recv = b.ask("wait", n=1, timeout=5.0)
    assert recv == [[0, "SUCCESS", "RECV", 3000, 0xABCD]]
    assert b.ask("digest", off=4096, n=MB) == want
    assert b.ask("recv_data", wr_id=0, n=3000) == pattern(1, 3000).hex()
    # READ it back into another part of a's buffer
    got = a.ask("post", remote=b.info, expect=1,
                wrs=[["RDMA_READ", 2 * MB, 300_000, 4096, True, 0, None]])
    assert got["wcs"] == [[0, "SUCCESS", "RDMA_READ", 300_000, 0]]
    assert a.ask("buf_digest", off=2 * MB, n=300_000) == digest(pattern(1, MB)[:300_000])
    # and the other way round, a SEND from b
    assert a.ask("post_recv", count=1) == "ok"
    b.ask("fill", seed=2, n=100)
    assert b.ask("post", remote=a.info, expect=1,
                 wrs=[["SEND", 0, 100, 0, True, 0, None]])["wcs"][0][1] == "SUCCESS"
    assert a.ask("wait", n=1, timeout=5.0)[0][1:4] == ["SUCCESS", "RECV", 100]
    stats = b.ask("stats")
    assert stats["dev"]["icrc_errors"] == 0 and stats["dev"]["unknown_qp"] == 0


@pytest.mark.slow
def test_ten_percent_loss_every_byte_intact(hosts: Hosts, two: tuple[PeerProc, PeerProc]) -> None:
    a, b = two
    connect(a, b, timeout=10, retry_cnt=7)  # 4 ms timer, retries without limit
    hosts.drop_percent(0, 10)
    hosts.drop_percent(1, 10)
    want = a.ask("fill", seed=3, n=4 * MB)
    assert b.ask("post_recv", count=8) == "ok"
    wrs = [write(MB, roff=i * MB, loff=i * MB) for i in range(4)]
    wrs += [["SEND", i * 1000, 1000, 0, True, 0, None] for i in range(8)]
    got = a.ask("post", remote=b.info, expect=12, timeout=60.0, wrs=wrs)
    assert [w[1] for w in got["wcs"]] == ["SUCCESS"] * 12
    assert b.ask("digest", off=0, n=4 * MB) == want
    recv = b.ask("wait", n=8, timeout=10.0)
    assert [r[:4] for r in recv] == [[i, "SUCCESS", "RECV", 1000] for i in range(8)]
    for i in range(8):
        assert b.ask("recv_data", wr_id=i, n=1000) == pattern(3, 8000)[i * 1000:][:1000].hex()
    got = a.ask("post", remote=b.info, expect=1, timeout=60.0,
                wrs=[["RDMA_READ", 8 * MB, MB, MB, True, 0, None]])
    assert got["wcs"][0][1] == "SUCCESS"
    assert a.ask("buf_digest", off=8 * MB, n=MB) == digest(pattern(3, 4 * MB)[MB : 2 * MB])
    stats = a.ask("stats")
    assert stats["req"]["retransmits"] > 0  # the loss was real


def test_link_down_retry_exceeded_within_bound(
    hosts: Hosts, two: tuple[PeerProc, PeerProc]
) -> None:
    a, b = two
    # timeout 12 = 16.8 ms, retry_cnt 3: RETRY_EXC_ERR after 4 periods (about 67 ms)
    connect(a, b, timeout=12, retry_cnt=3)
    a.ask("fill", seed=4, n=8192)
    assert a.ask("post", remote=b.info, expect=1, wrs=[write(8192)])["wcs"][0][1] == "SUCCESS"
    hosts.link(1, up=False)
    got = a.ask("post", remote=b.info, expect=2, timeout=5.0,
                wrs=[write(8192), write(100, roff=9000)])
    assert [w[1] for w in got["wcs"]] == ["RETRY_EXC_ERR", "WR_FLUSH_ERR"]
    bound = 4 * 4.096e-6 * (1 << 12)
    assert bound * 0.9 < got["elapsed"] < bound + 0.25, got["elapsed"]
    assert a.ask("state") == "ERR"


def test_bad_rkey_and_bounds_remote_access_error(two: tuple[PeerProc, PeerProc]) -> None:
    a, b = two
    connect(a, b, timeout=12)
    assert b.ask("fill_rmb", byte=0xAA) == "ok"
    before = b.ask("digest", off=0, n=16 * MB)
    a.ask("fill", seed=5, n=8192)
    got = a.ask("post", remote=b.info, expect=2,
                wrs=[write(8192, rkey=b.info["rkey"] ^ 0x5A5A), write(10)])
    assert [w[1] for w in got["wcs"]] == ["REM_ACCESS_ERR", "WR_FLUSH_ERR"]
    assert a.ask("state") == "ERR"
    deadline = time.monotonic() + 5
    while b.ask("state") != "ERR" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.ask("state") == "ERR"  # a class-C error takes both QPs to ERR
    assert b.ask("digest", off=0, n=16 * MB) == before


def test_out_of_bounds_write_touches_nothing(hosts: Hosts) -> None:
    a, b = PeerProc(hosts, 0), PeerProc(hosts, 1)
    try:
        connect(a, b, timeout=12)
        b.ask("fill_rmb", byte=0x55)
        before = b.ask("digest", off=0, n=16 * MB)
        a.ask("fill", seed=6, n=8192)
        # starts inside the region, its last packet would run 4 KiB past the end
        got = a.ask("post", remote=b.info, expect=1, wrs=[write(8192, roff=16 * MB - 4096)])
        assert got["wcs"][0][1] == "REM_ACCESS_ERR"
        assert b.ask("digest", off=0, n=16 * MB) == before
    finally:
        a.close()
        b.close()


def test_two_processes_per_host_share_port_4791(hosts: Hosts) -> None:
    peers = [PeerProc(hosts, 0), PeerProc(hosts, 0), PeerProc(hosts, 1), PeerProc(hosts, 1)]
    try:
        a1, a2, b1, b2 = peers
        connect(a1, b1, timeout=12)
        connect(a2, b2, timeout=12)
        wants = [a1.ask("fill", seed=7, n=2 * MB), a2.ask("fill", seed=8, n=2 * MB)]
        # both transfers in flight at once: post on both, then collect
        for p, q in ((a1, b1), (a2, b2)):
            assert p.ask("post", remote=q.info, expect=0, wrs=[write(2 * MB)])["wcs"] == []
        for p in (a1, a2):
            assert [w[1] for w in p.ask("wait", n=1, timeout=20.0)] == ["SUCCESS"]
        assert b1.ask("digest", off=0, n=2 * MB) == wants[0]
        assert b2.ask("digest", off=0, n=2 * MB) == wants[1]
        for p in peers:
            dev = p.ask("stats")["dev"]
            # each process got only its own flow: nothing for a QP it does not have
            assert dev["unknown_qp"] == 0 and dev["icrc_errors"] == 0, dev
            # ...and on its QP's connected socket, not the shared catch-all
            assert dev["rx_catchall"] == 0 and dev["rx"] > 0, dev
    finally:
        for p in peers:
            p.close()
