"""``smcr bench --conns N``: what N connections open at once cost, SMC-R against TCP
(issue 29, "thousands of connections").

Each run is one transport in two fresh processes, a client
(:mod:`smcr.tools.connsclient`) and the server it spawns (:mod:`smcr.tools.connsserver`;
in the peer namespace with ``--netns``): a one-thread ``selectors`` echo server, its
listener :func:`smcr.create_server` for SMC-R.  After one connection has warmed both
up, the client opens N connections at once (timed), both processes take their RSS
(``VmRSS``) and descriptors (``/proc/PID/fd``) per connection, one selector drives K
request/response exchanges of 100 bytes on every connection (each response checked
byte for byte: transactions per second), and once every connection has ended both
take their RSS again: the memory that did not come back.

Fresh processes for every run: a process that has had N SMC-R connections keeps their
buffers (the link group and its buffer pool stay), so that a second run in it would
cost next to nothing and the median would not say what N connections cost.  SMC-R and
TCP alternate ``--reps`` times; each figure is the median, every run is kept
(:func:`to_json`).  Every client connection of an SMC-R run must be in SMC-R mode: a
fallback is counted with its reason; exceptions and wrong bytes are counted by kind;
a run that cannot open N connections (``EMFILE``...) says how many it opened and why,
and its figures stay out of the medians.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from smcr.tools.connsclient import ConnsRun, client_main
from smcr.tools.connsserver import MESSAGE, raise_nofile

EXCHANGES = 200
"""Request/response exchanges per connection (``--exchanges``)."""


@dataclass
class ConnsResult:
    """The medians of one figure for both transports."""

    metric: str
    """Its key in the JSON (``connect_s``, ``tx_per_s``, ...: :data:`METRICS`)."""
    label: str
    unit: str
    smc: float
    tcp: float
    smc_runs: list[float] = field(default_factory=list)
    tcp_runs: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """SMC/TCP (0 where TCP's figure is 0)."""
        return self.smc / self.tcp if self.tcp else 0.0


METRICS: list[tuple[str, str, str, Callable[[ConnsRun], float]]] = [
    ("connect_s", "connect, all at once", "s", lambda r: r.connect_s),
    ("connect_ms_per_conn", "connect per connection", "ms",
     lambda r: r.connect_s / r.opened * 1e3 if r.opened else 0.0),
    ("tx_per_s", "transactions", "1/s", lambda r: r.tx_per_s),
    ("rss_kib_per_conn_client", "RSS per connection, client", "KiB",
     lambda r: r.client.rss_kib_per_conn),
    ("rss_kib_per_conn_server", "RSS per connection, server", "KiB",
     lambda r: r.server.rss_kib_per_conn),
    ("rss_kib_per_conn_used_client", "RSS per conn. after exchanges, client", "KiB",
     lambda r: r.client.rss_kib_per_conn_used),
    ("rss_kib_per_conn_used_server", "RSS per conn. after exchanges, server", "KiB",
     lambda r: r.server.rss_kib_per_conn_used),
    ("rss_kib_per_conn_idle_client", "RSS per conn. once idle, client", "KiB",
     lambda r: r.client.rss_kib_per_conn_idle),
    ("rss_kib_per_conn_idle_server", "RSS per conn. once idle, server", "KiB",
     lambda r: r.server.rss_kib_per_conn_idle),
    ("fds_per_conn_client", "descriptors per connection, client", "",
     lambda r: r.client.fds_per_conn),
    ("fds_per_conn_server", "descriptors per connection, server", "",
     lambda r: r.server.fds_per_conn),
    ("cpu_us_per_tx_client", "CPU per transaction, client", "us",
     lambda r: r.client.cpu_us_per_tx),
    ("cpu_us_per_tx_server", "CPU per transaction, server", "us",
     lambda r: r.server.cpu_us_per_tx),
    ("kept_mib_client", "memory kept after close, client", "MiB", lambda r: r.client.kept_mib),
    ("kept_mib_server", "memory kept after close, server", "MiB", lambda r: r.server.kept_mib),
]  # fmt: skip
"""Every figure of a run: (JSON key, table label, unit, how to read it from a run)."""


def _summed(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The counts of every run added up, by key."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(total)


@dataclass
class ConnsReport:
    """Everything one ``--conns`` bench measured."""

    conns: int
    exchanges: int
    reps: int
    results: list[ConnsResult]
    runs: list[ConnsRun]

    @property
    def fallbacks(self) -> dict[str, int]:
        """SMC-R connections that fell back, by reason, over every run."""
        return _summed(r.fallbacks for r in self.runs)

    @property
    def errors(self) -> dict[str, int]:
        """Errors by kind, over every run."""
        return _summed(r.errors for r in self.runs)

    @property
    def failures(self) -> list[str]:
        """Runs that could not open every connection or broke off: ``which: why``."""
        out = []
        counts: Counter[str] = Counter()
        for r in self.runs:
            counts[r.kind] += 1
            if r.failure:
                name = "SMC-R" if r.kind == "smc" else "TCP"
                out.append(f"{name} run {counts[r.kind]}: {r.failure}")
        return out

    @property
    def smcr_connections(self) -> tuple[int, int]:
        """Client connections of the SMC-R runs in SMC-R mode, and of them all."""
        runs = [r for r in self.runs if r.kind == "smc"]
        return sum(r.smcr for r in runs), sum(r.opened for r in runs)

    @property
    def ok(self) -> bool:
        """Every connection opened, SMC-R where asked, every response right."""
        return not (self.fallbacks or self.errors or self.failures)


def summarize(conns: int, exchanges: int, reps: int, runs: list[ConnsRun]) -> ConnsReport:
    """The medians of ``runs`` (the figures of a run that could not open every connection
    stay out of the medians: they are not figures for N)."""
    results = []
    for key, label, unit, get in METRICS:
        values = {kind: [get(r) for r in runs if r.kind == kind] for kind in ("smc", "tcp")}
        medians = {kind: statistics.median([get(r) for r in runs
                                            if r.kind == kind and not r.failure] or [0.0])
                   for kind in ("smc", "tcp")}  # fmt: skip
        results.append(ConnsResult(key, label, unit, medians["smc"], medians["tcp"],
                                   values["smc"], values["tcp"]))  # fmt: skip
    return ConnsReport(conns, exchanges, reps, results, runs)


def one_run(kind: str, conns: int, exchanges: int = EXCHANGES, bufsize: int = 0,
            host: str = "127.0.0.1", peer_netns: str | None = None) -> ConnsRun:  # fmt: skip
    """One run of ``kind`` (``smc``/``tcp``) in a new client process (which starts its
    server); a client that dies gives a run whose ``failure`` says so."""
    ctx = mp.get_context("spawn")
    out, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=client_main,
                       args=(child, kind, conns, exchanges, bufsize, host, peer_netns))
    # (not a daemon: it starts the server; ended below whatever happens)
    proc.start()
    child.close()
    try:
        try:
            return ConnsRun.from_dict(out.recv())
        except EOFError:  # (it died: the pipe's only writer is gone)
            proc.join(5)
            return ConnsRun(kind, conns, failure=f"the client process ended with status "
                            f"{proc.exitcode} before it reported")  # fmt: skip
    finally:
        out.close()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def run(conns: int, reps: int, exchanges: int = EXCHANGES, bufsize: int = 0,
        progress: Callable[[str], None] | None = None, host: str = "127.0.0.1",
        peer_netns: str | None = None) -> ConnsReport:  # fmt: skip
    """Measure ``reps`` runs of each transport, SMC-R and TCP alternating;
    ``progress(label)`` is called before each run."""
    raise_nofile()
    runs: list[ConnsRun] = []
    for rep in range(reps):
        for kind in ("smc", "tcp"):
            if progress:
                progress(f"{conns} connections {kind} #{rep + 1}")
            runs.append(one_run(kind, conns, exchanges, bufsize, host, peer_netns))
    return summarize(conns, exchanges, reps, runs)


def to_json(report: ConnsReport, conditions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report as JSON data (``smcr bench --conns N --json``; README)."""
    smcr, opened = report.smcr_connections
    return {
        "test": "conns", "conns": report.conns, "exchanges": report.exchanges,
        "message_size": MESSAGE, "reps": report.reps, **(conditions or {}),
        "results": [{**asdict(r), "ratio": r.ratio} for r in report.results],
        "runs": [{**asdict(r), "error_count": r.error_count} for r in report.runs],
        "smcr_connections": smcr, "smc_run_connections": opened,
        "fallbacks": report.fallbacks, "errors": report.errors,
        "failures": report.failures, "ok": report.ok,
    }  # fmt: skip


__all__ = ["EXCHANGES", "MESSAGE", "METRICS", "ConnsReport", "ConnsResult", "ConnsRun", "one_run",
           "run", "summarize", "to_json"]
