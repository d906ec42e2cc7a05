"""Instructions per sequential connection set-up, in each process, counted by valgrind.

Run: ``python bench/setup_instructions.py [--few 100] [--many 400] [--top 0]``.

The connection set-up's CPU is flat (no function above a few per cent), so a change
that takes a tenth off it hides in the noise of timed runs on a shared 2-CPU machine
(``bench/connect_bench.py`` moves 10-15% from run to run).  Instructions are
counted, not timed: ``valgrind --tool=callgrind`` runs one process (the server, then the
client) while its peer runs natively; the connection (connect, a byte each way, close;
the link group reused, as ``bench/connect_bench.py``) is made ``--few`` and then
``--many`` times, and the difference divided by ``--many - --few`` is one connection's
user-space instructions in that process, every thread included: start-up, imports and
the first contact cancel out.  System calls and the kernel's work are not counted.
Spinning is off in both processes (``SMCR_SPIN_US=0``): a spin's length is time, and
under valgrind time runs some fifty times slower.  Repeated runs of the same build agree
within about one per cent.

``--top N`` adds, per process, the N compiled functions (mypyc's ``CPyDef_*``, the
C extensions') with the most instructions per connection, inclusive of what they call
(recursion and several entry points of one function make some sums overlap: read them
for where, not for totals).

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from announced import server_port  # (beside this file)

SERVER = """
import sys, smcr
n = int(sys.argv[1])
srv = smcr.create_server(("127.0.0.1", 0))
print("ready", srv.getsockname()[1], flush=True)
for _ in range(n + 1):
    c, _ = srv.accept()
    c.sendall(c.recv(1))
    c.recv(1)  # (the client's close)
    c.close()
srv.close()
"""

CLIENT = """
import sys, smcr
port, n = int(sys.argv[1]), int(sys.argv[2])
for _ in range(n + 1):
    c = smcr.create_connection(("127.0.0.1", port))
    c.sendall(b"x")
    assert c.recv(1) == b"x"
    c.close()
"""

_TOTAL = re.compile(r"^\s*([\d,]+)\s+(?:\(100\.0%\)\s+)?PROGRAM TOTALS", re.M)
_LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S+)")


def _count(which: str, n: int, work: Path) -> Path:
    """Run ``n`` (+1 warm-up) connections with ``which`` ("server" or "client") under
    callgrind; the callgrind output file."""
    out = work / f"{which}.{n}.out"
    vg = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "-q"]
    env = {**os.environ, "SMCR_SPIN_US": "0"}
    server_cmd = [sys.executable, str(work / "server.py"), str(n)]
    with server_port((vg if which == "server" else []) + server_cmd, env, 600) as port:
        client_cmd = [sys.executable, str(work / "client.py"), str(port), str(n)]
        subprocess.run((vg if which == "client" else []) + client_cmd, env=env, check=True)
    return out


def _annotate(path: Path, inclusive: bool) -> str:
    return subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100",
                           f"--inclusive={'yes' if inclusive else 'no'}", str(path)],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip


def _total(path: Path) -> int:
    found = _TOTAL.search(_annotate(path, inclusive=False))
    if found is None:
        raise RuntimeError(f"no total in {path}")
    return int(found.group(1).replace(",", ""))


def _functions(path: Path) -> dict[str, int]:
    """Inclusive instructions of the compiled functions, by short name."""
    found: dict[str, int] = {}
    for line in _annotate(path, inclusive=True).splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name = m.group(2).split(":")[-1]
        if name.startswith("CPyDef_") or ("/src/smcr/" in m.group(2) and name.isidentifier()):
            found[name] = found.get(name, 0) + int(m.group(1).replace(",", ""))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--few", type=int, default=100, help="connections of the first run")
    ap.add_argument("--many", type=int, default=400, help="connections of the second run")
    ap.add_argument("--top", type=int, default=0, metavar="N",
                    help="the N compiled functions with most instructions per connection")
    args = ap.parse_args()
    if args.many <= args.few:
        ap.error("--many must be more than --few")
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (Debian: apt-get install valgrind)")
    span = args.many - args.few
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "server.py").write_text(SERVER)
        (work / "client.py").write_text(CLIENT)
        print(f"instructions per connection ({args.many} - {args.few} sequential set-ups, "
              "link group reused, user space only)")  # fmt: skip
        for which in ("server", "client"):
            few, many = _count(which, args.few, work), _count(which, args.many, work)
            per = (_total(many) - _total(few)) / span
            print(f"{which:7s} {per:12,.0f}")
            if args.top:
                a, b = _functions(few), _functions(many)
                rows = sorted(((b[k] - a.get(k, 0)) / span, k) for k in b)
                for value, name in reversed(rows[-args.top:]):
                    print(f"    {value:12,.0f}  {name}")


if __name__ == "__main__":
    main()
