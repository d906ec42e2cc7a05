"""SMC-R between processes of different users and containers on one host (issue 25).

Each end is a real process with a real uid (``setpriv``), a container a mount
namespace with its own tmpfs on ``/run``, ``/dev/shm`` and ``/tmp`` (``unshare -m``),
and, for the case the shm RNIC cannot serve, a network namespace of its own too:
there the connection must fall back at once with a named code and ``smcr chk``'s
advice must name the way out.  Discovery is by policy (``SMCR_PEERS``), so the
tests need no BPF.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest

from smcr.tools.chk import SHM_OTHER_HOST, SHM_UNREACHABLE, fix
from smcr.tools.netns import VethPair
from tests.support import REPO_ROOT

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("unshare") is None,
    reason="needs root, setpriv and unshare (util-linux)",
)

SIZE = 256 * 1024
SERVER = ("import sys, smcr; srv = smcr.create_server((sys.argv[1], 0));"
          "print(srv.getsockname()[1], flush=True); c, _ = srv.accept(); got = bytearray()\n"
          f"while len(got) < {SIZE} and (d := c.recv(65536)): got += d\n"
          "c.sendall(got); i = c.smc_info(); print(i.mode, hex(i.local_code), flush=True)")
CLIENT = ("import os, sys, smcr; c = smcr.create_connection((sys.argv[1], int(sys.argv[2])),"
          f" timeout=20); data = os.urandom({SIZE}); c.sendall(data); got = bytearray()\n"
          "while len(got) < len(data) and (d := c.recv(65536)): got += d\n"
          "i = c.smc_info(); print(os.getuid(), i.mode, hex(i.local_code), hex(i.peer_code),"
          " got == data)")
CONTAINER = ("mount -t tmpfs none /run && mount -t tmpfs none /dev/shm && "
             'mount -t tmpfs none /tmp && exec "$0" "$@"')


def as_user(uid: int) -> list[str]:
    """A command prefix that runs as ``uid`` with no supplementary groups."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def container() -> list[str]:
    """A command prefix for a private /run, /dev/shm and /tmp (a container's mounts)."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", CONTAINER]


def pair(server: Sequence[str], client: Sequence[str], host: str = "127.0.0.1",
         peers: str = "127.0.0.1/32") -> tuple[list[str], list[str], float]:  # fmt: skip
    """Run the echo server and the client under the given prefixes.

    :returns: the server's and the client's last lines, and the client's time.
    """
    env = {"PYTHONPATH": str(REPO_ROOT / "src"), "PATH": "/usr/bin:/bin", "SMCR_DIAG": "0",
           "SMCR_DISCOVERY": "policy", "SMCR_PEERS": peers, "SMCR_RNIC": "shm"}  # fmt: skip
    for name in ("SMCR_PURE_PYTHON", "SMCR_NATIVE_DIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    python = os.path.realpath(sys.executable)
    srv = subprocess.Popen([*server, python, "-c", SERVER, host], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env, cwd="/")  # fmt: skip
    try:
        assert srv.stdout is not None
        port = srv.stdout.readline().strip()
        assert port.isdigit(), srv.communicate(timeout=30)
        start = time.monotonic()
        cli = subprocess.run([*client, python, "-c", CLIENT, host, port], capture_output=True,
                             text=True, env=env, timeout=60, check=False, cwd="/")  # fmt: skip
        took = time.monotonic() - start
        out, err = srv.communicate(timeout=30)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0, err
    return out.split(), cli.stdout.split(), took


def test_root_server_and_a_nobody_client() -> None:
    """Root's server, user nobody's client (different rendezvous directories): SMC-R."""
    server, client, _ = pair([], as_user(65534))
    assert client == ["65534", "SMCR", "0x0", "0x0", "True"]
    assert server == ["SMCR", "0x0"]


def test_two_unprivileged_users() -> None:
    """Users nobody and 65533, neither root: SMC-R both ways, the data intact."""
    server, client, _ = pair(as_user(65533), as_user(65534))
    assert client == ["65534", "SMCR", "0x0", "0x0", "True"]
    assert server == ["SMCR", "0x0"]


def test_a_container_with_private_run_and_shm_and_its_peer_on_the_host() -> None:
    """A container (own /run, /dev/shm, /tmp) on the host's network, as nobody, and root's
    server on the host: SMC-R (they meet by the abstract socket)."""
    server, client, _ = pair([], [*container(), *as_user(65534)])
    assert client == ["65534", "SMCR", "0x0", "0x0", "True"]
    assert server == ["SMCR", "0x0"]


def test_two_containers() -> None:
    """Two containers of two users, each with its own /run, /dev/shm and /tmp: SMC-R."""
    server, client, _ = pair([*container(), *as_user(65533)], [*container(), *as_user(65534)])
    assert client == ["65534", "SMCR", "0x0", "0x0", "True"]
    assert server == ["SMCR", "0x0"]


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 missing")
def test_a_container_with_its_own_network_declines_at_once_with_the_fix() -> None:
    """Its own network namespace (and /run): the shm RNIC's same-host check by address
    declines at once (``DIFFPREFIX``), the data intact over TCP, and ``smcr chk`` says
    why and what to do."""
    veth = VethPair(mtu=1500)
    try:
        netns = [["ip", "netns", "exec", ns] for ns in veth.ns]
        server, client, took = pair([*netns[0], *container()], netns[1], host=veth.addr[0],
                                    peers="10.0.0.0/8")  # fmt: skip
    finally:
        veth.close()
    assert client[:2] == ["0", "TCP"] and client[-1] == "True"
    assert "0x3070000" in client[2:4]
    assert server[0] == "TCP"
    assert took < 10.0
    local, peer = (int(code, 16) for code in client[2:4])
    assert fix(local, peer) == SHM_OTHER_HOST
    assert "SMCR_RNIC=roce" in SHM_OTHER_HOST


def test_chk_explains_an_shm_link_that_cannot_come_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ERR_RDYLNK`` over shm (a peer whose rendezvous neither socket reaches): the
    advice names both ways to meet and the fixes; over RoCE it is not the shm advice."""
    monkeypatch.setenv("SMCR_RNIC", "shm")
    assert fix(0x05000000, 0x09990002) == SHM_UNREACHABLE
    assert "network namespace" in SHM_UNREACHABLE and "bind-mount" in SHM_UNREACHABLE
    monkeypatch.setenv("SMCR_RNIC", "roce")
    assert fix(0x05000000, 0x09990002) == ""
