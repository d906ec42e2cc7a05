"""The client of ``smcr bench --conns`` (:mod:`smcr.tools.benchconns`): one run of one
transport, in a process of its own that starts its server (:mod:`smcr.tools.connsserver`).

A run: one connection warms both processes up (the smcr runtime started, a link group
made, modules imported), then the client opens N connections at once (every
``connect`` non-blocking, one selector waits for them all), both processes take their
footprint, one selector drives K request/response exchanges of 100 bytes on every
connection (each response checked byte for byte; both processes count their CPU time
meanwhile), both take their RSS, and again once the connections have been idle
:data:`IDLE_WAIT` seconds (SMC-R's give back what their traffic touched), and once the
client has closed them all and the server has seen each end.
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing as mp
import os
import selectors
import socket
import struct
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from smcr.tools.connsserver import (
    MESSAGE,
    STALL,
    Side,
    cpu_seconds,
    footprint,
    keep_spare,
    kept,
    per_conn,
    per_tx,
    raise_nofile,
    server_main,
)

IDLE_WAIT = 2.5
"""Seconds an SMC-R run's connections stay idle before the RSS is read again: they give
back their touched buffer pages within twice :data:`smcr.stack.trim.LOOK_EVERY` (a TCP
run's read at once: its idle sockets hold no more later)."""
_HEAD = struct.Struct(">II")  # connection index, exchange number
_FILL = bytes(range(32, 32 + MESSAGE - _HEAD.size))


def request(index: int, exchange: int) -> bytes:
    """The 100 bytes connection ``index`` sends in exchange ``exchange`` (and expects
    back): each one different, so that a response of another connection or exchange
    shows."""
    return _HEAD.pack(index, exchange) + _FILL


@dataclass
class ConnsRun:
    """One run of one transport."""

    kind: str
    """``smc`` or ``tcp``."""
    conns: int
    """Connections asked for."""
    opened: int = 0
    """Connections the client opened (``conns`` unless ``failure``)."""
    connect_s: float = 0.0
    """Seconds from the first ``connect`` until every connection was open."""
    tx_per_s: float = 0.0
    """Request/response exchanges per second, all connections together (0: not run)."""
    client: Side = field(default_factory=Side)
    server: Side = field(default_factory=Side)
    smcr: int = 0
    """Client connections in SMC-R mode (``smc_info().mode == "SMCR"``)."""
    server_smcr: int = 0
    """Server connections accepted in SMC-R mode."""
    fallbacks: dict[str, int] = field(default_factory=dict)
    """SMC-R runs: connections that fell back to TCP, by ``mode local/peer`` codes."""
    errors: dict[str, int] = field(default_factory=dict)
    """Exceptions and wrong bytes, by kind, both processes."""
    failure: str = ""
    """Why fewer than ``conns`` connections were opened, or the run ended early ("")."""

    @property
    def error_count(self) -> int:
        """Errors of both processes."""
        return sum(self.errors.values())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConnsRun:
        """A run from its :func:`dataclasses.asdict` (sent by the client process)."""
        return cls(**{**data, "client": Side(**data["client"]),
                      "server": Side(**data["server"])})  # fmt: skip


def client_main(out: Connection, kind: str, conns: int, exchanges: int, bufsize: int,
                host: str, peer_netns: str | None) -> None:  # fmt: skip
    """The client process: one run; sends its :class:`ConnsRun` as a dict through
    ``out`` (a run that broke off says why in ``failure``)."""
    raise_nofile()
    keep_spare()
    bench: ConnsClient | None = None
    try:
        bench = ConnsClient(kind, conns, exchanges, bufsize, host, peer_netns)
        bench.warm_up()
        result = bench.run()
    except Exception as exc:  # reported as the run's failure, not as a traceback
        result = ConnsRun(kind, conns, failure=f"{type(exc).__name__}: {exc}")
    finally:
        if bench is not None:
            bench.close()
    out.send(asdict(result))


class _Exchange:
    """A client connection in the exchange phase."""

    __slots__ = ("done", "expected", "got", "index", "out", "resp", "sock")

    def __init__(self, index: int, sock: socket.socket) -> None:
        self.index = index
        self.sock = sock
        self.done = 0
        self.got = 0
        self.resp = memoryview(bytearray(MESSAGE))
        self.expected = b""
        self.out = b""


class ConnsClient:
    """The client side of one run; owns the server process."""

    def __init__(self, kind: str, conns: int, exchanges: int, bufsize: int = 0,
                 host: str = "127.0.0.1", peer_netns: str | None = None) -> None:  # fmt: skip
        self.kind = kind
        self.conns = conns
        self.exchanges = exchanges
        self.bufsize = bufsize
        self.host = host
        backlog = max(128, min(conns, 65535))
        ctx = mp.get_context("spawn")
        self.ctl, child = ctx.Pipe()
        self.proc = ctx.Process(target=server_main,
                                args=(child, kind, host, backlog, bufsize, peer_netns),
                                daemon=True)  # fmt: skip
        self.proc.start()
        child.close()
        if not self.ctl.poll(30):
            raise RuntimeError("bench server did not start")
        self.address = (host, int(self.ctl.recv()))

    def _socket(self) -> socket.socket:
        if self.kind == "tcp":
            return socket.socket()
        import smcr  # noqa: PLC0415

        s = smcr.SMCSocket()
        if self.bufsize:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.bufsize)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.bufsize)
        return s

    def warm_up(self) -> None:
        """One connection, a message each way, closed: the smcr runtime, the first link
        group and the modules are there before the first figure."""
        self._ask(("serve",), "ready")
        s = self._socket()
        s.connect(self.address)
        self._ask(("opened", 1), "measured")
        s.sendall(request(0, 0))
        s.recv(MESSAGE, socket.MSG_WAITALL)
        self._ask(("used", 0), "measured")  # (no figures kept of the warm-up)
        s.close()
        self.ctl.send(("end",))
        self._reply(None)

    def run(self) -> ConnsRun:
        """Open, measure, exchange, close, measure (the module's docstring)."""
        result = ConnsRun(self.kind, self.conns)
        errors: Counter[str] = Counter()
        self._ask(("serve",), "ready")
        before = footprint()
        socks = self._open(result, errors)
        self._ask(("opened", len(socks)), "measured")
        result.client.rss_kib_per_conn, result.client.fds_per_conn = per_conn(
            before, footprint(), len(socks))
        if self.kind == "smc":
            _check_smc(socks, result)
        done = 0
        if not result.failure and socks:
            self.ctl.send(("exchange",))
            cpu_at_start = cpu_seconds()
            result.tx_per_s, done = self._exchange(socks, errors)
            result.client.cpu_us_per_tx = per_tx(cpu_seconds() - cpu_at_start, done)
        result.client.rss_kib_per_conn_used, _ = per_conn(before, footprint(), len(socks))
        self._ask(("used", done), "measured")
        if self.kind == "smc" and socks:
            time.sleep(IDLE_WAIT)
        result.client.rss_kib_per_conn_idle, _ = per_conn(before, footprint(), len(socks))
        self._ask(("idle",), "measured")
        for _, s in socks:
            try:
                s.close()
            except OSError as exc:
                errors[f"close: {exc}"] += 1
        socks.clear()
        self.ctl.send(("end",))
        server = self._reply(None)
        result.client.kept_mib = kept(before, footprint())
        result.server = Side(**server["side"])
        result.server_smcr = server["modes"].get("SMCR", 0)
        errors.update(server["errors"])
        result.errors = dict(errors)
        return result

    def _open(self, result: ConnsRun, errors: Counter[str]) -> list[tuple[int, socket.socket]]:
        """Open N connections at once: every ``connect`` started non-blocking, then one
        selector waits until each is writable (connected, or failed: ``SO_ERROR``)."""
        sel = selectors.DefaultSelector()
        t0 = time.perf_counter()
        started = 0
        try:
            while started < self.conns:
                s = self._socket()
                try:
                    s.setblocking(False)
                    err = s.connect_ex(self.address)
                    if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
                        raise OSError(err, os.strerror(err))
                    sel.register(s, selectors.EVENT_WRITE, started)
                except BaseException:
                    s.close()
                    raise
                started += 1
        except OSError as exc:  # EMFILE, EADDRNOTAVAIL...: how far it got, and why
            result.failure = f"connection {started + 1}: {exc}"
        opened = self._wait_connected(sel, errors)
        result.connect_s = time.perf_counter() - t0
        result.opened = len(opened)
        if len(opened) < self.conns:
            why = result.failure or f"{started - len(opened)} connects failed"
            result.failure = f"opened {len(opened)} of {self.conns}: {why}"
        return sorted(opened, key=lambda pair: pair[0])

    @staticmethod
    def _wait_connected(sel: selectors.BaseSelector,
                        errors: Counter[str]) -> list[tuple[int, socket.socket]]:  # fmt: skip
        """Wait for the connects registered in ``sel``; the connected ones, by index."""
        opened: list[tuple[int, socket.socket]] = []
        last = time.monotonic()
        while sel.get_map():
            events = sel.select(1.0)
            if events:
                last = time.monotonic()
            elif time.monotonic() - last > STALL:
                errors[f"connect did not finish in {STALL:.0f} s"] += len(sel.get_map())
                break
            for key, _ in events:
                s = key.fileobj
                assert isinstance(s, socket.socket)
                sel.unregister(s)
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    errors[f"connect: {os.strerror(err)}"] += 1
                    s.close()
                else:
                    opened.append((key.data, s))
        for key in list(sel.get_map().values()):  # (those that did not finish)
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            sock.close()
        sel.close()
        return opened

    def _exchange(self, socks: list[tuple[int, socket.socket]],
                  errors: Counter[str]) -> tuple[float, int]:  # fmt: skip
        """K exchanges on every connection, one selector for all; transactions per second
        (responses that came back right, over the whole phase), and how many there were."""
        sel = selectors.DefaultSelector()
        t0 = time.perf_counter()
        active = 0
        for index, s in socks:
            ex = _Exchange(index, s)
            sel.register(s, selectors.EVENT_READ, ex)
            active += 1 if _next_request(ex, sel, errors) else 0
        done = 0
        last = time.monotonic()
        while active:
            events = sel.select(1.0)
            if events:
                last = time.monotonic()
            elif time.monotonic() - last > STALL:
                errors[f"exchanges stalled for {STALL:.0f} s"] += active
                break
            for key, mask in events:
                if self._step(key.data, mask, sel, errors):
                    active -= 1
                    done += key.data.done
        elapsed = time.perf_counter() - t0
        done += sum(key.data.done for key in sel.get_map().values())
        sel.close()
        return (done / elapsed if elapsed > 0 else 0.0), done

    def _step(self, ex: _Exchange, mask: int, sel: selectors.BaseSelector,
              errors: Counter[str]) -> bool:  # fmt: skip
        """A ready connection: send what is left, read what came; True once it is done
        (every exchange, or an error: counted, the connection unregistered)."""
        if mask & selectors.EVENT_WRITE and ex.out and not _flush(ex, sel, errors):
            return True
        if not mask & selectors.EVENT_READ:
            return False
        try:
            n = ex.sock.recv_into(ex.resp[ex.got :])
        except BlockingIOError:
            return False
        except OSError as exc:
            errors[f"recv: {type(exc).__name__}: {exc}"] += 1
            sel.unregister(ex.sock)
            return True
        if not n:
            errors["the server ended a connection before its response"] += 1
            sel.unregister(ex.sock)
            return True
        ex.got += n
        if ex.got < MESSAGE:
            return False
        if ex.resp != ex.expected:
            errors["wrong bytes in a response"] += 1
            sel.unregister(ex.sock)
            return True
        ex.done += 1
        if ex.done == self.exchanges:
            sel.unregister(ex.sock)
            return True
        return not _next_request(ex, sel, errors)

    def _ask(self, cmd: tuple[Any, ...], reply: str) -> None:
        self.ctl.send(cmd)
        self._reply(reply)

    def _reply(self, expect: str | None) -> Any:
        """The server's next message (``expect``: the word it must be)."""
        if not self.ctl.poll(STALL * 2 + 30):
            raise RuntimeError("bench server did not answer")
        got = self.ctl.recv()
        if expect is not None and got != expect:
            raise RuntimeError(f"bench server said {got!r}, not {expect!r}")
        return got

    def close(self) -> None:
        """Stop the server."""
        with contextlib.suppress(OSError):
            self.ctl.send(("quit",))
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


