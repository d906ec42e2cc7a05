"""A runtime over two shm RNICs: link groups of two links, failover when an RNIC fails, a link
added again when it is back (issue 13).

Two :class:`Stack` runtimes in this process, each with two shm RNICs, act as two hosts
(:mod:`tests.stack.hosts`).  An RNIC failure is injected with :meth:`Stack.port_down`
(what the RoCE runtime's net device watcher calls), on either side, while bytes flow both
ways; every byte is checked by SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from smcr import ueid
from smcr.core import Config, LgrType
from smcr.core.linkgroup import LinkGroup, LinkState
from smcr.rdma.shm import ShmDevice
from smcr.stack.hostconn import HostConn
from smcr.stack.runtime import Stack
from smcr.stack.wrslots import SLOT
from tests.stack import hosts as h

SIZE = 1 << 16
CHUNK = 4096


@contextmanager
def two_rnic_hosts(n: int = 2, rnics: int = 2) -> Iterator[list[Stack]]:
    """``n`` runtimes, each over ``rnics`` shm RNICs; closed at the end."""
    made = []
    try:
        for i in range(n):
            devs = [ShmDevice(f"t{os.getpid()}m{i}r{r}") for r in range(rnics)]
            made.append(Stack(Config(sndbuf_size=SIZE, rmb_size=SIZE), 64, devs[0], devs[1:]))
        yield made
    finally:
        for stack in made:
            stack.close()


def group(stack: Stack) -> LinkGroup:
    (lgr,) = [g for g in stack.engine.lgrs.values() if not g.terminated]
    return lgr


def active_ports(stack: Stack) -> list[int]:
    with stack.lock:
        return sorted(x.port for x in group(stack).links if x.state is LinkState.LINK_ACTIVE)


def link_ids(stack: Stack) -> list[int]:
    with stack.lock:
        return [x.link_id for x in group(stack).links]


def symmetric(stack: Stack) -> bool:
    """The group is SYMMETRIC over ports 0 and 1.  Both together: an asymmetric group can
    have links over both ports of one side too (the server's over its ports 0 and 1 to
    the client's port 1) while its replacement is still under way."""
    with stack.lock:
        lgr = group(stack)
        ports = sorted(x.port for x in lgr.links if x.state is LinkState.LINK_ACTIVE)
        return ports == [0, 1] and lgr.lgr_type is LgrType.SYMMETRIC


def until(what: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


def slots_all_back(stack: Stack) -> None:
    """Every receive slot is free or posted on a live QP: a cleared link's came back."""
    with stack.lock:
        posted = sum(len(ids) for ids in stack.wr.qp_recv_ids.values())
        assert set(stack.wr.qp_recv_ids) <= set(stack.qps)
        assert stack.wr.free_slots + posted == len(stack.wr.recv_mr.buf) // SLOT


def pump(stack: Stack, hc: HostConn, data: bytes) -> None:
    """Send ``data`` in pieces as the peer's window allows (the socket's inline path)."""
    c = h.conn(stack, hc)
    view = memoryview(data)
    while view:
        h.wait(stack, hc, lambda: c.direct_room() > 0 or bool(c.reset_reason))
        with stack.lock:
            assert not c.reset_reason, c.reset_reason
            n = min(len(view), c.direct_room(), CHUNK)
            stack.send_inline(c, view[:n])
        view = view[n:]


def drain(stack: Stack, hc: HostConn, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        out += h.read(stack, hc, min(CHUNK, n - len(out)))
    return bytes(out)


def exchange(server: Stack, client: Stack, ends: tuple[HostConn, HostConn], n: int,
             during: Callable[[], None] | None = None) -> None:  # fmt: skip
    """``n`` random bytes each way at once; ``during`` runs once a quarter has arrived."""
    sdata, cdata = os.urandom(n), os.urandom(n)
    got: dict[str, bytes] = {}
    errors: list[BaseException] = []

    def run(name: str, fn: Callable[[], object]) -> threading.Thread:
        def body() -> None:
            try:
                result = fn()
                if isinstance(result, bytes):
                    got[name] = result
            except BaseException as exc:  # reported by the test below
                errors.append(exc)

        t = threading.Thread(target=body, daemon=True)
        t.start()
        return t

    srv, cli = ends
    threads = [run("s->c", lambda: pump(server, srv, sdata)),
               run("c->s", lambda: pump(client, cli, cdata)),
               run("at c", lambda: drain(client, cli, n)),
               run("at s", lambda: drain(server, srv, n))]  # fmt: skip
    if during is not None:
        until(lambda: h.conn(client, cli).rx_prod >= n // 4 or bool(errors))
        during()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "transfer stalled"
    assert not errors, errors
    assert hashlib.sha256(got["at c"]).digest() == hashlib.sha256(sdata).digest()
    assert hashlib.sha256(got["at s"]).digest() == hashlib.sha256(cdata).digest()


def test_two_rnics_make_a_symmetric_group_whose_links_carry_the_bytes() -> None:
    with two_rnic_hosts() as (server, client):
        ends = h.connect(server, client)
        for stack in (server, client):
            until(lambda stack=stack: active_ports(stack) == [0, 1])  # type: ignore[misc]
            assert group(stack).lgr_type is LgrType.SYMMETRIC
        exchange(server, client, ends, 1 << 20)
        # the second link is a real path: the connection moved there carries bytes too
        with server.lock:
            server.port_down(0, "test")
        # the client's link 1 is gone too (its QP flushed); the server may have added an
        # asymmetric link meanwhile (its port 1 again, to the client's port 0), as Linux;
        # the server's connection moves once the client has answered its DELETE LINK
        def moved() -> bool:
            link = h.conn(server, ends[0]).link
            return link is not None and link.port == 1

        until(lambda: 0 not in active_ports(server) and link_ids(client)[0] != 1 and moved())
        exchange(server, client, ends, 1 << 20)
        for stack in (server, client):
            slots_all_back(stack)


@pytest.mark.parametrize("side", ["server", "client"])
@pytest.mark.parametrize("port", [0, 1])
def test_an_rnic_failing_mid_transfer_loses_no_byte_and_the_link_comes_back(side: str,
                                                                           port: int) -> None:
    with two_rnic_hosts() as (server, client):
        ends = h.connect(server, client)
        until(lambda: active_ports(server) == [0, 1] and active_ports(client) == [0, 1])
        conns = [h.connect(server, client) for _ in range(5)]
        victim = server if side == "server" else client

        def cut() -> None:
            with victim.lock:
                victim.port_down(port, "injected")

        exchange(server, client, ends, 4 << 20, during=cut)
        # the victim has no link over its failed port any more; the other side did not see
        # the failure, so (as Linux) the server may add an asymmetric link meanwhile
        until(lambda: port not in active_ports(victim))
        for srv, cli in conns:  # every connection of the group moved, none was reset
            assert not h.conn(server, srv).reset_reason and not h.conn(client, cli).reset_reason
            exchange(server, client, (srv, cli), 64 << 10)
        with victim.lock:  # server: offers the link; client: invites its server to
            victim.port_up(port)
        for stack in (server, client):
            until(lambda stack=stack: symmetric(stack))  # type: ignore[misc]
        exchange(server, client, ends, 1 << 20)
        for stack in (server, client):
            slots_all_back(stack)


@pytest.mark.parametrize("side", ["server", "client"])
def test_an_smc_rv2_group_adds_its_link_fails_over_and_adds_it_again(
        side: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """With a UEID both runtimes speak SMC-Rv2: the second link comes by ADD LINK v2 (a v2
    group takes no other), an RNIC failing mid-transfer loses no byte, and when it is back
    the link is added again: the server offers it (ADD LINK v2), or the client asks for it
    (REQUEST ADD LINK v2)."""
    path = tmp_path / "ueid"
    ueid.add("SMCR-V2-MULTI", path)
    monkeypatch.setenv(ueid.ENV, str(path))
    with two_rnic_hosts() as (server, client):
        ends = h.connect(server, client)
        for stack in (server, client):
            until(lambda stack=stack: symmetric(stack))  # type: ignore[misc]
            with stack.lock:
                lgr = group(stack)
                assert lgr.version == 2 and lgr.max_links == 2
        victim = server if side == "server" else client

        def cut() -> None:
            with victim.lock:
                victim.port_down(1, "injected")

        exchange(server, client, ends, 4 << 20, during=cut)
        until(lambda: 1 not in active_ports(victim))
        assert not h.conn(server, ends[0]).reset_reason
        with victim.lock:
            victim.port_up(1)
        for stack in (server, client):
            until(lambda stack=stack: symmetric(stack))  # type: ignore[misc]
            with stack.lock:
                assert group(stack).version == 2
        exchange(server, client, ends, 1 << 20)
        for stack in (server, client):
            slots_all_back(stack)
