"""Two hosts on one machine: network namespaces joined by a veth pair, and peers in them.

:class:`Hosts` creates ``smcr<pid>a`` and ``smcr<pid>b`` with a veth pair
(10.77.<n>.1/24 and .2/24, fd77:<n>::1/64 and ::2/64), and removes them
(which removes the veth and any nftables rules inside) when done.  :class:`PeerProc` runs
``tests.roce.roce_peer`` inside a namespace and talks to it over a pipe, with a
bounded wait on every answer.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
_COUNTER = itertools.count()


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command (bounded), raising with its stderr on failure."""
    res = subprocess.run(args, check=False, capture_output=True, text=True, timeout=30)
    if check and res.returncode:
        raise RuntimeError(f"{' '.join(args)}: {res.stderr.strip()}")
    return res


class Hosts:
    """Two network namespaces with a veth pair between them.

    :param mtu: the veth MTU (9000 for the benchmark; path MTU 4096 then).
    """

    def __init__(self, mtu: int = 1500) -> None:
        n = next(_COUNTER)
        tag = f"smcr{os.getpid() % 100000}x{n}"
        self.ns = (f"{tag}a", f"{tag}b")
        self.ifs = ("veth0", "veth1")
        subnet = 10 + (os.getpid() + n) % 240
        self.addr = (f"10.77.{subnet}.1", f"10.77.{subnet}.2")
        self.addr6 = (f"fd77:{subnet:x}::1", f"fd77:{subnet:x}::2")
        try:
            for ns in self.ns:
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "link", "add", f"{tag}v0", "netns", self.ns[0], "type", "veth",
               "peer", "name", f"{tag}v1", "netns", self.ns[1])
            for i in (0, 1):
                ns, dev = self.ns[i], f"{tag}v{i}"
                sh("ip", "-n", ns, "link", "set", dev, "name", self.ifs[i])
                sh("ip", "-n", ns, "link", "set", self.ifs[i], "mtu", str(mtu))
                sh("ip", "-n", ns, "addr", "add", f"{self.addr[i]}/24", "dev", self.ifs[i])
                sh("ip", "-n", ns, "addr", "add", f"{self.addr6[i]}/64", "dev", self.ifs[i],
                   "nodad")
                sh("ip", "-n", ns, "link", "set", self.ifs[i], "up")
        except BaseException:
            self.close()
            raise

    def exec(self, i: int, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside host ``i``."""
        return sh("ip", "netns", "exec", self.ns[i], *args, check=check)

    def drop_percent(self, i: int, percent: int) -> None:
        """Drop ``percent``% of RoCE packets arriving at host ``i`` (nftables numgen)."""
        rules = (
            "table inet smcrloss {\n chain input {\n"
            "  type filter hook input priority 0; policy accept;\n"
            f"  udp dport 4791 numgen random mod 100 < {percent} drop\n"
            " }\n}\n"
        )
        subprocess.run(["ip", "netns", "exec", self.ns[i], "nft", "-f", "-"], input=rules,
                       text=True, check=True, timeout=30)

    def link(self, i: int, up: bool) -> None:
        """Take host ``i``'s veth end down or up."""
        self.exec(i, "ip", "link", "set", self.ifs[i], "up" if up else "down")

    def close(self) -> None:
        """Delete both namespaces (and with them the veth pair and nftables tables)."""
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PeerProc:
    """A ``roce_peer`` process inside a namespace, driven by JSON lines."""

    def __init__(self, hosts: Hosts, i: int, address: str | None = None) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", hosts.ns[i], sys.executable, "-m", "tests.roce.roce_peer",
             address or hosts.addr[i]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        )  # fmt: skip
        assert self._answer(20.0) == "ready"
        self.info: dict[str, Any] = self.ask("info")

    def _answer(self, timeout: float) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "peer did not answer in time"
        line = self.proc.stdout.readline()
        assert line, f"peer exited (rc={self.proc.poll()})"
        return json.loads(line)

    def ask(self, cmd: str, **args: Any) -> Any:
        """Send one command and wait (bounded) for its answer.

        The wait is 30 s, or 10 s more than a ``timeout`` the command itself takes.
        """
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([cmd, args]) + "\n")
        self.proc.stdin.flush()
        answer = self._answer(max(30.0, args.get("timeout", 0.0) + 10.0))
        if isinstance(answer, dict) and "error" in answer:
            raise AssertionError(f"peer failed on {cmd}: {answer['error']}")
        return answer

    def close(self) -> None:
        """Close the peer (killing it if it does not exit in time)."""
        with contextlib.suppress(Exception):
            if self.proc.poll() is None:
                self.ask("close")
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


def connect(a: PeerProc, b: PeerProc, **options: Any) -> None:
    """Bring both QPs to RTS with each other's GID/QPN/PSN (what CLC exchanges)."""
    mtu = min(a.info["mtu"], b.info["mtu"])
    options = {"path_mtu": mtu} | options
    assert a.ask("connect", remote=b.info, options=options) == "up"
    assert b.ask("connect", remote=a.info, options=options) == "up"


def wait_until(predicate: Any, timeout: float) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False
