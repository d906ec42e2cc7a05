"""Many asyncio connections at once, under ``smcr run`` and plainly: how long N clients take
to connect at once, and the request/response rate they reach together.

Run: ``python bench/asyncio_conns.py [--conns 1000] [--exchanges 20] [--size 100]
[--rounds 3] [--json]``.

What runs: an asyncio echo server (``asyncio.start_server``, one process) and an asyncio
client (one process) that opens ``--conns`` connections at once with
``asyncio.open_connection`` (``asyncio.gather``), then makes ``--exchanges``
request/responses of ``--size`` bytes on each, all connections at once, every answer
checked.  Both run plainly, then both under ``smcr run``, round by round (alternating, so
that a load that comes and goes falls on both); figures are medians of ``--rounds`` with
[min..max], and SMC-R against TCP.

Why this beside ``smcr bench --conns``: asyncio hands a socket's number out before
``connect`` (the event loop registers it), so each connect moves smcr's readiness
descriptor under a number the program holds (:mod:`smcr.stack.descriptors`), where
``smcr bench --conns`` (``connect_ex``, then ``register``) never does; that move once
cost a look at every descriptor of the process.

Exit status 1 when a connection failed, an answer was wrong, or (under ``smcr run``) a
connection was not SMC-R.  This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

START_WAIT = 60.0
"""Seconds the server has to start listening."""


def message(index: int, exchange: int, size: int) -> bytes:
    """What connection ``index`` sends in ``exchange`` (each different, so that an answer
    meant for another connection or exchange shows)."""
    head = f"{index}:{exchange}:".encode()
    return (head * (size // len(head) + 1))[:size]


async def serve(port: int, size: int) -> None:
    """The echo server (its process's work): answer each ``size``-byte message with it."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                writer.write(await reader.readexactly(size))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def smc_mode(writer: asyncio.StreamWriter) -> str:
    """``SMCR``, or ``TCP`` (a plain socket, or an SMC socket that fell back)."""
    sock = writer.get_extra_info("socket")
    info = getattr(getattr(sock, "_sock", sock), "smc_info", None)
    return str(info().mode) if info is not None else "TCP"


async def clients(port: int, conns: int, exchanges: int, size: int) -> dict[str, object]:
    """The client's work: connect ``conns`` at once, then the exchanges on all at once."""
    began = time.perf_counter()
    opened = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port)
                                    for _ in range(conns)), return_exceptions=True)  # fmt: skip
    connect_s = time.perf_counter() - began
    pairs = [p for p in opened if not isinstance(p, BaseException)]
    failed = len(opened) - len(pairs)
    modes = [smc_mode(w) for _, w in pairs]

    async def exchange(index: int, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> int:  # fmt: skip
        wrong = 0
        for n in range(exchanges):
            sent = message(index, n, size)
            writer.write(sent)
            await writer.drain()
            wrong += await reader.readexactly(size) != sent
        writer.close()
        await writer.wait_closed()
        return wrong

    began = time.perf_counter()
    results = await asyncio.gather(*(exchange(i, r, w) for i, (r, w) in enumerate(pairs)),
                                   return_exceptions=True)  # fmt: skip
    exchange_s = time.perf_counter() - began
    errors = sum(isinstance(r, BaseException) for r in results)
    wrong = sum(r for r in results if isinstance(r, int))
    return {"connect_s": connect_s, "tx_per_s": len(pairs) * exchanges / exchange_s,
            "failed": failed + errors, "wrong": wrong, "smcr": modes.count("SMCR"),
            "conns": conns}  # fmt: skip


def free_port() -> int:
    """A port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(smc: bool, *args: str) -> list[str]:
    """This script with ``args``, under ``smcr run`` when ``smc``."""
    mine = [sys.executable, str(Path(__file__).resolve()), *args]
    return [sys.executable, "-m", "smcr", "run", "--", *mine] if smc else mine


def one_round(smc: bool, args: argparse.Namespace) -> dict[str, object]:
    """Server and client (under ``smcr run`` when ``smc``); the client's figures."""
    port = free_port()
    server = subprocess.Popen(command(smc, "--serve", str(port), "--size", str(args.size)),
                              start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + START_WAIT
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start listening")
            time.sleep(0.1)
        out = subprocess.run(command(smc, "--client", str(port), "--conns", str(args.conns),
                                     "--exchanges", str(args.exchanges), "--size",
                                     str(args.size)),
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        figures: dict[str, object] = json.loads(out.strip().splitlines()[-1])
        return figures
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(15)


def spread(values: list[float]) -> str:
    """Median [min..max]."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}..{max(values):.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conns", type=int, default=1000)
    parser.add_argument("--exchanges", type=int, default=20)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args.serve, args.size))
        return 0
    if args.client:
        print(json.dumps(asyncio.run(clients(args.client, args.conns, args.exchanges,
                                             args.size))))  # fmt: skip
        return 0
    runs: dict[str, list[dict[str, object]]] = {"tcp": [], "smc": []}
    for n in range(args.rounds):
        for kind in ("tcp", "smc") if n % 2 == 0 else ("smc", "tcp"):
            runs[kind].append(one_round(kind == "smc", args))
    bad = any(r["failed"] or r["wrong"] for rs in runs.values() for r in rs) or any(
        r["smcr"] != args.conns for r in runs["smc"])  # fmt: skip
    if args.json:
        print(json.dumps(runs, indent=2))
        return 1 if bad else 0
    for kind, rs in runs.items():
        connect = [float(str(r["connect_s"])) for r in rs]
        rate = [float(str(r["tx_per_s"])) for r in rs]
        print(f"{kind}: connect {args.conns} at once {spread(connect)} s, "
              f"{spread(rate)} exchanges/s, SMC-R {[r['smcr'] for r in rs]}, "
              f"failed {sum(int(str(r['failed'])) for r in rs)}, "
              f"wrong {sum(int(str(r['wrong'])) for r in rs)}")
    ratio = [float(str(s["connect_s"])) / float(str(t["connect_s"]))
             for s, t in zip(runs["smc"], runs["tcp"], strict=True)]  # fmt: skip
    rates = [float(str(s["tx_per_s"])) / float(str(t["tx_per_s"]))
             for s, t in zip(runs["smc"], runs["tcp"], strict=True)]  # fmt: skip
    print(f"SMC-R/TCP: connect time {spread(ratio)}x, exchanges/s {spread(rates)}x")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
