"""The server of ``smcr bench --conns`` (:mod:`smcr.tools.benchconns`), and what both of
its processes measure of themselves.

A one-thread non-blocking echo server on ``selectors``: for SMC-R its listener is
:func:`smcr.create_server` (smcr sockets have a ``fileno()`` that a selector waits on),
for TCP a plain one.  The client drives it through a pipe: ``("serve",)`` starts a run
(the footprint before it is taken, then ``"ready"``), ``("opened", n)`` asks for the
footprint once ``n`` connections are accepted, ``("exchange",)`` when the exchanges
begin (the CPU time is counted from there), ``("used", k)`` for the RSS and the CPU
time per transaction after ``k`` exchanges, ``("idle",)`` for the RSS once the connections
have been idle a while (the asks answered ``"measured"``),
``("end",)`` for the figures once every connection has ended (the client closed them
all), ``("quit",)`` ends the process.
"""

from __future__ import annotations

import gc
import os
import resource
import selectors
import socket
import time
from collections import Counter
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

MESSAGE = 100
"""Bytes of each request and of its response."""
STALL = 60.0
"""Seconds without progress after which a phase gives up on what is left (counted)."""
ACCEPT_PAUSE = 0.2
"""Seconds the listener is left alone after an ``accept`` failed (``EMFILE``: it stays
readable while nothing can be accepted; asyncio's servers pause the same way)."""


def raise_nofile() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to the hard limit (capped by
    ``fs.nr_open`` where the hard limit is unlimited); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                hard = int(f.read())
        except (OSError, ValueError):
            return soft
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass
    return soft


@dataclass(frozen=True)
class Footprint:
    """What this process holds: resident memory and open descriptors."""

    rss_kib: int
    fds: int


_SPARE: list[int] = []
"""Descriptors held back for :func:`footprint`, which needs two where connections may
have taken all the others (a run at the process's limit)."""


def keep_spare() -> None:
    """Hold back the descriptors :func:`footprint` needs (as many as are free, up to 2)."""
    while len(_SPARE) < 2:
        try:
            _SPARE.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            return


def footprint() -> Footprint:
    """This process's ``VmRSS`` (KiB) and the entries of ``/proc/self/fd``, after a
    garbage collection (what was dropped is gone); read with the spare descriptors let
    go of (:func:`keep_spare`), so they are not counted, and held back again after."""
    gc.collect()
    while _SPARE:
        os.close(_SPARE.pop())
    try:
        rss = 0
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                    break
        return Footprint(rss, len(os.listdir("/proc/self/fd")))
    finally:
        keep_spare()


@dataclass
class Side:
    """One process's cost in one run."""

    rss_kib_per_conn: float = 0.0
    """RSS with every connection open, minus before the first connect, per connection."""
    fds_per_conn: float = 0.0
    """Open descriptors, the same way."""
    rss_kib_per_conn_used: float = 0.0
    """RSS after the exchanges (every connection still open), the same way."""
    rss_kib_per_conn_idle: float = 0.0
    """RSS once the connections have been idle a while (SMC-R: ``IDLE_WAIT`` seconds, in
    which they give back what their traffic touched), the same way."""
    kept_mib: float = 0.0
    """RSS once every connection has ended, minus before the first connect (MiB)."""
    cpu_us_per_tx: float = 0.0
    """CPU time of the exchange phase (user and system, every thread of the process) per
    transaction (microseconds): what a message costs, where ``tx_per_s`` also says how
    the two processes shared the host's CPUs."""


def cpu_seconds() -> float:
    """CPU time of this process so far (user and system, every thread; to the nanosecond,
    where ``os.times`` counts clock ticks: a short run's phase may last a few of them)."""
    return time.process_time()


def per_tx(cpu_s: float, transactions: int) -> float:
    """``cpu_s`` seconds per transaction, in microseconds (0 without transactions)."""
    return cpu_s / transactions * 1e6 if transactions else 0.0


def per_conn(before: Footprint, now: Footprint, conns: int) -> tuple[float, float]:
    """RSS (KiB) and descriptors per connection, from ``before`` to ``now``."""
    if not conns:
        return 0.0, 0.0
    return (now.rss_kib - before.rss_kib) / conns, (now.fds - before.fds) / conns


def kept(before: Footprint, after: Footprint) -> float:
    """MiB of RSS from ``before`` to ``after``."""
    return (after.rss_kib - before.rss_kib) / 1024


def server_main(ctl: Connection, kind: str, host: str, backlog: int, bufsize: int = 0,
                netns: str | None = None) -> None:  # fmt: skip
    """The server process of one run: an smcr listener (``kind`` ``smc``) or a plain
    one (``tcp``), its port sent through ``ctl``, then runs as the client asks."""
    raise_nofile()
    keep_spare()
    if netns is not None:
        from smcr.tools.netns import enter_netns  # noqa: PLC0415

        enter_netns(netns)
    listener: socket.socket
    if kind == "smc":
        import smcr  # noqa: PLC0415 - only where SMC-R is measured

        listener = smcr.create_server((host, 0), backlog=backlog)
        if bufsize:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, bufsize)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, bufsize)
    else:
        listener = socket.create_server((host, 0), backlog=backlog)
    listener.setblocking(False)
    ctl.send(listener.getsockname()[1])
    try:
        while ctl.recv()[0] == "serve":
            ctl.send(_serve(listener, ctl))
    except (EOFError, ConnectionError):  # the client is gone: so is the bench
        pass


