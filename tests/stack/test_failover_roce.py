"""Redundant links over RoCE between two hosts (issue 13): two network namespaces joined
by two veth pairs, a RoCE RNIC on each veth; one veth set down mid-transfer, then up.

Each host's runtime uses both RNICs (``SMCR_ROCE_DEVS``): the link group gets a second
link over the second veth pair right after the first connection (ADD LINK).  The
server echoes; the client streams random bytes on each connection and hashes what it
sent and what came back.  Mid-transfer a veth is set down: both hosts' port watchers
see their RNIC's net device stop running, the connections move to the other link,
and the transfer goes on; when the veth is up again the server adds a link again.
Asserted: every connection's bytes intact both ways (SHA-256), no error seen by the
application, the groups down to one link and then back to two.

Sizes: ``SMCR_FAILOVER_MIB`` (default 64) MiB each way on one connection; the many
connections case moves 256 KiB each way on each of 200.  By hand:
``SMCR_FAILOVER_MIB=1024`` for the 1 GiB run.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from smcr import pnet, ueid
from smcr.tools import tshark
from tests.support import stop_capture, wait_for_mark

REPO = Path(__file__).resolve().parents[2]
MIB = int(os.environ.get("SMCR_FAILOVER_MIB", "64"))

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                 reason="needs root and iproute2 (network namespaces)")]


def sh(*args: str) -> None:
    res = subprocess.run(args, check=False, capture_output=True, text=True, timeout=30)
    if res.returncode:
        raise RuntimeError(f"{' '.join(args)}: {res.stderr.strip()}")


class TwoPaths:
    """Namespaces ``smcr13a-<pid>-a``/``-b`` joined by veth pairs ``p0`` and ``p1``
    (10.131.<n>.0/24 and 10.132.<n>.0/24; .1 in a, .2 in b)."""

    def __init__(self) -> None:
        tag = f"smcr13a-{os.getpid() % 100000}"
        self.ns = (f"{tag}-a", f"{tag}-b")
        n = os.getpid() % 250
        self.nets = (f"10.131.{n}", f"10.132.{n}")
        try:
            for ns in self.ns:
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            for i, net in enumerate(self.nets):
                sh("ip", "link", "add", f"s13a{n}p{i}a", "netns", self.ns[0], "type", "veth",
                   "peer", "name", f"s13a{n}p{i}b", "netns", self.ns[1])  # fmt: skip
                for side, ns in enumerate(self.ns):
                    dev = f"s13a{n}p{i}{'ab'[side]}"
                    sh("ip", "-n", ns, "link", "set", dev, "name", f"p{i}")
                    sh("ip", "-n", ns, "addr", "add", f"{net}.{side + 1}/24", "dev", f"p{i}")
                    sh("ip", "-n", ns, "link", "set", f"p{i}", "up")
        except BaseException:
            self.close()
            raise

    def link(self, side: int, path: int, up: bool) -> None:
        sh("ip", "-n", self.ns[side], "link", "set", f"p{path}", "up" if up else "down")

    def close(self) -> None:
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True,
                           timeout=30)  # fmt: skip


class PeerProc:
    """``tests.stack.failover_peer`` in a namespace; its latest report kept by a thread."""

    def __init__(self, ns: str, *args: str, env: dict[str, str] | None = None) -> None:
        env = os.environ | {"SMCR_RNIC": "roce", "SMCR_ROCE_DEVS": "p0,p1",
                            "PYTHONPATH": str(REPO)} | (env or {})  # fmt: skip
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.stack.failover_peer",
             *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
            env=env)  # fmt: skip
        self.role = args[0]
        self.last: dict[str, Any] = {}
        self.history: list[tuple[float, int]] = []
        self.changes: list[tuple[float, Any]] = []
        """(when, the links as the peer reported them) at each change (a failure's story)."""
        self.done: list[list[str]] | None = None
        self.ready: int | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "ready" in msg:
                self.ready = msg["ready"]
            elif "done" in msg:
                self.done = msg["done"]
            else:
                if msg.get("detail") != self.last.get("detail"):
                    self.changes.append((time.monotonic(), msg.get("detail")))
                self.last = msg
                self.history.append((time.monotonic(), msg["moved"]))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._thread.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def until(what: Callable[[], bool], timeout: float, why: str,
          peers: tuple[PeerProc, ...] = ()) -> None:  # fmt: skip
    began = time.monotonic()
    deadline = began + timeout
    while not what():
        for p in peers:
            assert p.proc.poll() is None, f"{why}: a peer exited ({p.proc.returncode})"
        assert time.monotonic() < deadline, f"not within {timeout} s: {why}{_story(peers, began)}"
        select.select([], [], [], 0.02)


def _story(peers: tuple[PeerProc, ...], began: float) -> str:
    """The peers' last link changes as they reported them, in seconds from ``began`` (what a
    failed wait's message tells: which side saw which link come and go, and when)."""
    lines = []
    for i, p in enumerate(peers):
        changes = ", ".join(f"{when - began:+.2f} s {detail}" for when, detail in p.changes[-12:])
        lines.append(f"\n  peer {i} ({p.role}): {changes or 'no change reported'}")
    return "".join(lines)


@pytest.fixture
def paths() -> Iterator[TwoPaths]:
    t = TwoPaths()
    try:
        yield t
    finally:
        t.close()


def linkgroups(ns: str, pid: int) -> list[dict[str, Any]]:
    """``smcr linkgroup show --json``'s groups of process ``pid`` (run in its namespace)."""
    res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "smcr",
                          "linkgroup", "show", "--json"], capture_output=True, text=True,
                         timeout=60, cwd=REPO, check=True)  # fmt: skip
    groups = json.loads(res.stdout)["linkgroups"]
    for g in groups:
        g["links"].sort(key=lambda x: x["netdev"])
    return [g for g in groups if g["pid"] == pid]


