"""Redundant links over RoCE: the pause an application sees at a failover, and throughput
with two RNICs against one (issue 13).  Root; two namespaces joined by two veth pairs
(:class:`tests.stack.test_failover_roce.TwoPaths`).

Run: ``python bench/failover_bench.py [--trials 20] [--mib 1024] [--conns 1]
[--cut server|client] [--path 0|1] [--throughput]``.

Per trial: the client streams ``--mib`` MiB in total (over ``--conns`` connections),
the server echoes; at a quarter the veth of ``--path`` is set down on the ``--cut``
side, 1 s later up again.  The peers report the bytes they received every 10 ms, so
the figures have that resolution:

* detection: from ``ip link set down`` returning to both runtimes reporting one link;
* pause: the longest time after the cut in which the server received nothing (from the
  cut to data flowing again, detection included);
* re-add: from ``ip link set up`` returning to both reporting two links again;
* bytes intact (SHA-256 both ways) and no error seen by the application.

``--throughput``: the same transfer without a cut, with ``SMCR_ROCE_DEVS`` naming
both veths and then only the first (one RNIC a side).

This is a measurement, not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.stack import test_failover_roce as t

REPORT = "0.01"


def trial(paths: t.TwoPaths, mib: int, conns: int, cut: int | None, path: int,
          devs: str = "p0,p1") -> dict[str, float | bool]:  # fmt: skip
    size = (mib << 20) // conns
    env = {"SMCR_FAILOVER_REPORT_S": REPORT, "SMCR_ROCE_DEVS": devs}
    srv = t.PeerProc(paths.ns[0], "server", f"{paths.nets[0]}.1", "0", str(conns), str(size),
                     env=env)  # fmt: skip
    cli = None
    try:
        t.until(lambda: srv.ready is not None, 30, "server listening", (srv,))
        cli = t.PeerProc(paths.ns[1], "client", f"{paths.nets[0]}.1", str(srv.ready),
                         str(conns), str(size), env=env)  # fmt: skip
        both = (srv, cli)
        want = 2 if "," in devs else 1
        t.until(lambda: srv.last.get("links") == [want] and cli.last.get("links") == [want],
                60, "group up", both)  # fmt: skip
        start = time.monotonic()
        out: dict[str, float | bool] = {}
        if cut is not None:
            t.until(lambda: srv.last.get("moved", 0) >= (mib << 20) // 4, 600, "quarter", both)
            paths.link(cut, path, up=False)
            down = time.monotonic()
            t.until(lambda: srv.last.get("links") == [1] and cli.last.get("links") == [1], 60,
                    "failover", both)  # fmt: skip
            out["detect"] = time.monotonic() - down
            time.sleep(1.0)
            paths.link(cut, path, up=True)
            up = time.monotonic()
            t.until(lambda: srv.last.get("links") == [2] and cli.last.get("links") == [2], 60,
                    "re-add", both)  # fmt: skip
            out["readd"] = time.monotonic() - up
            out["pause"] = _pause(srv.history, down)
        t.until(lambda: srv.done is not None and cli.done is not None, 900, "done", both)
        out["seconds"] = time.monotonic() - start
        assert srv.done is not None and cli.done is not None
        out["ok"] = (not [r for r in srv.done + cli.done if r[2]]
                     and all(a == b for a, b, _ in cli.done)
                     and sorted(r[0] for r in cli.done) == sorted(r[1] for r in srv.done))
        return out
    finally:
        for p in (cli, srv):
            if p is not None:
                p.close()


def _pause(history: list[tuple[float, int]], down: float) -> float:
    """The longest stretch after ``down`` in which the received count did not grow."""
    last_t, last_m, gap = down, None, 0.0
    for ts, moved in history:
        if last_m is None:
            last_m = moved
            continue
        if moved > last_m:
            if ts >= down:
                gap = max(gap, ts - max(last_t, down))
            last_t, last_m = ts, moved
    return gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--cut", choices=("server", "client"), default="server")
    ap.add_argument("--path", type=int, choices=(0, 1), default=0)
    ap.add_argument("--throughput", action="store_true")
    args = ap.parse_args()
    paths = t.TwoPaths()
    try:
        if args.throughput:
            for devs in ("p0,p1", "p0"):
                rates = []
                for _ in range(args.trials):
                    r = trial(paths, args.mib, args.conns, None, 0, devs)
                    rates.append(2 * args.mib / float(r["seconds"]))
                    print(f"SMCR_ROCE_DEVS={devs}: {args.mib} MiB each way over {args.conns} "
                          f"conn(s) in {r['seconds']:.2f} s ok={r['ok']}", flush=True)
                print(f"  {devs}: median {statistics.median(rates):.0f} MiB/s (both ways "
                      f"summed)", flush=True)
            return
        side = 0 if args.cut == "server" else 1
        results = []
        for i in range(args.trials):
            r = trial(paths, args.mib, args.conns, side, args.path)
            results.append(r)
            print(f"trial {i + 1}: ok={r['ok']} detect={r['detect'] * 1e3:.0f} ms "
                  f"pause={r['pause'] * 1e3:.0f} ms readd={r['readd'] * 1e3:.0f} ms "
                  f"total={r['seconds']:.1f} s", flush=True)
        ok = sum(1 for r in results if r["ok"])
        print(f"{ok}/{len(results)} intact; median detect "
              f"{statistics.median(float(r['detect']) for r in results) * 1e3:.0f} ms, pause "
              f"{statistics.median(float(r['pause']) for r in results) * 1e3:.0f} ms (max "
              f"{max(float(r['pause']) for r in results) * 1e3:.0f}), re-add "
              f"{statistics.median(float(r['readd']) for r in results) * 1e3:.0f} ms")
    finally:
        paths.close()


if __name__ == "__main__":
    main()
