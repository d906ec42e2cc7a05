"""Two engines wired in memory: a fake fabric, TCP pipe and clock (STYLE §8).

``smc_pair()`` gives a client and a server :class:`Side`; ``pump()`` moves CLC
bytes, SENDs and completions until nothing moves (bounded, fails after 200
rounds).  RDMA WRITEs copy into the peer's RMB bytearray found by rkey, so
the data tests check real bytes end to end; as a real RNIC (and the shm one),
the fabric takes a WRITE only with an rkey registered on the port of the QP it
arrives at (each port is its own RNIC: an RMB has an rkey per port), else it
fails the test with the REM_ACCESS_ERR the sender's RNIC would report.  Hooks: ``drop_llc``,
``mangle`` (rewrite a SEND), ``clc_filter`` (rewrite CLC bytes).
"""

from __future__ import annotations

import ipaddress
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from smcr.core import (
    Action,
    Config,
    DestroyQp,
    Engine,
    Event,
    LocalIdentity,
    NextHop,
    Port,
    PostSend,
    QpToRtr,
    QpToRts,
    RdmaWrite,
    ReleaseConnection,
    ReuseRmb,
    Rmb,
    SendClc,
    ShutdownTcp,
)
from smcr.core.linkgroup import LinkGroup

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")
_qpns = itertools.count(0x100)
_keys = itertools.count(0x1000)


class Fabric:
    """Memory of every RMB by rkey, shared by both sides, and where each rkey and QP is."""

    def __init__(self) -> None:
        self.memory: dict[int, tuple[int, bytearray]] = {}  # rkey -> (vaddr, bytes)
        self.rkey_port: dict[int, int] = {}  # rkey -> the port (RNIC) it is valid on
        self.qp_port: dict[int, int] = {}  # qpn (unique over both sides) -> its port

    def alloc(self, size: int) -> Rmb:
        """An RMB registered on port 0 (the RMB's own rkey)."""
        rkey = next(_keys)
        vaddr = rkey << 20
        self.memory[rkey] = (vaddr, bytearray(size))
        self.rkey_port[rkey] = 0
        return Rmb(rkey, vaddr, size)

    def target(self, writer: Side, qpn: int, rkey: int) -> tuple[int, bytearray]:
        """The RMB a WRITE posted on ``writer``'s QP ``qpn`` with ``rkey`` lands in: the
        rkey must be registered on the port of the peer QP (as an RNIC checks the rkey
        against its own MRs), else REM_ACCESS_ERR."""
        peer_qpn = writer.qp_peer.get(qpn)
        if peer_qpn is not None and self.rkey_port.get(rkey) != self.qp_port.get(peer_qpn):
            raise AssertionError(
                f"REM_ACCESS_ERR: {writer.name}'s WRITE on QP {qpn:#x} with rkey {rkey:#x} "
                f"(port {self.rkey_port.get(rkey)}) reached port "
                f"{self.qp_port.get(peer_qpn)}")  # fmt: skip
        return self.memory[rkey]