def finished(p: PeerProc) -> bool:
    return p.done is not None


def _mark(paths: TwoPaths, payload: bytes) -> None:
    """A UDP datagram (port 9, discard) over path 0, for :func:`wait_for_mark`."""
    subprocess.run(["ip", "netns", "exec", paths.ns[0], sys.executable, "-c",
                    "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                    f".sendto({payload!r}, ('{paths.nets[0]}.2', 9))"], check=True,
                   timeout=30)  # fmt: skip


def run_failover(paths: TwoPaths, conns: int, size: int, cut_side: int, cut_path: int,
                 capture: Path | None = None, env: dict[str, str] | None = None) -> None:
    """The transfer, the cut and the recovery (module docstring); ``capture``: dumpcap on
    the server's path-0 veth into that file meanwhile; ``env``: the peers' environment
    besides."""
    cap = None
    if capture is not None:
        for ns in paths.ns:  # GSO runs segmented before the capture point: a frame a packet
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "tests.roce.ethtool",
                            "p0", "tx-udp-segmentation", "off"], check=True, timeout=30,
                           cwd=REPO)  # fmt: skip
        cap = subprocess.Popen(["ip", "netns", "exec", paths.ns[0], "dumpcap", "-q", "-i", "p0",
                                "-s", "160", "-w", str(capture)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
        wait_for_mark(capture, lambda payload: _mark(paths, payload))
    try:
        _run_failover(paths, conns, size, cut_side, cut_path, env or {})
    finally:
        if cap is not None and capture is not None:
            with contextlib.suppress(AssertionError):
                wait_for_mark(capture, lambda payload: _mark(paths, payload))
            stop_capture(cap)


def _run_failover(paths: TwoPaths, conns: int, size: int, cut_side: int, cut_path: int,
                  env: dict[str, str]) -> None:  # fmt: skip
    server = PeerProc(paths.ns[0], "server", f"{paths.nets[0]}.1", "0", str(conns), str(size),
                      env=env)  # fmt: skip
    client = None
    try:
        until(lambda: server.ready is not None, 30, "server listening", (server,))
        client = PeerProc(paths.ns[1], "client", f"{paths.nets[0]}.1", str(server.ready),
                          str(conns), str(size), env=env)  # fmt: skip
        both = (server, client)

        def links(p: PeerProc) -> list[int]:
            return list(p.last.get("links", []))

        until(lambda: links(server) == [2] and links(client) == [2], 60,
              "the group has two links", both)  # fmt: skip
        total = conns * size
        until(lambda: server.last.get("moved", 0) >= total // 4, 300, "a quarter moved", both)
        assert not finished(server), "the transfer ended before the cut: make it larger"
        paths.link(cut_side, cut_path, up=False)
        until(lambda: links(server) == [1] and links(client) == [1], 60,
              "failover to the other link", both)  # fmt: skip
        paths.link(cut_side, cut_path, up=True)
        until(lambda: links(server) == [2] and links(client) == [2], 60,
              "a link added again", both)  # fmt: skip
        until(lambda: server.done is not None and client.done is not None, 600,
              "transfer done", both)  # fmt: skip
        assert client.done is not None and server.done is not None
        errors = [r[2] for r in client.done + server.done if r[2]]
        assert not errors, errors
        for sent, got, _ in client.done:  # the echo came back intact
            assert sent == got
        assert sorted(r[0] for r in client.done) == sorted(r[1] for r in server.done)
        assert links(server) == [2] and links(client) == [2]
        # SMC-Rv2 when the peers have a UEID (both the same file)
        want = [2] if ueid.load(ueid.path_from(os.environ | env)) else [1]
        assert server.last["versions"] == client.last["versions"] == want
        for side, peer in enumerate((server, client)):  # as the tool shows it
            groups = linkgroups(paths.ns[side], peer.proc.pid)
            assert [(g["type"], [x["netdev"] for x in g["links"]]) for g in groups] == [
                ("SYMMETRIC", ["p0", "p1"])], groups
    finally:
        for p in (client, server):
            if p is not None:
                p.close()


@pytest.mark.parametrize(("cut_side", "cut_path"), [(0, 0), (1, 1)],
                         ids=["server-first-path", "client-second-path"])  # fmt: skip
def test_a_veth_down_mid_transfer_loses_no_byte_and_the_link_comes_back(
        paths: TwoPaths, cut_side: int, cut_path: int) -> None:  # fmt: skip
    run_failover(paths, 1, MIB << 20, cut_side, cut_path)


def test_an_smc_rv2_group_fails_over_and_asks_for_its_link_again(paths: TwoPaths,
                                                                 tmp_path: Path) -> None:
    """With a UEID on both: the group is SMC-Rv2 (ADD LINK v2 at first contact); the
    client's second veth cut mid-transfer and back, the client asks for the link again
    (REQUEST ADD LINK v2) and gets it, no byte lost."""
    ueids = tmp_path / "ueid"
    ueid.add("SMCR-ROCE-V2", ueids)
    os.chmod(tmp_path, 0o755)
    run_failover(paths, 1, MIB << 20, 1, 1, env={ueid.ENV: str(ueids)})


def test_two_hundred_connections_fail_over_together(paths: TwoPaths) -> None:
    run_failover(paths, 200, 256 << 10, 0, 0)


def _tshark(pcap: Path, display_filter: str, *fields: str) -> list[list[str]]:
    """The ``fields`` of each frame the filter keeps (PDML of the whole bulk capture is
    too large to parse)."""
    args = [tshark.tshark_path(), "-n", "-r", str(pcap), "-Y", display_filter, "-T", "fields"]
    for f in fields:
        args += ["-e", f]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True).stdout
    return [line.split("\t") for line in out.splitlines() if line.strip()]


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("dumpcap") is None, reason="needs dumpcap/tshark")
def test_a_failover_capture_decodes_add_delete_and_confirm_link(paths: TwoPaths,
                                                                tmp_path: Path) -> None:
    """What Wireshark sees on the path that stays (the server's path-0 veth, which carries
    link 1 and the connection) while the client's path-1 veth is cut and comes back:
    CONFIRM LINK of link 1; ADD LINK and ADD LINK CONTINUATION of link 2; DELETE LINK of
    it; ADD LINK and ADD LINK CONTINUATION of the link added again (each link's own
    CONFIRM LINK goes over its own path); every frame decoded, none malformed."""
    os.chmod(tmp_path, 0o755)  # dumpcap may drop to another user
    pcap = tmp_path / "failover.pcapng"
    run_failover(paths, 1, 64 << 20, 1, 1, capture=pcap)
    # (but an RDMA WRITE whose bytes Wireshark took for an Ethernet frame: a short piece
    # of application data is malformed as such, test_kernel_smcr.guessed_payload)
    bad = _tshark(pcap, "(_ws.malformed || _ws.expert.severity >= 8388608) && !("
                  "infiniband.bth.opcode in {6..11} && frame.protocols contains"
                  ' "infiniband:ethertype")', "frame.number")  # fmt: skip
    assert not bad, f"malformed or erroneous frames: {bad[:10]}"
    names = {0x01: "CONFIRM LINK", 0x02: "ADD LINK", 0x03: "ADD LINK CONT",
             0x04: "DELETE LINK"}  # fmt: skip
    seen = [names[int(v[0], 0)] for v in _tshark(pcap, "smc.llc_msg", "smc.llc_msg")
            if int(v[0], 0) in names]
    story = " / ".join(seen)
    # link 1 confirmed, link 2 added (request and response each) before the cut
    assert seen[:6] == ["CONFIRM LINK"] * 2 + ["ADD LINK"] * 2 + ["ADD LINK CONT"] * 2, story
    # the cut: DELETE LINK (who sends how many depends on which end saw it first: the
    # client's request, the server's echo and the answer, or the server's and the answer)
    cut = seen.index("DELETE LINK")
    assert set(seen[6:cut]) == set(), story
    # the way back: an ADD LINK exchange with its rkeys (CONT) after the cut
    back = seen[cut:]
    assert "ADD LINK" in back and "ADD LINK CONT" in back[back.index("ADD LINK"):], story


@pytest.mark.parametrize("version", [1, 2], ids=["v1", "v2-ueid"])
def test_the_second_link_goes_over_the_rnic_that_reaches_the_peer(
        paths: TwoPaths, version: int, tmp_path: Path) -> None:  # fmt: skip
    """Route matching (Linux ``smc_ib_find_route``): the client's first other RNIC is on a
    net device of its own subnet (a veth into nowhere, no path to the server); the server's ADD LINK
    comes from its p1 address, which the kernel routes out of the client's p1: the client
    takes p1, not the first RNIC listed.  (Without the route check it took d0, its
    link could not come up and the group stayed at one link.)  With a UEID on both the
    group is SMC-Rv2 and its second link comes by ADD LINK v2.  Every net device is on
    PNET ID NETA (``smcr pnet``; d0 too, so that only the route rules it out): the tool
    shows the group's PNET ID."""
    ueids = tmp_path / "ueid"  # v1: none, whatever the host has
    if version == 2:
        ueid.add("SMCR-ROCE-V2", ueids)
    pnets = tmp_path / "pnet"
    for dev in ("p0", "p1", "d0"):
        pnet.add("neta", netdev=dev, path=pnets)
    os.chmod(tmp_path, 0o755)
    env = {ueid.ENV: str(ueids), pnet.ENV: str(pnets)}
    n = os.getpid() % 250
    sh("ip", "-n", paths.ns[1], "link", "add", "d0", "type", "veth", "peer", "name", "d0p")
    sh("ip", "-n", paths.ns[1], "addr", "add", f"10.133.{n}.2/24", "dev", "d0")
    for dev in ("d0p", "d0"):
        sh("ip", "-n", paths.ns[1], "link", "set", dev, "up")
    server = PeerProc(paths.ns[0], "server", f"{paths.nets[0]}.1", "0", "1", str(1 << 20),
                      env=env)  # fmt: skip
    client = None
    try:
        until(lambda: server.ready is not None, 30, "server listening", (server,))
        client = PeerProc(paths.ns[1], "client", f"{paths.nets[0]}.1", str(server.ready), "1",
                          str(1 << 20), env=env | {"SMCR_ROCE_DEVS": "d0,p1"})  # fmt: skip
        both = (server, client)
        until(lambda: server.last.get("links") == [2] and client.last.get("links") == [2], 60,
              "the group has two links", both)  # fmt: skip
        until(lambda: server.done is not None and client.done is not None, 120,
              "transfer done", both)  # fmt: skip
        assert client.done is not None
        assert not [r[2] for r in client.done if r[2]]
        for side, peer in enumerate(both):
            groups = linkgroups(paths.ns[side], peer.proc.pid)
            assert [(g["type"], g["pnet_id"], [x["netdev"] for x in g["links"]])
                    for g in groups] == [("SYMMETRIC", "NETA", ["p0", "p1"])], groups
        assert server.last["versions"] == client.last["versions"] == [version]
    finally:
        for p in (client, server):
            if p is not None:
                p.close()
