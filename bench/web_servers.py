"""gunicorn and uvicorn under ``smcr run``, both ends, against the same servers plainly:
requests per second and latency of 64 KiB responses, every body checked.

Run: ``python bench/web_servers.py [--servers gunicorn,uvicorn] [--modes keepalive,new]
[--threads 8] [--seconds 3] [--reps 3] [--size 65536] [--json]``.  Needs gunicorn and
uvicorn (the ``test`` extra pins them: ``pip install -e '.[test]'``).

What runs: each server (gunicorn with 3 sync workers, uvicorn with one) is started
twice, plainly and under ``smcr run``, serving :mod:`webapp`.  A client process (plainly,
or under ``smcr run`` for the SMC-R figures) runs ``--threads`` threads of
``http.client`` for ``--seconds`` after a short warm-up; each request's body is compared
with the one expected.  ``keepalive`` keeps a connection per thread for as long as the
server does (gunicorn's sync workers close after every response, so a thread reconnects
then); ``new`` opens a connection per request.  Plain and SMC-R runs alternate, round by
round, so that a load that comes and goes falls on both; the figures are medians of
``--reps`` rounds with [min..max].

The smcr processes count into a diagnostics directory of their own
(``SMCR_DIAG_DIR``): the SMC-R column says how many of the client's connections were
SMC-R (``smcr stats``), and how many fell back.  Exit status 1 when a request failed, a
body was wrong, or a connection fell back to TCP; 2 for bad arguments.

This is a measurement, not a test (``tests/run/test_web_servers.py`` checks the same
servers' correctness under ``smcr run``).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from webapp import body  # noqa: E402  (beside this file)

WARM_UP = 0.5
"""Seconds of requests before the timed ones (the first connection makes the link group)."""
START_WAIT = 60.0
"""Seconds a server has to start listening."""


def server_command(name: str, port: int) -> list[str]:
    """The command that starts server ``name`` on ``port`` serving :mod:`webapp`."""
    if name == "gunicorn":
        return [sys.executable, "-m", "gunicorn", "-w", "3", "-k", "sync",
                "-b", f"127.0.0.1:{port}", "--chdir", str(BENCH_DIR), "--log-level", "warning",
                "webapp:wsgi"]  # fmt: skip
    if name == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "--app-dir", str(BENCH_DIR), "--host",
                "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
                "webapp:asgi"]  # fmt: skip
    raise ValueError(f"unknown server {name!r} (gunicorn, uvicorn)")


def under_smcr(command: list[str], smc: bool) -> list[str]:
    """``command``, under ``smcr run`` when ``smc``."""
    return [sys.executable, "-m", "smcr", "run", "--", *command] if smc else command


@dataclass
class Figures:
    """One client run."""

    requests: int = 0
    seconds: float = 0.0
    errors: int = 0
    """Requests that raised (a reset, a timeout, a malformed response)."""
    bad_bodies: int = 0
    """Responses whose status or body was not the one expected."""
    connections: int = 0
    """Connections the client opened (warm-up included)."""
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Requests per second."""
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        """The ``q`` quantile of the request latencies, ms."""
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def client(port: int, mode: str, threads: int, seconds: float, size: int) -> Figures:
    """The client's work (in the client process): ``threads`` threads of requests."""
    expected = body(size)
    lock = threading.Lock()
    figures = Figures()
    start = time.monotonic()
    timed_from = start + WARM_UP
    until = timed_from + seconds

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        mine: list[float] = []
        done = errors = bad = opened = 0
        while time.monotonic() < until:
            now = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    opened += 1
                conn.request("GET", "/")
                response = conn.getresponse()
                data = response.read()
                took = (time.perf_counter() - now) * 1e3
                if response.status != 200 or data != expected:
                    bad += 1
                if mode == "new" or response.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                errors += 1
                if conn is not None:
                    conn.close()
                conn = None
                continue
            if time.monotonic() >= timed_from:
                done += 1
                mine.append(took)
        if conn is not None:
            conn.close()
        with lock:
            figures.requests += done
            figures.errors += errors
            figures.bad_bodies += bad
            figures.connections += opened
            figures.latencies_ms.extend(mine)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    figures.seconds = time.monotonic() - timed_from
    return figures