@dataclass
class Side:
    """One engine with its host state."""

    name: str
    engine: Engine
    fabric: Fabric
    sndbufs: dict[int, bytearray] = field(default_factory=dict)
    rmbs: dict[int, Rmb] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    qp_peer: dict[int, int] = field(default_factory=dict)  # our qpn -> peer qpn
    rts: set[int] = field(default_factory=set)
    destroyed: set[int] = field(default_factory=set)
    tcp_shut: dict[int, int] = field(default_factory=dict)
    tcp_shutdowns: dict[int, list[int]] = field(default_factory=dict)
    released: set[int] = field(default_factory=set)
    reused: list[int] = field(default_factory=list)  # ReuseRmb, in order
    clc_out: dict[int, bytearray] = field(default_factory=dict)
    llc_sent: list[bytes] = field(default_factory=list)
    cdc_sent: list[tuple[int, bytes]] = field(default_factory=list)  # (qpn, CDC) posted

    qp_port: dict[int, int] = field(default_factory=dict)  # our qpn -> its port
    registered: list[tuple[int, int, int]] = field(default_factory=list)  # (conn, port, rkey)
    reach: Callable[[int, bytes], bool] | None = None  # Provider.reaches; None: every port
    route: Callable[[int, bytes], NextHop | None] | None = None
    """Provider.find_route; None: every peer on-link."""
    rtr: list[QpToRtr] = field(default_factory=list)  # the QpToRtr actions, in order

    def reaches(self, port: int, gid: bytes) -> bool:
        """Whether our ``port`` reaches the peer's ``gid`` (the host's routing)."""
        return True if self.reach is None else self.reach(port, gid)

    def find_route(self, port: int, gid: bytes) -> NextHop | None:
        """How our ``port`` reaches the peer's ``gid`` (the host's routing)."""
        return NextHop() if self.route is None else self.route(port, gid)

    def new_qp(self, port: int = 0) -> tuple[int, int]:
        assert port < len(self.engine.identity.ports), f"no port {port}"
        qpn = next(_qpns)
        self.qp_port[qpn] = self.fabric.qp_port[qpn] = port
        return qpn, 0x123456

    def register_rmb(self, conn: int, port: int) -> tuple[int, int]:
        """The connection's RMB under a new rkey (another RNIC's MR of the same memory)."""
        assert 0 < port < len(self.engine.identity.ports), f"no port {port}"
        rmb = self.rmbs[conn]
        rkey = next(_keys)
        vaddr = rkey << 20
        self.fabric.memory[rkey] = (vaddr, self.fabric.memory[rmb.rkey][1])
        self.fabric.rkey_port[rkey] = port
        self.registered.append((conn, port, rkey))
        return rkey, vaddr

    def pull_events(self) -> list[Event]:
        while (ev := self.engine.next_event()) is not None:
            self.events.append(ev)
        return self.events

    # -- application helpers -------------------------------------------------

    def write(self, conn: int, data: bytes, now: float = 0.0) -> tuple[int, list[Action]]:
        c = self.engine.conns[conn]
        n = min(len(data), c.sndbuf_space())
        buf = self.sndbufs[conn]
        start = c.tx_app % len(buf)
        first = min(n, len(buf) - start)
        buf[start : start + first] = data[:first]
        buf[: n - first] = data[first:n]
        return n, self.engine.data_written(conn, n, now)

    def write_inline(self, conn: int, data: bytes, request: bool = False
                     ) -> tuple[int, list[Action]]:  # fmt: skip
        """As the runtime's inline data path: at most ``direct_room()`` bytes placed
        straight into the peer's RMB (no send buffer), then their CDC as an action
        (``request``: it asks the peer to answer, autocorking)."""
        c = self.engine.conns[conn]
        n = min(len(data), c.direct_room())
        if n == 0:
            return 0, []
        writes, cdc, wr_id, signaled = c.write_inline(memoryview(data)[:n], request)
        for addr, rkey, piece in writes:
            vaddr, mem = self.fabric.target(self, c.qpn, rkey)
            off = addr - vaddr
            assert off >= 0 and off + len(piece) <= len(mem), "WRITE outside the RMB"
            mem[off : off + len(piece)] = piece
        return n, [PostSend(c.qpn, cdc, wr_id, signaled)]

    def cork_write(self, conn: int, data: bytes) -> None:
        """As the socket layer's corked send: the bytes into the send buffer, no CDC."""
        c = self.engine.conns[conn]
        buf = self.sndbufs[conn]
        start = c.tx_app % len(buf)
        first = min(len(data), len(buf) - start)
        buf[start : start + first] = data[:first]
        buf[: len(data) - first] = data[first:]
        c.corked(len(data))

    def read(self, conn: int, limit: int = 1 << 30, now: float = 0.0) -> tuple[bytes, list[Action]]:
        c = self.engine.conns[conn]
        n = min(c.rx_available(), limit)
        mem = self.fabric.memory[c.rmb.rkey][1]
        start = c.rx_cons % c.rmb.size
        first = min(n, c.rmb.size - start)
        data = bytes(mem[start : start + first]) + bytes(mem[: n - first])
        return data, self.engine.data_consumed(conn, n, now)


