"""Spawned peer processes for the socket tests, with bounded waits, over either RNIC.

The ``rnic`` fixture is ``"shm"`` unless a test parametrizes it (:data:`RNICS`).
For ``"roce-lo"`` both ends use the RoCE RNIC over loopback (each process its
own 127/8 address, :mod:`smcr.stack.devices`).  For ``"roce"`` the test runs
as two hosts: network namespaces joined by a veth pair
(``tests.roce.netns.Hosts``, one pair per module).  The test process's main
thread, the client, enters host A for the test; peers (servers) start there and
move to host B; ``SMCR_RNIC=roce`` and the server address reach them through
the environment.  At the end the client's runtimes are closed and the thread
goes back to its own namespace.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import smcr
from smcr.stack.runtime import close_stacks
from smcr.tools.netns import enter_netns
from tests.socket import smc_peer
from tests.support import port_4791_free

CTX = mp.get_context("spawn")


def rnics(*, roce_slow: bool = False,
          kinds: tuple[str, ...] = ("shm", "roce-lo", "roce")) -> pytest.MarkDecorator:  # fmt: skip
    """Parametrize ``rnic`` over the three set-ups (:data:`RNICS`), or some of them.

    :param roce_slow: the RoCE runs only in the slow suite (a test whose shm run is
        fast enough for every run but whose RoCE runs cost seconds and add little).
    :param kinds: the set-ups to run over.
    """
    slow = [pytest.mark.slow] if roce_slow else []
    return pytest.mark.parametrize("rnic", [p for p in [
        pytest.param("shm"),
        pytest.param("roce-lo", marks=[
            *slow,
            pytest.mark.skipif(not port_4791_free(), reason="UDP port 4791 is taken"),
        ]),
        pytest.param("roce", marks=[
            *slow,
            pytest.mark.root,
            pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                               reason="needs root and iproute2 (network namespaces)"),
        ]),
    ] if p.values[0] in kinds])  # fmt: skip


RNICS = rnics()
"""Run a test over the shm RNIC, the RoCE RNIC over loopback (one host, no privileges),
and the RoCE RNIC between two namespaces (root)."""


class Peer:
    """A peer process and its control pipe."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self.ctl, child = CTX.Pipe()
        self.proc = CTX.Process(target=target, args=(child, *args), daemon=True)
        self.proc.start()

    def recv(self, timeout: float = 20.0) -> Any:
        assert self.ctl.poll(timeout), "peer process did not answer in time"
        return self.ctl.recv()

    def stop(self) -> None:
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


@pytest.fixture
def rnic() -> str:
    """The RNIC kind of a test that does not parametrize it."""
    return "shm"


@pytest.fixture(scope="module")
def roce_hosts() -> Iterator[Any]:
    """Two namespaces with a veth pair, shared by a module's RoCE tests."""
    from tests.roce.netns import Hosts  # noqa: PLC0415 - only RoCE runs need it

    with Hosts() as hosts:
        yield hosts


@pytest.fixture
def fabric(rnic: str, request: pytest.FixtureRequest,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[str | None]:  # fmt: skip
    """Set the test up for its RNIC; yields the server's namespace (None over shm)."""
    monkeypatch.delenv(smc_peer.HOST_ENV, raising=False)
    monkeypatch.delenv(smc_peer.HOST6_ENV, raising=False)
    if rnic == "shm":
        monkeypatch.delenv("SMCR_RNIC", raising=False)
        yield None
        return
    monkeypatch.setenv("SMCR_RNIC", "roce")
    if rnic == "roce-lo":
        yield None
        close_stacks()
        return
    hosts = request.getfixturevalue("roce_hosts")
    monkeypatch.setenv(smc_peer.HOST_ENV, hosts.addr[1])
    monkeypatch.setenv(smc_peer.HOST6_ENV, hosts.addr6[1])
    home = os.open(f"/proc/self/task/{os.getpid()}/ns/net", os.O_RDONLY)
    try:
        enter_netns(hosts.ns[0])
        try:
            yield hosts.ns[1]
        finally:
            close_stacks()
            enter_netns(fd=home)
    finally:
        os.close(home)


@pytest.fixture
def peer(fabric: str | None) -> Iterator[Callable[..., Peer]]:
    made: list[Peer] = []

    def start(target: Callable[..., None], *args: Any) -> Peer:
        p = Peer(target, *args) if fabric is None else Peer(smc_peer.in_netns, fabric, target,
                                                             *args)  # fmt: skip
        made.append(p)
        return p

    yield start
    for p in made:
        p.stop()


@pytest.fixture
def server() -> Iterator[smcr.SMCSocket]:
    """A listening SMC socket of this process (its accepted ends are this process's too)."""
    srv = smcr.create_server(("127.0.0.1", 0))
    srv.settimeout(20)
    yield srv
    srv.close()