class _Echo:
    """A server connection: what it still has to send back."""

    __slots__ = ("out", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = b""


class _Run:
    """The server's side of one run, as it goes."""

    def __init__(self) -> None:
        self.before = footprint()
        self.side = Side()
        self.errors: Counter[str] = Counter()
        self.modes: Counter[str] = Counter()
        self.accepted = 0
        self.closed = 0
        self.want_open: int | None = None  # the client opened this many: measure then
        self.ending = False
        self.cpu_at_start = 0.0

    def command(self, cmd: tuple[Any, ...], ctl: Connection) -> None:
        """A word from the client."""
        if cmd[0] == "opened":
            self.want_open = cmd[1]
        elif cmd[0] == "exchange":
            self.cpu_at_start = cpu_seconds()
        elif cmd[0] == "used":
            self.side.cpu_us_per_tx = per_tx(cpu_seconds() - self.cpu_at_start, cmd[1])
            self.side.rss_kib_per_conn_used, _ = per_conn(self.before, footprint(),
                                                          self.accepted)  # fmt: skip
            ctl.send("measured")
        elif cmd[0] == "idle":
            self.side.rss_kib_per_conn_idle, _ = per_conn(self.before, footprint(),
                                                          self.accepted)  # fmt: skip
            ctl.send("measured")
        elif cmd[0] == "end":
            self.ending = True

    def measure_open(self, ctl: Connection, quiet_for: float) -> None:
        """The footprint with every connection open, once the client said how many
        there are and they are accepted (or none came for ``STALL / 2`` seconds)."""
        want = self.want_open
        if want is None or (self.accepted < want and quiet_for < STALL / 2):
            return
        if self.accepted < want:
            self.errors["server: opened by the client, never accepted"] += want - self.accepted
        self.side.rss_kib_per_conn, self.side.fds_per_conn = per_conn(
            self.before, footprint(), self.accepted)
        self.want_open = None
        ctl.send("measured")


def _serve(listener: socket.socket, ctl: Connection) -> dict[str, Any]:
    """One run's server side (the module's docstring); returns its figures."""
    run = _Run()
    ctl.send("ready")
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listener")
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    buf = bytearray(1 << 16)
    last = time.monotonic()
    paused_until: float | None = None
    while not (run.ending and run.closed >= run.accepted):
        events = sel.select(1.0 if paused_until is None else ACCEPT_PAUSE)
        if paused_until is not None and time.monotonic() >= paused_until:
            sel.register(listener, selectors.EVENT_READ, "listener")
            paused_until = None
        if run.ending and time.monotonic() - last > STALL:  # (events or not: see below)
            run.errors[f"server: connections that did not end in {STALL:.0f} s"] += (
                run.accepted - run.closed)
            break
        for key, mask in events:
            if key.data == "listener":
                accepted, failed = _accept_all(listener, sel, run)
                if failed:  # (EMFILE: it stays readable while nothing can be accepted)
                    sel.unregister(listener)
                    paused_until = time.monotonic() + ACCEPT_PAUSE
                if not accepted:
                    continue
                run.accepted += accepted
            elif key.data == "ctl":
                run.command(ctl.recv(), ctl)
            elif not _echo(key.data, mask, sel, buf, run.errors):
                run.closed += 1
            last = time.monotonic()
        run.measure_open(ctl, time.monotonic() - last)
    for key in list(sel.get_map().values()):
        if isinstance(key.data, _Echo):
            key.data.sock.close()
    sel.close()
    run.side.kept_mib = kept(run.before, footprint())
    return {"side": asdict(run.side), "accepted": run.accepted, "modes": dict(run.modes),
            "errors": dict(run.errors)}


def _accept_all(listener: socket.socket, sel: selectors.BaseSelector,
                run: _Run) -> tuple[int, bool]:  # fmt: skip
    """Accept every connection waiting; returns how many, and whether an ``accept``
    failed (counted)."""
    count = 0
    while True:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            return count, False
        except OSError as exc:  # EMFILE...: counted (the client sees it too)
            run.errors[f"server: accept: {exc}"] += 1
            return count, True
        sock.setblocking(False)
        run.modes[getattr(sock, "smc_mode", "TCP")] += 1
        sel.register(sock, selectors.EVENT_READ, _Echo(sock))
        count += 1


def _echo(echo: _Echo, mask: int, sel: selectors.BaseSelector, buf: bytearray,
          errors: Counter[str]) -> bool:  # fmt: skip
    """Serve one ready connection; False once it has ended (and is closed)."""
    sock = echo.sock
    try:
        if mask & selectors.EVENT_READ and not echo.out:
            try:
                n = sock.recv_into(buf)
            except BlockingIOError:
                return True
            if not n:
                sel.unregister(sock)
                sock.close()
                return False
            echo.out = bytes(buf[:n])
        if echo.out:
            try:
                sent = sock.send(echo.out)
            except BlockingIOError:
                sent = 0
            echo.out = echo.out[sent:]
            sel.modify(sock, selectors.EVENT_WRITE if echo.out else selectors.EVENT_READ, echo)
    except OSError as exc:
        errors[f"server: {type(exc).__name__}: {exc}"] += 1
        sel.unregister(sock)
        sock.close()
        return False
    return True