class Pair:
    """Client and server engines, a TCP pipe per connection pair, SEND queues."""

    def __init__(self, config: Config | None = None, server_config: Config | None = None,
                 client_ports: int = 1, server_ports: int = 1) -> None:  # fmt: skip
        self.fabric = Fabric()
        self.now = 0.0
        cfg = config or Config()
        self.client = self._side("client", cfg, b"\x01" * 6, client_ports)
        self.server = self._side("server", server_config or cfg, b"\x02" * 6, server_ports)
        self.tcp: dict[tuple[str, int], tuple[str, int]] = {}
        self.sends: deque[tuple[Side, int, bytes]] = deque()  # (receiver, its qpn, data)
        self.drop_llc: Callable[[Side, bytes], bool] = lambda side, data: False
        self.mangle: Callable[[Side, bytes], bytes] = lambda side, data: data
        self.clc_filter: Callable[[Side, int, bytes], bytes] = lambda side, conn, data: data
        self.pending_actions: list[tuple[Side, list[Action]]] = []
        self._conn_ids = itertools.count(1)

    def _side(self, name: str, cfg: Config, mac: bytes, ports: int = 1) -> Side:
        """An engine whose identity has ``ports`` RNIC ports (port i > 0: MAC byte 1 = 0x10 + i)."""
        more = tuple(Port(gid=(m := mac[:1] + bytes([0x10 + i]) + mac[2:]) * 2 + m[:4], mac=m,
                          netdev=f"{name}{i}") for i in range(1, ports))  # fmt: skip
        ident = LocalIdentity(gid=mac * 2 + mac[:4], mac=mac, peer_id=b"\x00\x01" + mac,
                              netdev=f"{name}0", more_ports=more)  # fmt: skip
        side = Side(name, None, self.fabric)  # type: ignore[arg-type]
        side.engine = Engine(cfg, ident, side)
        return side

    def peer(self, side: Side) -> Side:
        return self.server if side is self.client else self.client

    def connect(self, rmb_size: int = 65536, server_rmb: bool = True,
                client_rmb: bool = True, sndbuf_size: int = 0,
                reuse: tuple[int, int] | None = None,
                early: bool = False) -> tuple[int, int]:  # fmt: skip
        """Start a connection; returns (client conn id, server conn id).

        :param sndbuf_size: both sides' send buffers, handed to the engines as the
            runtime does (0: each engine's configured size).
        :param reuse: (client, server) ids of released connections whose RMBs the new
            one gets again, as the runtime's pool hands out a reusable RMB.
        :param early: the client's host sends the Proposal itself before the engine's
            ``connect`` (as a blocking connect's thread does: ``Stack.early_proposal``).
        """
        c, s = next(self._conn_ids), next(self._conn_ids)
        self.tcp[("client", c)] = ("server", s)
        self.tcp[("server", s)] = ("client", c)
        olds = reuse or (None, None)
        for side, cid, have, old in ((self.client, c, client_rmb, olds[0]),
                                     (self.server, s, server_rmb, olds[1])):  # fmt: skip
            rmb = side.rmbs[old] if old is not None else (
                self.fabric.alloc(rmb_size) if have else None)  # fmt: skip
            if rmb:
                side.rmbs[cid] = rmb
            side.sndbufs[cid] = bytearray(sndbuf_size or side.engine.config.sndbuf_size)
        self.run(self.server, self.server.engine.accept(s, self.server.rmbs.get(s), LOOPBACK,
                                                        self.now, sndbuf_size))  # fmt: skip
        sent = None
        if early:
            data, port, offers_v2 = self.client.engine.proposal(LOOPBACK)
            self.client.clc_out.setdefault(c, bytearray()).extend(data)
            self.pending_actions.append(
                (self.server, self.server.engine.receive_clc(s, data, self.now)))
            sent = port, offers_v2
        self.run(self.client, self.client.engine.connect(c, self.client.rmbs.get(c), LOOPBACK,
                                                         self.now, sndbuf_size, sent))  # fmt: skip
        return c, s

    # -- executing actions -------------------------------------------------------

    def run(self, side: Side, actions: list[Action]) -> None:
        for a in actions:
            self._execute(side, a)
        side.pull_events()

    def _execute(self, side: Side, a: Action) -> None:
        if isinstance(a, SendClc):
            peer_name, peer_conn = self.tcp[(side.name, a.conn)]
            data = self.clc_filter(side, a.conn, a.data)
            side.clc_out.setdefault(a.conn, bytearray()).extend(data)
            peer = self.client if peer_name == "client" else self.server
            self.pending_actions.append((peer, peer.engine.receive_clc(peer_conn, data, self.now)))
        elif isinstance(a, QpToRtr):
            side.qp_peer[a.qpn] = a.peer_qpn
            side.rtr.append(a)
        elif isinstance(a, QpToRts):
            side.rts.add(a.qpn)
        elif isinstance(a, PostSend):
            if a.data[0] != 0xFE:
                side.llc_sent.append(a.data)
            else:
                side.cdc_sent.append((a.qpn, a.data))
            peer = self.peer(side)
            if not self.drop_llc(side, a.data) and a.qpn in side.qp_peer:
                self.sends.append((peer, side.qp_peer[a.qpn], self.mangle(side, a.data)))
            self.pending_actions.append(
                (side, side.engine.send_completed(a.qpn, a.wr_id, True, self.now)))
        elif isinstance(a, RdmaWrite):
            sndbuf = side.sndbufs[a.conn]
            assert a.src_offset + a.length <= len(sndbuf), "WRITE outside the send buffer"
            src = sndbuf[a.src_offset : a.src_offset + a.length]
            vaddr, mem = self.fabric.target(side, a.qpn, a.rkey)
            off = a.remote_addr - vaddr
            assert off >= 0 and off + a.length <= len(mem), "WRITE outside the RMB"
            mem[off : off + a.length] = src
        elif isinstance(a, DestroyQp):
            side.destroyed.add(a.qpn)
        elif isinstance(a, ShutdownTcp):
            side.tcp_shut[a.conn] = max(side.tcp_shut.get(a.conn, 0), a.how)
            side.tcp_shutdowns.setdefault(a.conn, []).append(a.how)
        elif isinstance(a, ReleaseConnection):
            side.released.add(a.conn)
            self.pending_actions.append((side, side.engine.release(a.conn, self.now)))
        elif isinstance(a, ReuseRmb):
            side.reused.append(a.conn)

    def step(self) -> bool:
        """Deliver one thing in flight (actions before messages); False when nothing is."""
        if self.pending_actions:
            side, actions = self.pending_actions.pop(0)
            self.run(side, actions)
        elif self.sends:
            side, qpn, data = self.sends.popleft()
            self.run(side, side.engine.receive_wr(qpn, memoryview(data), self.now))
        else:
            return False
        return True

    def step_until(self, reached: Callable[[], bool], what: str, rounds: int = 200) -> None:
        """Deliver one thing at a time until ``reached()`` (checked before each step), to
        stop a flow at a point of its own; fail naming ``what`` if it never gets there."""
        for _ in range(rounds):
            if reached():
                return
            if not self.step():
                break
        if not reached():
            raise AssertionError(f"never reached: {what}")

    def pump(self, rounds: int = 200) -> None:
        """Deliver everything in flight until quiet; fail if it never settles."""
        for _ in range(rounds):
            if not self.step():
                return
        raise AssertionError("pump did not settle")

    def advance(self, seconds: float) -> None:
        """Move the clock and fire both engines' timers."""
        self.now += seconds
        for side in (self.client, self.server):
            self.run(side, side.engine.handle_timer(self.now))
        self.pump()

    def do(self, side: Side, actions: list[Action]) -> None:
        """Run actions from an application call, then pump."""
        self.run(side, actions)
        self.pump()


def lgr_of(side: Side) -> LinkGroup:
    """The side's only link group."""
    (lgr,) = side.engine.lgrs.values()
    return lgr


def transfer(p: Pair, c: int, s: int, data: bytes) -> bytes:
    """``data`` written by the client's connection ``c``, then read by the server's ``s``."""
    n, actions = p.client.write(c, data)
    assert n == len(data)
    p.do(p.client, actions)
    got, actions = p.server.read(s)
    p.do(p.server, actions)
    return got
