"""SMC-R sockets over the RoCE RNIC under heavy random loss (issue 25): loss costs time,
never a connection.

Two namespaces on one subnet (:class:`tests.roce.routed.Routed` with no router), a
server and a client process (``tests.roce.loss_peer``) using smcr's sockets as an
application does.  nftables drops a share of the RoCE packets (UDP 4791) arriving at
each host, so both directions lose.  Some connections are opened before the loss, the
rest while it is on (CLC over TCP is not dropped; CONFIRM LINK, CONFIRM RKEY and the
data are), and all of them move their bytes at once: every one must come through
intact over SMC-R, none reset, none fallen back.  The times are printed, not asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import Any

import pytest

from tests.roce.routed import Routed, rows

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                       reason="needs root and iproute2 (network namespaces)"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables"),
]
MB = 1 << 20
ENV = {"SMCR_RNIC": "roce", "SMCR_DIAG": "0"}


def drop_percent(r: Routed, ns: str, percent: int) -> None:
    """Drop ``percent``% of the RoCE packets arriving in ``ns`` (nftables numgen)."""
    pick = f"numgen random mod 100 < {percent} " if percent < 100 else ""
    rules = ("table inet smcrloss {\n chain input {\n"
             "  type filter hook input priority 0; policy accept;\n"
             f"  udp dport 4791 {pick}drop\n }}\n}}\n")  # fmt: skip
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True,
                   check=True, timeout=30)  # fmt: skip


def run_under_loss(percent: int, total: int, before: int, after: int,
                   env: dict[str, str] | None = None,
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """``before`` connections opened without loss, ``after`` under it, ``total`` bytes each
    way on each, all at once; the rows the client and the server print."""
    env = ENV | (env or {})
    with Routed(0) as r:
        try:
            srv = r.popen(r.server_ns, "tests.roce.loss_peer", "server", r.address(-1),
                          str(before + after), env=env)  # fmt: skip
            assert srv.stdout is not None
            port = json.loads(srv.stdout.readline())["port"]
            cli = r.popen(r.client_ns, "tests.roce.loss_peer", "client", r.address(-1),
                          str(port), str(total), str(before), str(after), env=env)  # fmt: skip
            assert cli.stdout is not None and cli.stdin is not None
            assert json.loads(cli.stdout.readline()) == {"up": before}
            drop_percent(r, r.client_ns, percent)
            drop_percent(r, r.server_ns, percent)
            cli.stdin.write("go\n")
            cli.stdin.flush()
            out, _ = cli.communicate(timeout=120)
            srv_out, _ = srv.communicate(timeout=30)
        finally:
            r.reap()
    return rows(out), rows(srv_out)


@pytest.mark.slow
@pytest.mark.parametrize(("percent", "before", "after"), [(10, 2, 4), (30, 2, 4), (30, 0, 4)],
                         ids=["10pct", "30pct", "30pct-first-contact"])  # fmt: skip
def test_every_connection_intact_under_random_loss(percent: int, before: int, after: int,
                                                   record_property: Any) -> None:  # fmt: skip
    client, server = run_under_loss(percent, 2 * MB, before, after)
    conns = before + after
    assert len(client) == conns and len(server) == conns, (client, server)
    for row in client + server:
        assert row["ok"] is True and "error" not in row, json.dumps(row)
        assert row["mode"] == "SMCR", json.dumps(row)  # neither fell back nor reset
    times = sorted((row["opened"], round(row["connect"], 2), round(row["transfer"], 2))
                   for row in client)  # fmt: skip
    record_property("times", times)
    print(f"\n{percent}% loss each way, 2 MiB each way per connection "
          f"(opened, connect s, transfer s): {times}")


def test_total_loss_resets_every_connection_in_bounded_time() -> None:
    """Every packet lost once the connections are up (RC retries without limit, as Linux
    sets them): the TEST LINK keepalive finds the link silent and ends it, and every
    connection gets ECONNRESET, none hangs.  A 2 s keepalive (``SMCR_TESTLINK_TIME``)
    keeps the test short: the link is down ``testlink_time`` + ``llc_wait`` after the
    last packet got through."""
    client, server = run_under_loss(100, 4 * MB, 2, 0, env={"SMCR_TESTLINK_TIME": "2"})
    assert len(client) == 2 and len(server) == 2, (client, server)
    for row in client:
        assert row["mode"] == "SMCR" and row["ok"] is False, json.dumps(row)
        assert row["error"].startswith("ConnectionResetError"), json.dumps(row)
        assert row["transfer"] < 10.0, json.dumps(row)
    for row in server:
        assert row["ok"] is False and row["error"].startswith("ConnectionResetError"), row
    print(f"\n100% loss: reset after {sorted(round(row['transfer'], 2) for row in client)} s")


@pytest.mark.slow
def test_a_sender_that_exits_at_once_still_delivers_everything_under_loss() -> None:
    """A program puts 8 MiB into its send buffer, closes and exits: over a link that loses
    30% each way its RNIC (which goes with the process) must send and deliver all of it
    first, as long as the link still moves it (TCP's kernel would deliver it after the
    process had gone); the peer reads every byte and EOF.  (It got the first 4 MiB, the
    size of its RMB, and a clean EOF when the close's wait for the send buffer ended
    after 2 s whatever the link did.)"""
    total, percent = 8 * MB, 30
    with Routed(0) as r:
        try:
            sink = r.popen(r.server_ns, "tests.roce.loss_peer", "sink", r.address(-1), env=ENV)
            assert sink.stdout is not None
            port = json.loads(sink.stdout.readline())["port"]
            snd = r.popen(r.client_ns, "tests.roce.loss_peer", "sender", r.address(-1),
                          str(port), str(total), env=ENV)  # fmt: skip
            assert snd.stdout is not None and snd.stdin is not None
            assert json.loads(snd.stdout.readline()) == {"up": 1}
            drop_percent(r, r.client_ns, percent)
            drop_percent(r, r.server_ns, percent)
            t0 = time.monotonic()
            snd.stdin.write("go\n")
            snd.stdin.flush()
            out, _ = snd.communicate(timeout=120)
            exited = time.monotonic() - t0
            got, _ = sink.communicate(timeout=30)
        finally:
            r.reap()
    (sent,) = rows(out)
    assert sent["sent"] == total and snd.returncode == 0, out
    (row,) = rows(got)
    assert row["mode"] == "SMCR" and "error" not in row, row
    assert row["bytes"] == total and row["ok"] is True, row
    print(f"\n{percent}% loss each way: the sender of {total >> 20} MiB sent in "
          f"{sent['took']:.1f} s and exited {exited - sent['took']:.1f} s later")
