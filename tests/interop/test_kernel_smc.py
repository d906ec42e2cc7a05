"""Discovery against the Linux kernel's SMC (issue 11): the SMC TCP option both ways, then CLC.

The guest (kernel 6.12, rxe0, pnet SMCNET eth0<->rxe0, UEID SMC-KVM-TEST, as
``shared/interop/tools/smc-setup.sh`` sets it up) runs AF_SMC or plain TCP
sockets (``harness/tools/kernel_smc.py``); smcr runs in netns smcnet at
10.99.0.1 with discovery by the TCP option (the test session's ``smcr
enable``) and its RoCE RNIC (``tests/interop/smc_host.py``).  Every exchange
is one connection: the client sends 1 MiB of a seeded pattern, the server
echoes it, both compare SHA-256; tcpdump on br0 records the TCP stream.

What the capture proves: the SYN and the SYN-ACK carried the option (kind 254,
length 6, ExID 0xE2D4C3D9), the client's stream starts with a CLC Proposal and
the declining side's with a CLC Decline, and after those messages each stream
is exactly the application's bytes.  The decline code is read three times --
on the wire, in the declining side's record, in the other side's -- and must
agree: the declining side keeps it as its local reason, the other side keeps
``PEERDECL`` (0x05000000) with it as the peer's diagnosis, as ``smcss`` shows
``<local>/<remote>``.

Why both directions decline here: smcr has no UEID configured, so it speaks
SMC-Rv1 only, and the kernel over rxe (RoCE v2 GIDs only) only SMC-Rv2.  The
kernel's Proposal offers SMC-Rv2 alone (typev1 N), which smcr declines with
NOSMCDEV (no common UEID, as a Linux server does); smcr's offers SMC-Rv1 alone,
which the kernel declines with NOSMCDEV (it finds no RoCE v1 GID).  With the
guests' UEID configured on smcr's side these connections are to run SMC-Rv2
(issue 12, phase 2).

The controls: a plain TCP guest socket, or smcr with ``SMCR_DISCOVERY=off``
against a kernel AF_SMC socket, give ``PEERNOSMC`` (0x03010000) on every
SMC end and not one CLC byte on the wire.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from scapy.utils import RawPcapReader

from smcr.wire.clc import ClcDecline, ClcMessage, ClcProposal, decode_clc, make_eid
from smcr.wire.clc_header import EYECATCHER_SMCR, SmcType
from smcr.wire.decline import DeclineCode
from tests.interop.guest import GUEST_IP, HOST_IP, NETNS, Guest, mark_to_guest
from tests.interop.smc_host import pattern
from tests.roce.netns import REPO
from tests.support import stop_capture, wait_for_mark

pytestmark = [pytest.mark.interop, pytest.mark.root]

MB = 1 << 20
SMC_OPTION = (254, b"\xe2\xd4\xc3\xd9")  # kind, ExID; length 6
PEERNOSMC = int(DeclineCode.PEERNOSMC)
PEERDECL = int(DeclineCode.PEERDECL)
NOSMCDEV = int(DeclineCode.NOSMCDEV)
TOOL = "python3 /mnt/host/tools/kernel_smc.py"
_PORTS = itertools.count(20100)


@pytest.fixture(scope="session")
def kernel_smc(rxe_guest: Guest) -> Guest:
    """The guest with kernel SMC set up (pnet entry and UEID; rxe0 exists already)."""
    out = rxe_guest.run(f"modprobe smc && modprobe smc_diag && {TOOL} setup", timeout=60)
    assert json.loads(out.splitlines()[-1]) == {"ueids": ["SMC-KVM-TEST"]}, out
    return rxe_guest


# ------------------------------------------------------------------ the wire


@dataclass
class Direction:
    """One direction of the captured TCP connection."""

    syn_option: bool | None = None  # did its SYN (or SYN-ACK) carry the SMC option
    isn: int | None = None
    segments: dict[int, bytes] = field(default_factory=dict)  # stream offset -> payload

    def stream(self) -> bytes:
        """The contiguous stream from its first byte (up to a capture gap, if any)."""
        out = bytearray()
        for off in sorted(self.segments):
            data = self.segments[off]
            if off > len(out):
                break
            out += data[len(out) - off :]
        return bytes(out)


@dataclass
class Wire:
    """The captured connection: client -> server and server -> client."""

    c2s: Direction
    s2c: Direction


def smc_option(options: bytes) -> bool:
    """Whether TCP options hold the SMC option (kind 254, length 6, ExID E2D4C3D9)."""
    i = 0
    while i < len(options):
        kind = options[i]
        if kind == 0:
            break
        if kind == 1:
            i += 1
            continue
        if i + 1 >= len(options) or options[i + 1] < 2:
            break
        length = options[i + 1]
        if (kind, length, options[i + 2 : i + length]) == (SMC_OPTION[0], 6, SMC_OPTION[1]):
            return True
        i += length
    return False


def read_wire(pcap: Path, server_port: int) -> Wire:
    """The TCP connection to ``server_port`` in the capture, both directions reassembled."""
    wire = Wire(Direction(), Direction())
    for frame, _meta in RawPcapReader(str(pcap)):
        raw = bytes(frame)
        if raw[12:14] != b"\x08\x00" or raw[23] != 6:
            continue
        ip = raw[14:]
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack_from("!H", ip, 2)[0]
        tcp = ip[ihl:total]  # the IP length: no Ethernet padding
        sport, _dport, seq = struct.unpack_from("!HHI", tcp)
        doff, flags = (tcp[12] >> 4) * 4, tcp[13]
        d = wire.s2c if sport == server_port else wire.c2s
        if flags & 0x02:  # SYN or SYN-ACK
            d.isn, d.syn_option = seq, smc_option(tcp[20:doff])
        payload = tcp[doff:]
        if payload and d.isn is not None:
            d.segments.setdefault((seq - d.isn - 1) % (1 << 32), payload)
    return wire


def split_clc(stream: bytes) -> tuple[list[ClcMessage], bytes]:
    """The CLC messages at the start of a stream (smcr's decoder) and the bytes after them."""
    msgs: list[ClcMessage] = []
    while stream[:4] == EYECATCHER_SMCR and len(stream) >= 8:
        length = struct.unpack_from("!H", stream, 5)[0]
        msgs.append(decode_clc(stream[:length]))
        stream = stream[length:]
    return msgs, stream


@contextlib.contextmanager
def capture(port: int) -> Iterator[Path]:
    """tcpdump on br0 (netns smcnet) of ``tcp port PORT``; the file once stopped."""
    tmp = Path(tempfile.mkdtemp(prefix="smcr-kernel-smc"))
    os.chmod(tmp, 0o755)
    path = tmp / f"tcp{port}.pcap"
    cap = subprocess.Popen(["ip", "netns", "exec", NETNS, "tcpdump", "-Z", "root", "-i", "br0",
                            "-s", "0", "-U", "-B", "8192", "-w", str(path),
                            f"tcp port {port} or udp port 9"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for_mark(path, mark_to_guest)  # live (the file exists before the filter is)
        yield path
        wait_for_mark(path, mark_to_guest)  # the last segments are in (read_wire: TCP only)
    finally:
        stop_capture(cap)
        if not path.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------ one exchange


@dataclass
class Exchange:
    """What both ends reported and what the wire showed, for one connection."""

    host: dict[str, Any]  # smc_host's result: discovery, info, bytes and digests
    guest: dict[str, Any]  # kernel_smc.py's result: diag (AF_SMC), bytes and digests
    wire: Wire
    client_clc: list[ClcMessage]
    server_clc: list[ClcMessage]
    client_data: bytes  # the client's stream after its CLC messages (a prefix, see read_wire)
    server_data: bytes


def host_proc(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.interop.smc_host", *args],
                            stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env=os.environ | {"SMCR_RNIC": "roce"} | env)  # fmt: skip


def host_result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)
        raise AssertionError("smcr's end did not finish") from None
    assert proc.returncode == 0 and out.strip(), f"smcr's end failed ({proc.returncode}): {out}"
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def exchange(guest: Guest, guest_role: str, family: str, discovery: str = "bpf",
             nbytes: int = MB) -> Exchange:  # fmt: skip
    """One connection between the guest (``guest_role``, AF_SMC or plain ``tcp``) and smcr
    (``SMCR_DISCOVERY=discovery``: ``bpf``, the TCP option, or ``off``)."""
    port = next(_PORTS)
    seed = port
    env = {"SMCR_DISCOVERY": discovery}
    with capture(port) as pcap:
        if guest_role == "client":
            proc = host_proc(["server", "--port", str(port)], env)
            try:
                assert proc.stdout is not None
                ready, _, _ = select.select([proc.stdout], [], [], 60.0)
                assert ready, "smcr's server did not start"
                assert json.loads(proc.stdout.readline()) == {"listening": port}
                out = guest.run(f"{TOOL} client --family {family} --host {HOST_IP} --port {port}"
                                f" --bytes {nbytes} --seed {seed}", timeout=120)  # fmt: skip
            except BaseException:
                proc.kill()
                proc.communicate(timeout=10)
                raise
            host = host_result(proc, 60)
        else:
            ident = guest.run(f"{TOOL} server --family {family} --port {port}", background=True)
            deadline = time.monotonic() + 60
            while "listening" not in guest.output(ident):
                if (guest.share / "out" / f"{ident}.rc").exists():
                    guest.wait(ident, 1)  # it ended: raises with its output
                assert time.monotonic() < deadline, guest.output(ident)
                time.sleep(0.05)
            proc = host_proc(["client", "--host", GUEST_IP, "--port", str(port), "--bytes",
                              str(nbytes), "--seed", str(seed)], env)  # fmt: skip
            host = host_result(proc, 120)
            out = guest.wait(ident, 60)
    try:
        wire = read_wire(pcap, port)
    finally:
        shutil.rmtree(pcap.parent, ignore_errors=True)
    result = json.loads(out.splitlines()[-1])
    client_clc, client_data = split_clc(wire.c2s.stream())
    server_clc, server_data = split_clc(wire.s2c.stream())
    ex = Exchange(host, result, wire, client_clc, server_clc, client_data, server_data)
    check_data(ex, seed, nbytes)
    return ex


def check_data(ex: Exchange, seed: int, nbytes: int) -> None:
    """The pattern went to the server and came back whole, as both ends and the wire say."""
    data = pattern(seed, nbytes)
    digest = hashlib.sha256(data).hexdigest()
    client, server = (ex.host, ex.guest) if "sent" in ex.host else (ex.guest, ex.host)
    assert client["send_error"] is None, client
    assert (client["sent"], client["sent_sha256"]) == (nbytes, digest), client
    assert (server["received"], server["received_sha256"]) == (nbytes, digest), server
    assert (client["received"], client["received_sha256"]) == (nbytes, digest), client
    # on the wire, after the CLC messages: the application's bytes and nothing else
    for stream in (ex.client_data, ex.server_data):
        assert len(stream) >= 64 * 1024, len(stream)  # a capture gap later on is tolerated
        assert stream == data[: len(stream)]


def server_decline(ex: Exchange) -> int:
    """The code of the server's Decline: the one CLC message each way is the client's
    Proposal and the server's Decline (no answer to it)."""
    assert len(ex.client_clc) == 1 and isinstance(ex.client_clc[0], ClcProposal), ex.client_clc
    assert len(ex.server_clc) == 1 and isinstance(ex.server_clc[0], ClcDecline), ex.server_clc
    return ex.server_clc[0].peer_diagnosis


# -------------------------------------------------------------------- tests


def test_kernel_client_to_smcr_server_declined_by_smcr(kernel_smc: Guest) -> None:
    ex = exchange(kernel_smc, "client", "smc")
    assert ex.host["discovery"] == "bpf"
    assert ex.wire.c2s.syn_option and ex.wire.s2c.syn_option  # each end saw the other's option
    # the kernel's Proposal: SMC-Rv2 only (rxe has RoCE v2 GIDs only), its GID and UEID
    code = server_decline(ex)
    prop = ex.client_clc[0]
    assert isinstance(prop, ClcProposal)
    assert (prop.version, prop.typev1, prop.typev2) == (2, SmcType.N, SmcType.R), prop
    assert prop.v2_extension is not None
    assert prop.v2_extension.user_eids == (make_eid("SMC-KVM-TEST"),)
    assert prop.v2_extension.roce_gid == bytes(10) + b"\xff\xff" + bytes([10, 99, 0, 11])
    # smcr has no matching UEID and declines as a Linux server then does: NOSMCDEV
    # 0x03030000 (smc_listen_find_device; NOUEID only for a Proposal with no UEID at all)
    assert code == NOSMCDEV
    assert ex.host["info"] == {"mode": "TCP", "local_code": NOSMCDEV, "peer_code": 0}
    diag = ex.guest["diag"]
    assert diag["mode"] == "FALLBACK_TCP", diag
    assert (diag["fallback_reason"], diag["peer_diagnosis"]) == (PEERDECL, NOSMCDEV), diag


def test_smcr_client_to_kernel_server_declined_by_the_kernel(kernel_smc: Guest) -> None:
    ex = exchange(kernel_smc, "server", "smc")
    assert ex.host["discovery"] == "bpf"
    assert ex.wire.c2s.syn_option and ex.wire.s2c.syn_option
    # smcr's Proposal: SMC-Rv1 only, in a v2 header, with its RoCE GID and the /24 prefix
    code = server_decline(ex)
    prop = ex.client_clc[0]
    assert isinstance(prop, ClcProposal)
    assert (prop.version, prop.typev1, prop.typev2) == (2, SmcType.R, SmcType.N), prop
    assert prop.gid == bytes(10) + b"\xff\xff" + bytes([10, 99, 0, 1])
    # the kernel finds no RoCE v1 GID for SMC-Rv1 and declines with NOSMCDEV; what it
    # sends is what it records (smc_diag), and smcr keeps it as the peer's diagnosis
    assert code == NOSMCDEV
    diag = ex.guest["diag"]
    assert diag["mode"] == "FALLBACK_TCP", diag
    assert (diag["fallback_reason"], diag["peer_diagnosis"]) == (NOSMCDEV, 0), diag
    assert ex.host["info"] == {"mode": "TCP", "local_code": PEERDECL, "peer_code": NOSMCDEV}


@pytest.mark.parametrize(("guest_role", "family", "discovery"), [
    ("client", "tcp", "bpf"),  # plain TCP guest client, smcr server
    ("server", "tcp", "bpf"),  # smcr client, plain TCP guest server
    ("client", "smc", "off"),  # kernel SMC client, smcr server without the option
    ("server", "smc", "off"),  # smcr client without the option, kernel SMC server
])  # fmt: skip
def test_no_option_no_clc_peernosmc(kernel_smc: Guest, guest_role: str, family: str,
                                    discovery: str) -> None:  # fmt: skip
    ex = exchange(kernel_smc, guest_role, family, discovery)
    assert ex.host["discovery"] == discovery
    smcr_asks = discovery == "bpf"
    kernel_asks = family == "smc"
    client_asks = kernel_asks if guest_role == "client" else smcr_asks
    assert ex.wire.c2s.syn_option is client_asks
    assert ex.wire.s2c.syn_option is False  # a SYN-ACK has it only if the SYN had it
    assert ex.client_clc == [] and ex.server_clc == []  # not one CLC byte either way
    assert ex.host["info"] == {"mode": "TCP", "local_code": PEERNOSMC, "peer_code": 0}
    if family == "smc":
        diag = ex.guest["diag"]
        assert diag["mode"] == "FALLBACK_TCP", diag
        assert (diag["fallback_reason"], diag["peer_diagnosis"]) == (PEERNOSMC, 0), diag
    else:
        assert ex.guest["diag"] is None
