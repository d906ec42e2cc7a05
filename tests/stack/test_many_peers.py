"""A runtime with more peers than it once had receive slots for: one link (QP) per peer
process, and a server with many client processes has as many.  Up to 64 QPs had receive
slots; the 65th peer's link could not come up and its connection fell back to TCP
(``ERR_RDYLNK``)."""

from __future__ import annotations

from smcr.stack import wrslots
from tests.stack.hosts import connect, hosts, read, send

PEERS = 70


def test_a_server_takes_more_peers_than_64_each_over_its_own_link() -> None:
    with hosts(PEERS + 1, max_buffers=4 * PEERS) as stacks:
        server, clients = stacks[0], stacks[1:]
        with server.lock:
            free = server.wr.free_slots
        ends = [connect(server, client) for client in clients]  # (each asserts SMC-R)
        for i, (client, (hs, hc)) in enumerate(zip(clients, ends, strict=True)):
            send(client, hc, bytes([i]))
            assert read(server, hs, 1) == bytes([i])
        with server.lock:
            assert len(server.qps) == PEERS  # a link per peer
            assert server.wr.free_slots == free - PEERS * wrslots.RECV_SLOTS
