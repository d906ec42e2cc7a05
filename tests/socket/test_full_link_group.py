"""A link group holds 255 connections (Linux ``SMC_RMBS_PER_LGR_MAX``); the 256th opens a
second group to the same peer, and the first group takes new connections again once one
of its own has closed.  Both ends in this process, over the shm RNIC, real sockets."""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Iterator

import pytest

import smcr

PER_GROUP = 255


@pytest.fixture
def descriptors() -> Iterator[None]:
    """Room for some 300 SMC-R connections with both ends in this process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_256th_connection_opens_a_second_link_group(descriptors: None) -> None:
    srv = smcr.create_server(("127.0.0.1", 0), backlog=512)
    srv.settimeout(20)
    pairs: list[tuple[smcr.SMCSocket, smcr.SMCSocket]] = []
    try:
        for _ in range(PER_GROUP + 5):
            client = smcr.create_connection(srv.getsockname(), timeout=20)
            server, _ = srv.accept()
            assert isinstance(server, smcr.SMCSocket)
            pairs.append((client, server))
        infos = [c.smc_info() for c, _ in pairs]
        assert {i.mode for i in infos} == {"SMCR"}
        groups = Counter(i.lgr_id for i in infos)
        first = infos[0].lgr_id
        assert groups[first] == PER_GROUP and len(groups) == 2
        assert [i.lgr_id for i in infos[:PER_GROUP]] == [first] * PER_GROUP
        for client, server in (pairs[0], pairs[-1]):  # both groups carry bytes
            client.sendall(b"over the link group")
            assert server.recv(64) == b"over the link group"
        for sock in pairs.pop(0):  # a place in the first group comes free
            sock.close()
        again = smcr.create_connection(srv.getsockname(), timeout=20)
        server, _ = srv.accept()
        assert isinstance(server, smcr.SMCSocket)
        pairs.append((again, server))
        assert again.smc_info().mode == "SMCR"
        assert again.smc_info().lgr_id in groups
    finally:
        for pair in pairs:
            for sock in pair:
                sock.close()
        srv.close()
