"""smcr to smcr over the shm RNIC and the RoCE RNIC: SMC-Rv2 with a UEID configured on
both hosts, SMC-Rv1 without (the one code path the kernel tests will use too)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import smcr
from smcr import ueid
from smcr.stack.runtime import close_stacks
from tests.socket import smc_peer
from tests.socket import v2_peers as peers
from tests.socket.conftest import RNICS, Peer


@RNICS
@pytest.mark.parametrize("with_ueid", [True, False], ids=["ueid", "no-ueid"])
def test_smcr_to_smcr_negotiates_v2_with_a_ueid_and_v1_without(
        rnic: str, with_ueid: bool, peer: Callable[..., Peer], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    path = tmp_path / "ueid"
    monkeypatch.setenv(ueid.ENV, str(path))
    if with_ueid:
        ueid.add("SMCR-V2-TEST", path)
    close_stacks()  # a fresh runtime for this process's side
    p = peer(peers.echo_version)
    s = smcr.create_connection((smc_peer.host(), p.recv()), timeout=20)
    try:
        s.sendall(b"hello v2")
        assert s.recv(100) == b"hello v2"
        want = 2 if with_ueid else 1
        assert (s.smc_info().mode, peers.lgr_version(s)) == ("SMCR", want)
        assert p.recv() == ("SMCR", want)
        s.sendall(b"x")
    finally:
        s.close()
