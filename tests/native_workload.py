"""A workload whose results must not depend on smcr being compiled (tests/test_native.py).

``python -m tests.native_workload`` prints one JSON object: which build ran
(:func:`smcr.native.status`, the files of the modules) and the results of

* the sans-IO engines (tests/core/pair.py): a handshake, data both ways round
  both rings in uneven writes and reads, the connections' cursors after it; a
  malformed CLC reply (handshake failure), a non-SMC reply (fallback), a silent
  server (CLC timeout) -- the events each side saw;
* the whole stack over the shm RNIC between two processes (this module with
  ``serve`` runs the echo server): SMC-R connections made by
  ``create_connection``, messages of several sizes echoed back, their digests
  and the sockets' :class:`smcr.SmcInfo` (less the random link group ID).

Everything printed is deterministic: the data comes from a seeded generator,
and what is random by design (link group IDs, QP numbers) is left out.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import smcr
from smcr import native
from smcr.core import Config
from tests.core.pair import Pair, Side

SIZES = (1, 1000, 4096, 65536, 300_000)
STREAM_WRITES = 3000


def _data(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _transfer(p: Pair, src: Any, dst: Any, sc: int, dc: int, data: bytes, write: int,
              read: int) -> bytes:  # fmt: skip
    got = bytearray()
    off = 0
    for _ in range(100_000):
        if off < len(data):
            n, acts = src.write(sc, data[off : off + write], p.now)
            off += n
            p.do(src, acts)
        chunk, acts = dst.read(dc, read, p.now)
        got += chunk
        p.do(dst, acts)
        if len(got) == len(data):
            return bytes(got)
    raise AssertionError("transfer stalled")


def _events(p: Pair) -> dict[str, list[str]]:
    return {side.name: [type(e).__name__ for e in side.events] for side in (p.client, p.server)}


def _server_says(p: Pair, instead: bytes) -> Callable[[Side, int, bytes], bytes]:
    """A CLC filter: the server's CLC bytes replaced by ``instead``."""

    def swap(side: Side, conn: int, data: bytes) -> bytes:
        return instead if side is p.server else data

    return swap


def sans_io() -> dict[str, Any]:
    """The engines alone, in memory."""
    out: dict[str, Any] = {}
    cfg = Config(sndbuf_size=16384, rmb_size=16384)
    p = Pair(cfg)
    c, s = p.connect(rmb_size=cfg.rmb_size)
    p.pump()
    there = _transfer(p, p.client, p.server, c, s, _data(200_000, 1), 7000, 5000)
    back = _transfer(p, p.server, p.client, s, c, _data(70_001, 2), 3333, 777)
    conns = {"client": p.client.engine.conns[c], "server": p.server.engine.conns[s]}
    out["data"] = {
        "there": _digest(there), "back": _digest(back),
        "cursors": {name: [conn.tx_sent, conn.tx_fin, conn.tx_app, str(conn.state)]
                    for name, conn in conns.items()},
        "events": _events(p),
    }  # fmt: skip
    for name, garbage in (("malformed", b"\xe2\xd4\xc3\xd9\x02\x00\x05\x10"),
                          ("not_smc", b"GET / HTTP/1.1\r\n")):  # fmt: skip
        p = Pair()
        p.clc_filter = _server_says(p, garbage)
        p.connect()
        p.pump()
        out[name] = {side.name: [repr(e) for e in side.events] for side in (p.client, p.server)}
    p = Pair()
    p.clc_filter = _server_says(p, b"")
    p.connect()
    p.pump()
    p.advance(6.1)
    out["silent_server"] = _events(p)
    return out


def serve(listener: smcr.SMCSocket) -> None:
    """Echo each connection's bytes back until it ends (one thread per connection)."""

    def echo(conn: smcr.SMCSocket) -> None:
        with conn:
            while data := conn.recv(1 << 20):
                conn.sendall(data)

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


def _info(sock: smcr.SMCSocket) -> dict[str, Any]:
    info = sock.smc_info()
    return {"mode": info.mode, "reason": info.reason, "first_contact": info.first_contact,
            "state": info.state, "rmb": info.rmb_size, "peer_rmb": info.peer_rmb_size,
            "version": info.version}  # fmt: skip


def _stream(sock: smcr.SMCSocket, seed: int) -> bool:
    """A stream of small writes (the autocorked path: they wait in the send buffer while
    the echo server's answer to the burst's first CDC is due) read back concurrently;
    whether the echo is the stream."""
    data = _data(STREAM_WRITES * 1000, seed)
    got = bytearray()

    def read() -> None:
        while len(got) < len(data) and (chunk := sock.recv(1 << 16)):
            got.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    view = memoryview(data)
    for off in range(0, len(data), 1000):
        sock.sendall(view[off : off + 1000])
    reader.join(30)
    return bytes(got) == data


def stack() -> dict[str, Any]:
    """SMC-R between this process and an echo server process, over the shm RNIC."""
    server = subprocess.Popen([sys.executable, "-m", "tests.native_workload", "serve"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        out: dict[str, Any] = {"server": server.stdout.readline().strip()}
        for n in range(2):  # first contact, then a connection that joins the group
            with smcr.create_connection(("127.0.0.1", port), timeout=30) as sock:
                echoed = []
                for i, size in enumerate(SIZES):
                    data = _data(size, 10 * n + i)
                    sock.sendall(data)
                    got = bytearray()
                    while len(got) < size:
                        chunk = sock.recv(size - len(got))
                        assert chunk, "echo server closed early"
                        got += chunk
                    echoed.append(_digest(bytes(got)) == _digest(data))
                out[f"conn{n}"] = {"info": _info(sock), "echoed": echoed,
                                   "stream": _stream(sock, 10 * n + 9)}  # fmt: skip
    finally:
        server.kill()
        server.wait()
    return out


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        listener = smcr.create_server(("127.0.0.1", 0))
        print(listener.getsockname()[1])
        print(native.status().describe(), flush=True)
        serve(listener)
        return
    from smcr.core import engine  # noqa: PLC0415
    from smcr.stack import runtime  # noqa: PLC0415
    from smcr.wire import clc  # noqa: PLC0415

    result = {
        "native": native.status().describe(),
        "compiled": [native.module_is_compiled(m) for m in (engine, runtime, clc)],
        "sans_io": sans_io(),
        "stack": stack(),
    }
    print(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