def _check_smc(socks: list[tuple[int, socket.socket]], result: ConnsRun) -> None:
    """Count the connections in SMC-R mode, and the fallbacks by reason."""
    fallbacks: Counter[str] = Counter()
    for _, s in socks:
        info = s.smc_info()  # type: ignore[attr-defined]
        if info.mode == "SMCR":
            result.smcr += 1
        else:
            fallbacks[f"{info.mode} {info.reason}"] += 1
    result.fallbacks = dict(fallbacks)


def _next_request(ex: _Exchange, sel: selectors.BaseSelector, errors: Counter[str]) -> bool:
    """Send connection ``ex``'s next request; False if it failed (and is unregistered)."""
    ex.expected = request(ex.index, ex.done)
    ex.got = 0
    ex.out = ex.expected
    return _flush(ex, sel, errors)


def _flush(ex: _Exchange, sel: selectors.BaseSelector, errors: Counter[str]) -> bool:
    """Send what ``ex`` has to send (the rest waits for writability); False on an error
    (counted, the connection unregistered)."""
    try:
        sent = ex.sock.send(ex.out)
    except BlockingIOError:
        sent = 0
    except OSError as exc:
        errors[f"send: {type(exc).__name__}: {exc}"] += 1
        sel.unregister(ex.sock)
        return False
    ex.out = ex.out[sent:]
    events = selectors.EVENT_READ | (selectors.EVENT_WRITE if ex.out else 0)
    if sel.get_key(ex.sock).events != events:
        sel.modify(ex.sock, events, ex)
    return True
