"""Connections between smcr (netns smcnet, 10.99.0.1) and the guest's kernel SMC, recorded.

One :func:`exchange` runs the guest's ``harness/tools/kernel_smc.py`` (AF_SMC
or plain TCP) against ``tests/interop/smc_host.py`` (smcr's SMCSocket with its
RoCE RNIC), one side the server and the other the client, K connections one
after another in one of three modes (``echo``, ``send``, ``pingpong``), while
tcpdump on br0 records them.  What it returns holds what both ends reported
(per connection: mode, link, bytes and SHA-256, seconds) and the TCP
connections as the wire carried them, each split into its CLC messages and the
bytes after them; :func:`check_data` says the pattern arrived whole.

Used by the discovery tests (``test_kernel_smc.py``: CLC and the declines) and
by the SMC-R tests (``test_kernel_smcr.py``: live SMC-Rv2 both ways).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smcr.wire.clc import ClcMessage, decode_clc
from smcr.wire.clc_header import EYECATCHER_SMCR
from tests.interop.guest import GUEST_IP, HOST_IP, NETNS, Guest, mark_to_guest
from tests.interop.smc_host import digest as pattern_digest
from tests.interop.smc_host import pattern
from tests.roce.netns import REPO
from tests.support import pcap_frames, stop_capture, wait_for_mark

MB = 1 << 20
SMC_OPTION = (254, b"\xe2\xd4\xc3\xd9")  # kind, ExID; length 6
TOOL = "python3 /mnt/host/tools/kernel_smc.py"
GUEST_UEID = "SMC-KVM-TEST"
_PORTS = itertools.count(20100)
MARK_PORT = 9  # discard: the datagram that tells the capture is live


RXE0 = ("modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0 && for _ in $(seq 100);"
        " do grep -qs ffff:0a63 /sys/class/infiniband/rxe0/ports/1/gids/* && break;"
        " sleep 0.1; done")
"""rxe0 on eth0 and its RoCE v2 GID (rxe-setup.sh without the pyverbs check, seconds under
TCG: the kernel's SMC-R needs no pyverbs)."""
KERNEL_SMC_SETUP = f"modprobe smc && modprobe smc_diag && {TOOL} setup"
"""Kernel SMC's modules, the pnet entry of rxe0 and smcr's UEID (``check_setup``)."""
SECOND_GUEST_SETUP = f"{RXE0} && {KERNEL_SMC_SETUP}"
"""g2's whole set-up for kernel SMC-R: rxe0 and kernel SMC (about 40 s under TCG)."""


def check_setup(out: str) -> None:
    """The output of :data:`KERNEL_SMC_SETUP` says the UEID table is smcr's."""
    assert json.loads(out.splitlines()[-1]) == {"ueids": [GUEST_UEID]}, out


def setup_kernel_smc(guest: Guest) -> None:
    """Kernel SMC in the guest: its modules, the pnet entry of rxe0 and smcr's UEID (done
    again should the guest be restarted: :meth:`Guest.restart`)."""
    check_setup(guest.run(KERNEL_SMC_SETUP, timeout=60))
    if setup_kernel_smc not in guest.setups:
        guest.setups.append(setup_kernel_smc)


def next_port() -> int:
    """A TCP port no earlier exchange of this session used."""
    return next(_PORTS)


# ------------------------------------------------------------------ the wire


@dataclass
class Direction:
    """One direction of a captured TCP connection."""

    syn_option: bool | None = None  # did its SYN (or SYN-ACK) carry the SMC option
    isn: int | None = None
    segments: dict[int, bytes] = field(default_factory=dict)  # stream offset -> payload
    fin: bool = False

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
    """One captured TCP connection: client -> server and server -> client."""

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


def read_wires(pcap: Path, server_port: int) -> list[Wire]:
    """The TCP connections to ``server_port`` in the capture, in the order of their SYNs,
    both directions reassembled.  A client port may come again (a later connection from
    the same port): a client SYN with a new ISN starts a new connection."""
    wires: dict[int, Wire] = {}  # by the client's port: the latest connection from it
    order: list[Wire] = []
    for frame in pcap_frames(pcap):
        raw = bytes(frame)
        if raw[12:14] != b"\x08\x00" or raw[23] != 6:
            continue
        ip = raw[14:]
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack_from("!H", ip, 2)[0]
        tcp = ip[ihl:total]  # the IP length: no Ethernet padding
        sport, dport, seq = struct.unpack_from("!HHI", tcp)
        if server_port not in (sport, dport):
            continue
        doff, flags = (tcp[12] >> 4) * 4, tcp[13]
        client_port = dport if sport == server_port else sport
        wire = wires.get(client_port)
        if wire is None or (flags & 0x12 == 0x02 and wire.c2s.isn not in (None, seq)):
            wire = wires[client_port] = Wire(Direction(), Direction())
            order.append(wire)
        d = wire.s2c if sport == server_port else wire.c2s
        if flags & 0x02:  # SYN or SYN-ACK
            d.isn, d.syn_option = seq, smc_option(tcp[20:doff])
        if flags & 0x01:
            d.fin = True
        payload = tcp[doff:]
        if payload and d.isn is not None:
            d.segments.setdefault((seq - d.isn - 1) % (1 << 32), payload)
    return order


def split_clc(stream: bytes) -> tuple[list[ClcMessage], bytes]:
    """The CLC messages at the start of a stream (smcr's decoder) and the bytes after them."""
    msgs: list[ClcMessage] = []
    while stream[:4] == EYECATCHER_SMCR and len(stream) >= 8:
        length = struct.unpack_from("!H", stream, 5)[0]
        msgs.append(decode_clc(stream[:length]))
        stream = stream[length:]
    return msgs, stream


@contextlib.contextmanager
def capture(port: int | Sequence[int], roce: bool = False) -> Iterator[Path]:
    """tcpdump on br0 (netns smcnet) of ``tcp port PORT`` (each of several ports, and with
    ``roce`` of RoCEv2, UDP 4791); the file once stopped."""
    ports = [port] if isinstance(port, int) else list(port)
    tmp = Path(tempfile.mkdtemp(prefix="smcr-kernel-smc"))
    os.chmod(tmp, 0o755)
    path = tmp / f"tcp{ports[0]}.pcap"
    flt = " or ".join(f"tcp port {p}" for p in ports)
    flt += (" or udp port 4791" if roce else "") + f" or udp port {MARK_PORT}"
    # --immediate-mode: each packet to the file as it comes; in blocks (the default),
    # those of a block not yet handed over are lost when tcpdump stops
    cap = subprocess.Popen(["ip", "netns", "exec", NETNS, "tcpdump", "-Z", "root", "-i", "br0",
                            "-s", "0", "-U", "--immediate-mode", "-B", "16384",
                            "-w", str(path), flt],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        # live once a marker datagram shows up in the file (the file exists before the
        # filter is attached, and on a loaded machine a fixed wait misses the first SYN)
        wait_for_mark(path, mark_to_guest, timeout=20)
        yield path
        wait_for_mark(path, mark_to_guest, timeout=20)  # everything before it is in
    finally:
        stop_capture(cap)
        if not path.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------ one exchange


@dataclass
class Conn:
    """One connection as the wire showed it."""

    wire: Wire
    client_clc: list[ClcMessage]
    server_clc: list[ClcMessage]
    client_data: bytes  # the client's stream after its CLC messages (a prefix, see read_wires)
    server_data: bytes


@dataclass
class Exchange:
    """What both ends reported and what the wire showed."""

    host: dict[str, Any]  # smc_host's result: conns (info, bytes, digests, seconds), rnic
    guest: dict[str, Any]  # kernel_smc.py's result: conns (diag for AF_SMC, bytes, digests)
    conns: list[Conn]
    guest_role: str
    seed: int  # the i-th connection's pattern is pattern(seed + i, n)
    pcap: Path | None = None  # kept only when asked for (keep_pcap); the caller removes it

    @property
    def smcr(self) -> dict[str, Any]:
        """smcr's record of the first connection."""
        result: dict[str, Any] = self.host["conns"][0]
        return result

    @property
    def kernel(self) -> dict[str, Any]:
        """The guest's record of the first connection."""
        result: dict[str, Any] = self.guest["conns"][0]
        return result

    @property
    def wire(self) -> Wire:
        return self.conns[0].wire

    @property
    def client_clc(self) -> list[ClcMessage]:
        return self.conns[0].client_clc

    @property
    def server_clc(self) -> list[ClcMessage]:
        return self.conns[0].server_clc

    def ends(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(client's records, server's records), one per connection."""
        if self.guest_role == "client":
            return self.guest["conns"], self.host["conns"]
        return self.host["conns"], self.guest["conns"]


def ueid_file(ueids: list[str] | None) -> Path:
    """A UEID table for smcr (``SMCR_UEID_FILE``): these UEIDs, or none (an empty file,
    so that a table of the host, ``/etc/smcr/ueid``, cannot change the outcome)."""
    tmp = Path(tempfile.mkdtemp(prefix="smcr-ueid"))
    os.chmod(tmp, 0o755)
    path = tmp / "ueid"
    path.write_text("".join(u + "\n" for u in ueids or ()))
    path.chmod(0o644)
    return path


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
             nbytes: int = MB, ueids: list[str] | None = None, mode: str = "echo",
             count: int = 1, iters: int = 100, size: int = 1, pause: float = 0.0,
             roce_capture: bool = False, env: dict[str, str] | None = None,
             keep_pcap: bool = False, timeout: float = 120.0,
             aborter: str = "smcr", tool: str = TOOL, guest_env: str = "") -> Exchange:  # fmt: skip
    """``count`` connections between the guest (``guest_role``, AF_SMC or plain ``tcp``)
    and smcr (``SMCR_DISCOVERY=discovery``: ``bpf``, the TCP option, or ``off``; UEIDs
    ``ueids``, and ``env`` for its process), in ``mode`` (module docstring; ``pause``:
    seconds idle between ping-pong round trips; ``abort``: the abort scenarios with
    ``aborter``, ``smcr`` or ``kernel``).  ``timeout`` bounds each end's run.  ``tool``:
    the guest's end (default the kernel's, ``kernel_smc.py``; ``smcr_end.py`` is smcr's
    over the guest's verbs device), run with the environment assignments ``guest_env``."""
    port = next_port()
    seed = port
    table = ueid_file(ueids)
    env = {"SMCR_DISCOVERY": discovery, "SMCR_UEID_FILE": str(table)} | (env or {})
    opts = (f"--port {port} --count {count} --mode {mode} --bytes {nbytes} --seed {seed}"
            f" --iters {iters} --size {size} --pause {pause} --timeout {timeout}"
            f" --aborter {aborter}")  # fmt: skip
    server_mode = mode if mode in ("send", "abort", "hold") else "echo"
    server_opts = opts.replace(f"--mode {mode}", f"--mode {server_mode}")
    try:
        with capture(port, roce_capture) as pcap:
            if guest_role == "client":
                proc = host_proc(["server", *server_opts.split()], env)
                try:
                    assert proc.stdout is not None
                    ready, _, _ = select.select([proc.stdout], [], [], 60.0)
                    assert ready, "smcr's server did not start"
                    assert json.loads(proc.stdout.readline()) == {"listening": port}
                    out = guest.run(f"{guest_env} {tool} client --family {family} "
                                    f"--host {HOST_IP} {opts}",
                                    timeout=timeout * count + 60)  # fmt: skip
                except BaseException:
                    proc.kill()
                    proc.communicate(timeout=10)
                    raise
                host = host_result(proc, 60)
            else:
                ident = guest.run(f"{guest_env} {tool} server --family {family} {server_opts}",
                                  background=True)  # fmt: skip
                guest.wait_listening(ident)
                proc = host_proc(["client", "--host", GUEST_IP, *opts.split()], env)
                host = host_result(proc, timeout * count + 60)
                out = guest.wait(ident, 60)
        conns = []
        for wire in read_wires(pcap, port):
            client_clc, client_data = split_clc(wire.c2s.stream())
            server_clc, server_data = split_clc(wire.s2c.stream())
            conns.append(Conn(wire, client_clc, server_clc, client_data, server_data))
    finally:
        shutil.rmtree(table.parent, ignore_errors=True)
        if not keep_pcap:
            shutil.rmtree(pcap.parent, ignore_errors=True)
    result = json.loads(out.splitlines()[-1])
    return Exchange(host, result, conns, guest_role, seed, pcap if keep_pcap else None)


def check_data(ex: Exchange, nbytes: int, smc: bool = False,
               received_sha256: str | None = None) -> None:  # fmt: skip
    """The pattern of each connection went to the server and came back whole (``echo``)
    or came from the server whole (``send``), as both ends say; on the wire, after the
    CLC messages, the application's bytes and nothing else: all of them over TCP
    (``smc=False``, a fallback) or none (``smc=True``: they went by RDMA WRITE).
    ``received_sha256``: what the receiver must have received instead of the pattern
    (the stream the sender's WRITEs delivered, when they were not the pattern)."""
    clients, servers = ex.ends()
    assert len(clients) == len(servers) == len(ex.conns), (clients, servers, len(ex.conns))
    for i, (client, server, conn) in enumerate(zip(clients, servers, ex.conns, strict=True)):
        digest = pattern_digest(ex.seed + i, nbytes)
        sender, receiver = (server, client) if "sent" in server else (client, server)
        assert sender.get("send_error") is None, sender
        assert (sender["sent"], sender["sent_sha256"]) == (nbytes, digest), sender
        received = (nbytes, received_sha256 or digest)
        assert (receiver["received"], receiver["received_sha256"]) == received, receiver
        if sender is client:  # echo: it came back
            assert (client["received"], client["received_sha256"]) == (nbytes, digest), client
        else:  # the server sent and closed: the client sent nothing
            assert server["received"] == 0, server
        sent_stream, back_stream = ((conn.client_data, conn.server_data) if sender is client
                                    else (conn.server_data, conn.client_data))  # fmt: skip
        if smc:
            assert sent_stream == back_stream == b"", (len(sent_stream), len(back_stream))
            continue
        assert len(sent_stream) >= min(nbytes, 64 * 1024), len(sent_stream)  # a later gap is ok
        data = pattern(ex.seed + i, max(len(sent_stream), len(back_stream)))
        assert sent_stream == data[: len(sent_stream)]
        if sender is client:
            assert back_stream == data[: len(back_stream)]

