"""SMC-R between hosts in different subnets, joined by one or two IP routers (issue 25).

Each test builds its own line of namespaces (:class:`tests.roce.routed.Routed`) and
runs the two ends as processes (``tests.roce.routed_peer``) over the RoCE RNIC:

* with a UEID on both hosts: SMC-Rv2 across one or two routers, IPv4 and IPv6, a
  few MiB each way intact, the RoCE packets forwarded by the routers (hop limit
  64, Linux ``smc_ib_modify_qp_rtr`` for a peer behind a gateway); one subnet
  beside it for the connect time (printed, not asserted);
* through a load balancer: nftables DNAT of a virtual IP in the router; the TCP
  connection goes to the VIP, the RoCE packets straight between the client's and
  the server's own addresses (the GIDs CLC exchanged), none to the VIP;
* without a UEID (SMC-Rv1 only): the server declines at once with ``DIFFPREFIX``
  (v1 has no gateways), never after a timeout;
* a capture on the router decodes in tshark: InfiniBand over UDP with TTL 64 (63
  once forwarded), the Accept's first-contact extension saying "not direct".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from smcr.tools.tshark import HEURISTIC_FIRST
from smcr.wire.decline import DeclineCode
from tests.roce.routed import Routed, rows
from tests.support import stop_capture, wait_for_mark

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                       reason="needs root and iproute2 (network namespaces)"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nftables"),
]
MB = 1 << 20


@pytest.fixture
def ueid_file() -> Iterator[Path]:
    """A UEID file for both hosts (what ``smcr ueid add`` writes)."""
    path = Path(tempfile.mkdtemp(prefix="smcr-route")) / "ueid"
    path.write_text("SMCR-ROUTED-TEST\n")
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


def env(ueids: Path | None) -> dict[str, str]:
    """The peers' environment: the RoCE RNIC, the UEID file (or none: SMC-Rv1 only)."""
    return {"SMCR_RNIC": "roce", "SMCR_DIAG": "0",
            "SMCR_UEID_FILE": str(ueids) if ueids else "/nonexistent/smcr-ueid"}  # fmt: skip


