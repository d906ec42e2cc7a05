"""Hosts in different subnets joined by routers: namespaces in a line, veth pairs between.

:class:`Routed` builds ``client | router ... | server``: namespace 0 the client,
the last the server, each in between a router with ``ip_forward`` (and IPv6
forwarding) on; with no router, two hosts on one subnet.  Link ``k`` joins
namespace ``k`` and ``k + 1`` in its own subnet, ``10.<b>.<k>.0/24`` and
``fd<b>:<k>::/64``.  The end hosts route everything through their router (a
default route: a load balancer's virtual address behind it too), each router
routes to every subnet it is not on.  Everything is removed on close (deleting a
namespace removes its veths and nftables tables).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.roce.netns import REPO, sh

_COUNTER = itertools.count()


class Routed:
    """A line of namespaces: the client, ``routers`` routers, the server.

    :param routers: how many routers between the client and the server (1 or more).
    """

    def __init__(self, routers: int = 1) -> None:
        n = next(_COUNTER)
        tag = f"smcrt{os.getpid() % 100000}x{n}"
        count = routers + 2
        self.ns = tuple(f"{tag}{i}" for i in range(count))
        b = self.base = 80 + (os.getpid() + n) % 100
        self.links = count - 1
        #: per link k: (IPv4 of the left end, of the right end), the same for IPv6
        self.v4 = [(f"10.{b}.{k}.1", f"10.{b}.{k}.2") for k in range(self.links)]
        self.v6 = [(f"fd{b:x}:{k}::1", f"fd{b:x}:{k}::2") for k in range(self.links)]
        self.started: list[subprocess.Popen[str]] = []
        """The processes :meth:`popen` started, for :meth:`reap`."""
        try:
            self._build(tag)
        except BaseException:
            self.close()
            raise

    def _build(self, tag: str) -> None:
        for i, ns in enumerate(self.ns):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # no duplicate address detection, for the link-local addresses too: while
            # tentative, neighbour discovery waits, and the first connection with it
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
            if 0 < i < len(self.ns) - 1:  # (before the veths: they start as a router's)
                sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
                sh("ip", "netns", "exec", ns, "sysctl", "-qw",
                   "net.ipv6.conf.all.forwarding=1")
        for k in range(self.links):
            left, right = self.ns[k], self.ns[k + 1]
            sh("ip", "link", "add", f"{tag}l{k}", "netns", left, "type", "veth",
               "peer", "name", f"{tag}r{k}", "netns", right)  # fmt: skip
            for ns, dev, i in ((left, f"{tag}l{k}", 0), (right, f"{tag}r{k}", 1)):
                name = f"right{k}" if i == 0 else f"left{k}"
                sh("ip", "-n", ns, "link", "set", dev, "name", name)
                sh("ip", "-n", ns, "addr", "add", f"{self.v4[k][i]}/24", "dev", name)
                sh("ip", "-n", ns, "addr", "add", f"{self.v6[k][i]}/64", "dev", name, "nodad")
                sh("ip", "-n", ns, "link", "set", name, "up")
        last = len(self.ns) - 1
        for i, ns in enumerate(self.ns):
            if i in (0, last) and last > 1:  # an end host: everything through its router
                k = 0 if i == 0 else last - 1
                via4, via6 = self.v4[k][i == 0], self.v6[k][i == 0]
                sh("ip", "-n", ns, "route", "add", "default", "via", via4)
                sh("ip", "-n", ns, "-6", "route", "add", "default", "via", via6)
                continue
            for k in range(self.links):
                if k in (i - 1, i):
                    continue  # on-link
                # towards link k: through the neighbour on that side
                via4, via6 = ((self.v4[i][1], self.v6[i][1]) if k > i
                              else (self.v4[i - 1][0], self.v6[i - 1][0]))  # fmt: skip
                net4, net6 = self.v4[k][0].rsplit(".", 1)[0], self.v6[k][0].rsplit(":", 1)[0]
                sh("ip", "-n", ns, "route", "add", f"{net4}.0/24", "via", via4)
                sh("ip", "-n", ns, "-6", "route", "add", f"{net6}:/64", "via", via6)

        self._wait_up()

    def _wait_up(self) -> None:
        """Wait (bounded) until every veth's operstate is UP.  Why: the kernel's linkwatch
        reports a new veth's carrier up to a second late, and until then IPv6 drops
        what it would send there (the first connection then waits a neighbour
        solicitation's retransmission, 1 s)."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            states = [link.get("operstate") for ns in self.ns
                      for link in json.loads(sh("ip", "-n", ns, "-j", "link").stdout)
                      if link.get("ifname") != "lo"]  # fmt: skip
            if all(state == "UP" for state in states):
                return
            time.sleep(0.02)
        raise RuntimeError(f"veths not up in time: {states}")

    @property
    def client_ns(self) -> str:
        return self.ns[0]

    @property
    def server_ns(self) -> str:
        return self.ns[-1]

    def address(self, host: int, family: int = 4) -> str:
        """The address of the client (``host`` 0) or the server (-1) on its one link."""
        pairs = self.v4 if family == 4 else self.v6
        return pairs[0][0] if host == 0 else pairs[-1][1]

    def exec(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside namespace ``ns``."""
        return sh("ip", "netns", "exec", ns, *args, check=check)

    def popen(self, ns: str, *args: str, env: dict[str, str] | None = None,
              ) -> subprocess.Popen[str]:  # fmt: skip
        """Start ``python -m ARGS`` inside namespace ``ns`` (stdout a pipe, text), with this
        checkout's sources (not what the venv installed)."""
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", *args],
                                stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
                                cwd=Path(REPO), env=_environment(env))  # fmt: skip
        self.started.append(proc)
        return proc

    def reap(self) -> None:
        """Kill the processes :meth:`popen` started that still run (a test that failed
        midway), and forget them all."""
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        self.started.clear()

    def python(self, ns: str, code: str) -> str:
        """Run ``python -c CODE`` inside namespace ``ns`` (bounded) with this checkout's
        sources; its output."""
        res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=30, cwd=Path(REPO),
                             env=_environment(None), check=False)  # fmt: skip
        if res.returncode:
            raise RuntimeError(f"python in {ns}: {res.stderr.strip()}")
        return res.stdout

    def close(self) -> None:
        """Delete every namespace (and with them the veths and nftables tables)."""
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)

    def __enter__(self) -> Routed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rows(output: str) -> list[dict[str, Any]]:
    """The JSON rows a peer printed, one per line."""
    return [json.loads(line) for line in output.splitlines()]


def _environment(extra: dict[str, str] | None) -> dict[str, str]:
    """This process's environment with ``extra``, and PYTHONPATH on this checkout."""
    env = dict(os.environ) | (extra or {})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    return env
