"""One end of the RoCE failover test (:mod:`tests.stack.test_failover_roce`), run inside a
network namespace: ``python -m tests.stack.failover_peer server|client ADDRESS PORT CONNS SIZE``.

Server: accepts ``CONNS`` SMC-R connections and echoes each, hashing what came.  Client:
opens ``CONNS`` connections to ``ADDRESS:PORT``, sends ``SIZE`` random bytes on each while
reading the echo back, hashing both.  Both print JSON lines on stdout: ``{"ready": port}``
(server, once listening), then every 50 ms ``{"moved": bytes received so far, "links":
[active links of each link group], "versions": [their SMC-R versions], "detail": ...}``
(``SMCR_FAILOVER_REPORT_S`` sets the period), and at the end ``{"done": [per connection: sha256
sent, sha256 received, error or ""]}``.  They then wait for stdin to close (the test
checks the groups after recovery meanwhile) and exit.  Environment: ``SMCR_RNIC=roce`` and
``SMCR_ROCE_DEVS`` (the test sets them).
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time

import smcr
from smcr.core.linkgroup import LinkState
from smcr.stack.runtime import process_stacks

CHUNK = 64 << 10
moved = [0]
_lock = threading.Lock()


def say(obj: object) -> None:
    with _lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def count(n: int) -> None:
    with _lock:
        moved[0] += n


def links() -> list[int]:
    out = []
    for stack in process_stacks():
        with stack.lock:
            for lgr in stack.engine.lgrs.values():
                if not lgr.terminated:
                    out.append(sum(1 for x in lgr.links if x.state is LinkState.LINK_ACTIVE))
    return out


def versions() -> list[int]:
    """The SMC-R version of each live link group (1, or 2 with a UEID on both)."""
    out = []
    for stack in process_stacks():
        with stack.lock:
            out += [lgr.version for lgr in stack.engine.lgrs.values() if not lgr.terminated]
    return out


def detail() -> list[list[object]]:
    """Per runtime and link: port 0's net device, link id, state, port, that port's net
    device (for a failing test's message)."""
    out: list[list[object]] = []
    for stack in process_stacks():
        with stack.lock:
            for lgr in stack.engine.lgrs.values():
                for x in lgr.links:
                    out.append([stack.device.netdev, lgr.lgr_type.value, x.link_id,
                                x.state.value, x.port, stack.ports[x.port].device.netdev])
    return out


def reporter(stop: threading.Event) -> None:
    period = float(os.environ.get("SMCR_FAILOVER_REPORT_S", "0.05"))
    while not stop.wait(period):
        say({"moved": moved[0], "links": links(), "versions": versions(), "detail": detail()})


def echo(conn: smcr.SMCSocket, result: list[object]) -> None:
    got = hashlib.sha256()
    try:
        with conn:
            while data := conn.recv(CHUNK):
                got.update(data)
                count(len(data))
                conn.sendall(data)
        result[:] = [got.hexdigest(), got.hexdigest(), ""]
    except OSError as exc:
        result[:] = ["", got.hexdigest(), repr(exc)]


def client_conn(conn: smcr.SMCSocket, size: int, result: list[object]) -> None:
    sent, got = hashlib.sha256(), hashlib.sha256()
    error: list[str] = []

    def send() -> None:
        try:
            left = size
            while left:
                data = os.urandom(min(CHUNK, left))
                sent.update(data)
                conn.sendall(data)
                left -= len(data)
            conn.shutdown(socket.SHUT_WR)
        except OSError as exc:
            error.append(repr(exc))

    t = threading.Thread(target=send)
    t.start()
    try:
        while data := conn.recv(CHUNK):
            got.update(data)
            count(len(data))
    except OSError as exc:
        error.append(repr(exc))
    t.join()
    conn.close()
    result[:] = [sent.hexdigest(), got.hexdigest(), "; ".join(error)]


def _busy_threads(_sig: int, _frame: object) -> None:
    """SIGUSR2: the stacks of the threads that are not waiting (faulthandler shows 100)."""
    import traceback  # noqa: PLC0415

    for ident, frame in sys._current_frames().items():
        names = [f.f_code.co_name for f, _ in traceback.walk_stack(frame)]
        if names and names[0] in ("wait", "_acquire_restore", "_wait_for_tstate_lock"):
            continue
        sys.stderr.write(f"--- thread {ident}\n" + "".join(traceback.format_stack(frame)))
    sys.stderr.flush()


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # a stuck peer's threads, for a failing test
    signal.signal(signal.SIGUSR2, _busy_threads)
    role, address, port, conns, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        int(sys.argv[4]), int(sys.argv[5])  # fmt: skip
    stop = threading.Event()
    threads, results = [], [[] for _ in range(conns)]  # type: list[threading.Thread], list[list[object]]
    if role == "server":
        srv = smcr.create_server((address, port), backlog=conns)
        say({"ready": srv.getsockname()[1]})
        threading.Thread(target=reporter, args=(stop,), daemon=True).start()
        for i in range(conns):
            c, _ = srv.accept()
            t = threading.Thread(target=echo, args=(c, results[i]))
            t.start()
            threads.append(t)
        srv.close()
    else:
        threading.Thread(target=reporter, args=(stop,), daemon=True).start()
        socks = [smcr.create_connection((address, port), timeout=30) for _ in range(conns)]
        for s in socks:
            s.settimeout(None)
        for i, s in enumerate(socks):
            t = threading.Thread(target=client_conn, args=(s, size, results[i]))
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    say({"done": results})
    sys.stdin.read()  # until the test closes our stdin
    stop.set()
    time.sleep(0.1)


if __name__ == "__main__":
    main()
