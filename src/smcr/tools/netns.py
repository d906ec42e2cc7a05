"""Two hosts on one machine for ``smcr bench --netns``: namespaces joined by a veth pair.

Why here and not only in the tests: the benchmark goal of issue 5 is measured
between two namespaces over a veth pair (MTU 9000, path MTU 4096), beside TCP
over the same pair, and a user should be able to repeat it with one command.
Root only; everything made is removed on close (deleting a namespace removes
its veth end, and with it the pair).  Threads move with :func:`enter_netns`
(libc ``setns``: Python 3.11 has no ``os.setns``); sockets keep the namespace
they were made in.
"""

from __future__ import annotations

import ctypes
import os
import subprocess

CLONE_NEWNET = 0x40000000


def enter_netns(name: str | None = None, fd: int | None = None) -> None:
    """Move the calling thread into a named namespace (or the one ``fd`` refers to)."""
    own = fd is None
    if fd is None:
        fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), name)
    finally:
        if own:
            os.close(fd)


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if res.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")


class VethPair:
    """Namespaces ``smcrb<pid>a``/``b`` with ``veth0``/``veth1``, 10.78.<n>.1/.2 /24.

    :param mtu: the veth MTU (9000: path MTU 4096 for the RoCE RNIC).
    """

    def __init__(self, mtu: int = 9000) -> None:
        tag = f"smcrb{os.getpid() % 100000}"
        self.ns = (f"{tag}a", f"{tag}b")
        n = 10 + os.getpid() % 240
        self.addr = (f"10.78.{n}.1", f"10.78.{n}.2")
        try:
            for ns in self.ns:
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", f"{tag}v0", "netns", self.ns[0], "type", "veth", "peer", "name",
                f"{tag}v1", "netns", self.ns[1])  # fmt: skip
            for i in (0, 1):
                ns, dev = self.ns[i], f"veth{i}"
                _ip("-n", ns, "link", "set", f"{tag}v{i}", "name", dev)
                _ip("-n", ns, "link", "set", dev, "mtu", str(mtu))
                _ip("-n", ns, "addr", "add", f"{self.addr[i]}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Delete both namespaces (and so the veth pair)."""
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30,
                           check=False)  # fmt: skip

    def __enter__(self) -> VethPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
