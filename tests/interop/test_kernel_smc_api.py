"""A program written for Linux's SMC socket API runs unchanged on the kernel and on smcr, and
the two talk SMC-R (issue 27).

``harness/tools/smc_api_echo.py`` makes its sockets as a program for kernel SMC does:
``socket(AF_INET, SOCK_STREAM, IPPROTO_SMC)`` or ``socket(AF_SMC, SOCK_STREAM,
SMCPROTO_SMC)``, and sets ``SMC_LIMIT_HS`` on its listener.  The same file runs in the guest
on the kernel's SMC (kernel 6.12, as in :mod:`tests.interop.test_kernel_smcr`) and on the
host under ``smcr run`` in netns smcnet (discovery by the TCP option, the RoCE RNIC, the
guests' UEID), in both roles.  The connection is SMC-R: ``smcr run -d`` reports it on
smcr's side, which only an SMC-R connection with the kernel gives.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interop.guest import GUEST_IP, HOST_IP, NETNS, Guest
from tests.interop.kernel_exchange import GUEST_UEID, next_port, ueid_file
from tests.roce.netns import REPO

pytestmark = [pytest.mark.interop, pytest.mark.root]

PROGRAM = "harness/tools/smc_api_echo.py"
GUEST_PROGRAM = f"python3 /mnt/host/tools/{Path(PROGRAM).name}"
HOST_PROGRAM = str(Path(__file__).parent / PROGRAM)
NBYTES = 1 << 20


def host_run(args: list[str], table: Path) -> subprocess.Popen[str]:
    """The program under ``smcr run -d`` in netns smcnet (``nsenter``: unlike ``ip netns
    exec`` it leaves ``/sys``, where the discovery map is pinned, as it is)."""
    env = os.environ | {"SMCR_RNIC": "roce", "SMCR_DISCOVERY": "bpf",
                        "SMCR_UEID_FILE": str(table)}  # fmt: skip
    cmd = ["nsenter", f"--net=/run/netns/{NETNS}", sys.executable, "-m", "smcr", "run", "-d",
           "--", sys.executable, HOST_PROGRAM, *args]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=env)  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 120.0) -> tuple[dict[str, object], str]:
    """(its JSON line, its standard error)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, f"{out}\n{err}"
    return json.loads(out.splitlines()[-1]), err


@pytest.mark.parametrize(("guest_role", "api"), [("server", "ipproto"), ("client", "ipproto"),
                                                  ("server", "af_smc")])  # fmt: skip
def test_a_kernel_smc_program_runs_unchanged_on_smcr_and_talks_smcr_to_the_kernel(
        kernel_smc: Guest, guest_role: str, api: str) -> None:  # fmt: skip
    port = next_port()
    table = ueid_file([GUEST_UEID])
    try:
        if guest_role == "server":
            ident = kernel_smc.run(f"{GUEST_PROGRAM} server --port {port} --api {api}",
                                   background=True)  # fmt: skip
            kernel_smc.wait_listening(ident)
            host, err = finish(host_run(["client", "--host", GUEST_IP, "--port", str(port),
                                         "--bytes", str(NBYTES), "--api", api], table))
            guest = json.loads(kernel_smc.wait(ident, 60).splitlines()[-1])
            client, server = host, guest
        else:
            proc = host_run(["server", "--port", str(port), "--api", api], table)
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 60.0)
            assert ready and proc.stdout.readline().strip() == "listening"
            guest = json.loads(kernel_smc.run(
                f"{GUEST_PROGRAM} client --host {HOST_IP} --port {port} --bytes {NBYTES}"
                f" --api {api}", timeout=120).splitlines()[-1])  # fmt: skip
            host, err = finish(proc)
            client, server = guest, host
    finally:
        shutil.rmtree(table.parent, ignore_errors=True)
    # the bytes arrived whole, each way
    assert client["bytes"] == server["bytes"] == NBYTES
    assert client["sha256"] == server["sha256"] == client["answer"]
    # SMC-R on smcr's side (a connection with the kernel is SMC-R on both sides or on none)
    assert "SMCR link group" in err, err
    assert "TCP, reason" not in err, err
    # the program saw what it sees on the kernel: its listener's protocol and SMC_LIMIT_HS
    assert server["limit_hs"] == 1
    if api == "ipproto":
        assert server["listener"] == {"so_domain": 2, "so_protocol": 256}, server
        assert (client["so_domain"], client["so_protocol"]) == (2, 256), client