def run(r: Routed, family: int, ueids: Path | None, conns: int = 3, total: int = 2 * MB,
        target: str | None = None, before: Callable[[int], None] | None = None,
        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """Server in the last namespace, client in the first: ``conns`` connections one after
    another, ``total`` bytes each way on each; the rows both print.

    :param target: the address the client connects to (default: the server's).
    :param before: called with the server's port before the client starts.
    """
    server_ip = r.address(-1, family)
    srv = r.popen(r.server_ns, "tests.roce.routed_peer", "server", server_ip, str(conns),
                  env=env(ueids))  # fmt: skip
    try:
        assert srv.stdout is not None
        port = json.loads(srv.stdout.readline())["port"]
        if before is not None:
            before(port)
        cli = r.popen(r.client_ns, "tests.roce.routed_peer", "client", target or server_ip,
                      str(port), str(total), str(conns), env=env(ueids))  # fmt: skip
        out, _ = cli.communicate(timeout=60)
        assert cli.returncode == 0, out
        srv_out, _ = srv.communicate(timeout=30)
    finally:
        r.reap()
    return rows(out), rows(srv_out)


def count_roce(r: Routed, router: int) -> None:
    """Count the RoCE packets a router forwards (nftables, table ``smcrfwd``)."""
    rules = ("table inet smcrfwd {\n chain forward {\n"
             "  type filter hook forward priority 0; policy accept;\n"
             "  udp dport 4791 counter\n }\n}\n")  # fmt: skip
    subprocess.run(["ip", "netns", "exec", r.ns[router], "nft", "-f", "-"], input=rules,
                   text=True, check=True, timeout=30)  # fmt: skip


def counters(r: Routed, ns: str, table: str, family: str = "inet") -> list[int]:
    """The packet counts of a table's counter rules, in order."""
    out = r.exec(ns, "nft", "list", "table", family, table).stdout
    return [int(n) for n in re.findall(r"counter packets (\d+)", out)]


def smcr_v2_intact(rows: list[dict[str, Any]], conns: int) -> None:
    assert len(rows) == conns, rows
    for row in rows:
        assert (row["mode"], row["version"], row["ok"]) == ("SMCR", 2, True), row


@pytest.mark.parametrize(("routers", "family"), [(0, 4), (1, 4), (1, 6), (2, 4), (2, 6)],
                         ids=["subnet-v4", "router-v4", "router-v6", "2routers-v4",
                              "2routers-v6"])  # fmt: skip
def test_smcr_v2_across_routers_bytes_intact(routers: int, family: int, ueid_file: Path,
                                             record_property: Any) -> None:  # fmt: skip
    with Routed(routers) as r:
        for router in range(1, routers + 1):
            count_roce(r, router)
        client, server = run(r, family, ueid_file)
        forwarded = [counters(r, r.ns[i], "smcrfwd")[0] for i in range(1, routers + 1)]
    smcr_v2_intact(client, 3)
    smcr_v2_intact(server, 3)
    times = [round(row["connect"] * 1000, 1) for row in client]
    record_property("connect_ms", times)
    print(f"\nconnect times, {routers} router(s), IPv{family}: {times} ms")
    # every router carried the RoCE traffic (12 MiB in all; a UDP GSO run counts once)
    assert all(n > 100 for n in forwarded), forwarded


@pytest.mark.parametrize("family", [4, 6])
def test_dnat_load_balancer_roce_goes_straight_to_the_server(family: int,
                                                             ueid_file: Path) -> None:  # fmt: skip
    """TCP to a virtual IP the router DNATs to the server; SMC-R's RoCE packets go between
    the client's and the server's own addresses (the GIDs of CLC), never to the VIP."""
    with Routed(1) as r:
        nft = "ip" if family == 4 else "ip6"
        vip = f"10.{r.base}.250.1" if family == 4 else f"fd{r.base:x}:250::1"
        client_ip, server_ip = r.address(0, family), r.address(-1, family)
        to_server = server_ip if family == 4 else f"[{server_ip}]"

        def balance(port: int) -> None:
            rules = (
                f"table {nft} smcrlb {{\n"
                " chain prerouting {\n"
                "  type nat hook prerouting priority dstnat; policy accept;\n"
                f"  {nft} daddr {vip} udp dport 4791 counter\n"
                f"  {nft} daddr {vip} tcp dport {port} counter dnat to {to_server}\n"
                " }\n"
                " chain forward {\n"
                "  type filter hook forward priority 0; policy accept;\n"
                f"  {nft} saddr {client_ip} {nft} daddr {server_ip} udp dport 4791 counter\n"
                f"  {nft} saddr {server_ip} {nft} daddr {client_ip} udp dport 4791 counter\n"
                " }\n}\n"
            )
            subprocess.run(["ip", "netns", "exec", r.ns[1], "nft", "-f", "-"], input=rules,
                           text=True, check=True, timeout=30)  # fmt: skip

        client, server = run(r, family, ueid_file, conns=2, total=MB, target=vip,
                             before=balance)  # fmt: skip
        to_vip, dnat, c2s, s2c = counters(r, r.ns[1], "smcrlb", nft)
    smcr_v2_intact(client, 2)
    smcr_v2_intact(server, 2)
    assert dnat >= 2  # the TCP connections went through the DNAT (their first packets)
    assert to_vip == 0  # no RoCE packet to the VIP
    assert c2s > 100 and s2c > 100, (c2s, s2c)  # RoCE both ways between the real addresses


@pytest.mark.parametrize("family", [4, 6])
def test_smcr_v1_across_subnets_declines_at_once_diffprefix(family: int) -> None:
    """No UEID: SMC-Rv1 only, which has no gateways.  The server sees the client's other
    prefix and declines with ``SMC_CLC_DECL_DIFFPREFIX`` (``smc_listen_prfx_check``) in
    the CLC exchange: TCP at once, data intact, no wait for a link that cannot come."""
    with Routed(1) as r:
        client, server = run(r, family, None, conns=2, total=64 * 1024)
    print(f"\nSMC-Rv1 decline, IPv{family}: {[round(x['connect'] * 1000, 1) for x in client]} ms")
    for i, row in enumerate(client):
        assert (row["mode"], row["ok"]) == ("TCP", True), row
        assert (row["local"], row["peer"]) == (DeclineCode.PEERDECL, DeclineCode.DIFFPREFIX)
        # a handshake's round trips, not a timeout (a link's wait is seconds); the first
        # connection starts the client's runtime too (0.50 s once in a slow CI run)
        assert row["connect"] < (1.5 if i == 0 else 0.5), row
    for row in server:
        assert (row["mode"], row["local"]) == ("TCP", DeclineCode.DIFFPREFIX), row


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("dumpcap") is None, reason="needs dumpcap/tshark")
def test_routed_capture_decodes_in_tshark(ueid_file: Path) -> None:
    """dumpcap on the router's server-side veth: every RoCE packet decodes as InfiniBand,
    the client's with TTL 63 (64, one router on the way), the server's with 64; the
    first-contact extensions of the Accept and the Confirm say "not direct"."""
    workdir = Path(tempfile.mkdtemp(prefix="smcr-cap"))
    os.chmod(workdir, 0o755)
    pcap = workdir / "routed.pcapng"
    try:
        with Routed(1) as r:
            for ns, ifname in ((r.client_ns, "right0"), (r.server_ns, "left1")):
                r.exec(ns, sys.executable, "-m", "tests.roce.ethtool", ifname,
                       "tx-udp-segmentation", "off")  # fmt: skip

            def mark(payload: bytes) -> None:
                r.exec(r.client_ns, sys.executable, "-c", "import socket; socket.socket("
                       f"socket.AF_INET, socket.SOCK_DGRAM).sendto({payload!r}, "
                       f"('{r.address(-1)}', 9))")  # fmt: skip

            cap = subprocess.Popen(
                ["ip", "netns", "exec", r.ns[1], "dumpcap", "-q", "-i", "right1", "-w",
                 str(pcap), "-f", "tcp or udp port 4791 or udp port 9"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
            try:
                wait_for_mark(pcap, mark)
                client, _ = run(r, 4, ueid_file, conns=1, total=256 * 1024)
                wait_for_mark(pcap, mark)
            finally:
                stop_capture(cap)
        smcr_v2_intact(client, 1)
        server_ip = r.address(-1)
        rows = tshark(pcap, "udp.dstport == 4791", "ip.src", "ip.ttl", "infiniband.bth.opcode")
        assert len(rows) > 100 and all(row[2] for row in rows), rows[:5]  # all InfiniBand
        assert {row[1] for row in rows if row[0] == server_ip} == {"64"}
        assert {row[1] for row in rows if row[0] != server_ip} == {"63"}
        # byte 104 of the Accept's and the Confirm's first-contact extensions
        kinds = tshark(pcap, "smc.accept.v2_lg.type", "smc.accept.v2_lg.type")
        assert kinds == [["0"], ["0"]], kinds  # tshark: "V2 LG Type: V2_INDIRECT (0)"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def tshark(pcap: Path, display_filter: str, *fields: str) -> list[list[str]]:
    """The fields of the frames a display filter keeps, one row per frame."""
    args = ["tshark", *HEURISTIC_FIRST, "-r", str(pcap), "-Y", display_filter, "-T", "fields"]
    for f in fields:
        args += ["-e", f]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    return [line.split("\t") for line in out.splitlines() if line.strip()]


def test_find_route_sees_the_gateway_and_its_mac() -> None:
    """:func:`smcr.stack.routes.find_route` in the client's namespace: the server is behind
    the router (its address the gateway, its MAC from the neighbour table, resolved by
    the TCP connection before SMC-R asks), the router's own address on-link."""
    with Routed(1) as r:
        srv = r.popen(r.server_ns, "tests.roce.routed_peer", "server", r.address(-1), "1")
        try:
            assert srv.stdout is not None
            port = json.loads(srv.stdout.readline())["port"]
            code = (
                "import ipaddress, json, socket\n"
                "from smcr.stack.routes import find_route\n"
                f"s = socket.create_connection(('{r.address(-1)}', {port}), timeout=5)\n"
                "hops = [find_route(ipaddress.ip_address(a)) for a in "
                f"('{r.address(-1)}', '{r.v4[0][1]}')]\n"
                "print(json.dumps([[str(h.gateway), h.nexthop_mac.hex(), h.oif] for h in hops]))"
            )
            out = r.python(r.client_ns, code)
        finally:
            srv.kill()
            srv.wait(5)
        link = json.loads(r.exec(r.ns[1], "ip", "-j", "link", "show", "left0").stdout)
    routed, on_link = json.loads(out)
    assert routed[:2] == [r.v4[0][1], link[0]["address"].replace(":", "")]
    assert on_link == ["None", "000000000000", routed[2]]