def free_port() -> int:
    """A port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until a connect to ``port`` succeeds (the server is up), or fail with its log."""
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server ended ({proc.returncode}): {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the server did not listen within {START_WAIT} s: "
                       f"{log.read_text()[-2000:]}")  # fmt: skip


@contextlib.contextmanager
def serving(name: str, smc: bool, env: dict[str, str], workdir: Path) -> Iterator[int]:
    """Server ``name`` running (under ``smcr run`` when ``smc``); yields its port."""
    port = free_port()
    log = workdir / f"{name}-{'smc' if smc else 'plain'}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(under_smcr(server_command(name, port), smc), env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_listening(port, proc, log)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_client(port: int, mode: str, smc: bool, args: argparse.Namespace,
               env: dict[str, str]) -> Figures:  # fmt: skip
    """One client run in a process of its own (under ``smcr run`` when ``smc``)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--client", str(port), mode,
               str(args.threads), str(args.seconds), str(args.size)]  # fmt: skip
    res = subprocess.run(under_smcr(command, smc), env=env, capture_output=True, text=True,
                         timeout=args.seconds + 300, check=False)  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"the client failed ({res.returncode}): {res.stderr[-2000:]}")
    return Figures(**json.loads(res.stdout.strip().splitlines()[-1]))


def smc_counts(env: dict[str, str]) -> tuple[int, int]:
    """(SMC-R client connections, client fallbacks) that ``smcr stats`` counts in ``env``'s
    diagnostics directory."""
    res = subprocess.run([sys.executable, "-m", "smcr", "stats", "json"], env=env,
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    counts = json.loads(res.stdout)["SMCR"]
    return (int(counts["clnt_v1_succ_cnt"]) + int(counts["clnt_v2_succ_cnt"]),
            int(counts["clnt_fback_cnt"]))  # fmt: skip


@dataclass
class Result:
    """One server and mode: every round of both transports."""

    server: str
    mode: str
    plain: list[Figures] = field(default_factory=list)
    smc: list[Figures] = field(default_factory=list)
    smc_connections: int = 0
    smc_fallbacks: int = 0


def measure(args: argparse.Namespace) -> list[Result]:
    """Every server and mode, plain and SMC-R alternating, ``args.reps`` rounds."""
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="smcr-web-") as tmp:
        workdir = Path(tmp)
        base = dict(os.environ, WEBAPP_BODY=str(args.size))
        for server in args.servers:
            for mode in args.modes:
                # a diagnostics directory per server and mode: its counts are this run's
                smc_env = dict(base, SMCR_DIAG_DIR=str(workdir / f"diag-{server}-{mode}"))
                result = Result(server, mode)
                with serving(server, False, base, workdir) as plain_port, \
                        serving(server, True, smc_env, workdir) as smc_port:  # fmt: skip
                    for _ in range(args.reps):
                        result.plain.append(run_client(plain_port, mode, False, args, base))
                        result.smc.append(run_client(smc_port, mode, True, args, smc_env))
                result.smc_connections, result.smc_fallbacks = smc_counts(smc_env)
                results.append(result)
    return results


def spread(values: list[float]) -> str:
    """``median [min..max]``."""
    return f"{statistics.median(values):8.1f} [{min(values):.1f}..{max(values):.1f}]"


def failures(result: Result) -> list[str]:
    """What went wrong in ``result`` (empty: nothing)."""
    out = []
    for name, runs in (("plain", result.plain), ("smcr", result.smc)):
        errors = sum(f.errors for f in runs)
        bad = sum(f.bad_bodies for f in runs)
        if errors or bad:
            out.append(f"{name}: {errors} failed requests, {bad} wrong responses")
    opened = sum(f.connections for f in result.smc)
    if result.smc_fallbacks or result.smc_connections < opened:
        out.append(f"smcr: {result.smc_connections} of {opened} client connections SMC-R, "
                   f"{result.smc_fallbacks} fell back")  # fmt: skip
    return out


def report(results: list[Result]) -> None:
    """The table."""
    print(f"{'server':9} {'mode':9} {'plain req/s':>24} {'smcr req/s':>24} {'ratio':>6} "
          f"{'p99 ms plain/smcr':>18} {'max ms plain/smcr':>18} {'SMC-R conns':>12}")  # fmt: skip
    for r in results:
        ratio = statistics.median(s.rate / p.rate if p.rate else 0.0
                                  for p, s in zip(r.plain, r.smc, strict=True))  # fmt: skip
        opened = sum(f.connections for f in r.smc)
        print(f"{r.server:9} {r.mode:9} {spread([f.rate for f in r.plain]):>24} "
              f"{spread([f.rate for f in r.smc]):>24} {ratio:6.2f} "
              f"{statistics.median(f.percentile(0.99) for f in r.plain):8.1f} / "
              f"{statistics.median(f.percentile(0.99) for f in r.smc):<7.1f} "
              f"{max(f.percentile(1.0) for f in r.plain):8.1f} / "
              f"{max(f.percentile(1.0) for f in r.smc):<7.1f} "
              f"{r.smc_connections:>5}/{opened:<6}")  # fmt: skip
        for problem in failures(r):
            print(f"  ! {problem}")


def summary(result: Result) -> dict[str, object]:
    """``result`` for ``--json``: each run's figures, with latency quantiles instead of every
    latency."""
    def run(f: Figures) -> dict[str, object]:
        out = asdict(f)
        del out["latencies_ms"]
        out.update(rate=f.rate, p50_ms=f.percentile(0.5), p99_ms=f.percentile(0.99))
        return out

    return {"server": result.server, "mode": result.mode,
            "plain": [run(f) for f in result.plain], "smcr": [run(f) for f in result.smc],
            "smc_connections": result.smc_connections, "smc_fallbacks": result.smc_fallbacks,
            "problems": failures(result)}  # fmt: skip


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        port, mode, threads, seconds, size = sys.argv[2:7]
        figures = client(int(port), mode, int(threads), float(seconds), int(size))
        print(json.dumps(asdict(figures)))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="gunicorn,uvicorn", help="gunicorn, uvicorn or both")
    ap.add_argument("--modes", default="keepalive,new", help="keepalive, new or both")
    ap.add_argument("--threads", type=int, default=8, help="client threads")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per run")
    ap.add_argument("--reps", type=int, default=3, help="rounds (median)")
    ap.add_argument("--size", type=int, default=65536, help="response body bytes")
    ap.add_argument("--json", action="store_true", help="machine-readable results")
    args = ap.parse_args()
    args.servers = [s for s in args.servers.split(",") if s]
    args.modes = [m for m in args.modes.split(",") if m]
    bad = ([s for s in args.servers if s not in ("gunicorn", "uvicorn")]
           + [m for m in args.modes if m not in ("keepalive", "new")])  # fmt: skip
    if bad or args.threads < 1 or args.seconds <= 0 or args.reps < 1 or args.size < 0:
        ap.error(f"bad arguments: {', '.join(bad) or 'threads, seconds, reps or size'}")
    for module in args.servers:
        try:
            __import__(module)
        except ImportError:
            ap.error(f"{module} is not installed (pip install -e '.[test]' installs it)")
    results = measure(args)
    if args.json:
        print(json.dumps([summary(r) for r in results]))
    else:
        report(results)
    sys.exit(1 if any(failures(r) for r in results) else 0)


if __name__ == "__main__":
    main()
