"""``SMCR_RNIC=verbs`` where the address has no RDMA device (this host: no RDMA in the
kernel, no pyverbs): the connection goes on over TCP with Linux's reason, ``NOSMCRDEV``,
on both ends, every byte intact (:mod:`smcr.socket.unserved`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from smcr.wire.decline import DeclineCode
from tests.roce.netns import REPO

NOSMCRDEV = int(DeclineCode.NOSMCRDEV)
POLICY = {"SMCR_DISCOVERY": "policy", "SMCR_PEERS": "127.0.0.0/8"}


def run_pair(tmp_path: Path, server_rnic: str, client_rnic: str,
             n: int = 1 << 20) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """Server and client in processes of their own with these RNIC kinds; their answers."""
    portfile = tmp_path / "port"
    end = [sys.executable, "-m", "tests.socket.no_rnic_end"]
    server = subprocess.Popen([*end, "server", str(portfile)], stdout=subprocess.PIPE,
                              text=True, cwd=REPO,
                              env=os.environ | POLICY | {"SMCR_RNIC": server_rnic})  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not portfile.exists() or not portfile.read_text():
            assert server.poll() is None and time.monotonic() < deadline, "no server"
            time.sleep(0.05)
        client = subprocess.run([*end, "client", portfile.read_text(), str(n)],
                                check=False, capture_output=True, text=True, cwd=REPO, timeout=120,
                                env=os.environ | POLICY | {"SMCR_RNIC": client_rnic})  # fmt: skip
        assert client.returncode == 0, client.stderr
        out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0
    return json.loads(out.splitlines()[-1]), json.loads(client.stdout.splitlines()[-1])


def test_both_ends_without_a_device_go_on_over_tcp(tmp_path: Path) -> None:
    server, client = run_pair(tmp_path, "verbs", "verbs")
    assert client == {"mode": "TCP", "local": NOSMCRDEV, "peer": 0, "intact": True}
    assert server == {"mode": "TCP", "local": NOSMCRDEV, "peer": 0, "echoed": 1 << 20}


def test_a_server_without_a_device_declines_the_proposal(tmp_path: Path) -> None:
    """The shm client's Proposal is read and answered with a Decline: the client falls back
    with the server's reason, and no CLC byte reaches either program."""
    server, client = run_pair(tmp_path, "verbs", "shm")
    assert client == {"mode": "TCP", "local": int(DeclineCode.PEERDECL), "peer": NOSMCRDEV,
                      "intact": True}  # (Linux: the peer declined, with its reason)
    assert server == {"mode": "TCP", "local": NOSMCRDEV, "peer": 0, "echoed": 1 << 20}


def test_a_client_without_a_device_declines_before_its_proposal(tmp_path: Path) -> None:
    server, client = run_pair(tmp_path, "shm", "verbs")
    assert client == {"mode": "TCP", "local": NOSMCRDEV, "peer": 0, "intact": True}
    assert server["mode"] == "TCP" and server["echoed"] == 1 << 20
    assert server["peer"] == NOSMCRDEV, server
