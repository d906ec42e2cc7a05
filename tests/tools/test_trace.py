"""smcr trace: a traced process's SMC-R traffic as a pcap that tshark decodes as SMC-R.

Two smcr processes (diag_peers.py) talk SMC-R over the shm RNIC, and over the
RoCE RNIC on loopback (127.0.0.1 to 127.0.0.2: one RNIC each); ``smcr trace
-p SERVER`` runs while the client connects, exchanges 100 x 1000 bytes each way
and closes.  tshark must find the CLC handshake, CONFIRM LINK both ways, CDCs
and RDMA WRITE headers, nothing malformed, with the QPNs and initial PSNs the
CLC messages announced.  Every test has its own diag directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from smcr.tools.tshark import DecodedFrame, decode
from tests.support import stop_capture
from tests.tools.test_observability import REPO, Proc, smcr_json, wait_for

pytestmark = pytest.mark.tshark

NOBODY = 65534


CTRL_C_HEARD = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "from smcr import cli; sys.exit(cli.main(sys.argv[1:]))")
"""``smcr`` with SIGINT as at a terminal: a test run started in the background by a shell
has SIGINT ignored, and the tool (as Python) leaves an ignored SIGINT ignored, so the
tests' Ctrl-C would not reach it."""


class Trace:
    """``smcr trace`` running in the background; started once it says it traces."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", CTRL_C_HEARD, "trace", *args], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=REPO)  # fmt: skip
        assert self.p.stderr is not None
        self.first = self.p.stderr.readline()
        if "tracing pid" not in self.first:
            self.p.kill()
            raise AssertionError(self.first + self.p.communicate()[1])

    def stop(self) -> tuple[int, str, str]:
        """Ctrl-C; exit status, standard output and error."""
        self.p.send_signal(signal.SIGINT)
        out, err = self.p.communicate(timeout=60)
        return self.p.returncode, out, err

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.communicate()


def trace_cmd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "smcr", "trace", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=REPO)  # fmt: skip


def _traced_round_trips(env: dict[str, str], procs: Callable[..., Proc], tracer: Trace,
                        server: Proc, port: str, host: str,
                        extra: dict[str, str]) -> tuple[int, str, str]:  # fmt: skip
    """A client's 100 round trips with the traced server, then its close; once the
    server has let the connection go, the tool is stopped: its status and output."""
    try:
        client = procs("client", port, host, **extra)
        assert client.first[1] == "SMCR"
        client.say("close")
        assert client.p.stdout is not None and client.p.stdout.readline().strip() == "closed"
        assert wait_for(lambda: _connections_gone(env, server.p.pid))
        return tracer.stop()
    finally:
        tracer.kill()


def _connections_gone(env: dict[str, str], pid: int) -> bool:
    rows = smcr_json(env, "ss", "-a")["sockets"]
    return not [r for r in rows
                if r["pid"] == pid and r["mode"] == "SMCR" and r["state"] != "LISTEN"]


def _ints(frame: DecodedFrame, name: str) -> list[int]:
    return [int(v, 0) for v in frame.values(name)]


@pytest.mark.parametrize("rnic", ["shm", "roce"])
def test_trace_decodes_as_smcr(rnic: str, env: dict[str, str], procs: Callable[..., Proc],
                               tmp_path: Path) -> None:  # fmt: skip
    host = "127.0.0.2" if rnic == "roce" else "127.0.0.1"
    extra = {"SMCR_RNIC": rnic}
    server = procs("server", host, **extra)
    port = int(server.first[1])
    pcap = tmp_path / "trace.pcap"
    tracer = Trace(env, "-w", str(pcap), "-p", str(server.p.pid), "--json")
    status, out, err = _traced_round_trips(env, procs, tracer, server, str(port), host, extra)
    assert status == 0, err
    summary = json.loads(out)
    (proc,) = summary["processes"]
    assert proc["pid"] == server.p.pid and proc["records"] > 300
    assert (proc["dropped"], proc["bad"], proc["unframed"]) == (0, 0, 0)
    frames = decode(pcap)
    assert summary["frames"] == len(frames)
    assert [(f.number, f.errors) for f in frames if f.malformed or f.errors] == []
    _check_conversation(frames, port)


def _check_conversation(frames: list[DecodedFrame], port: int) -> None:
    """CLC, CONFIRM LINK, CDCs, WRITEs, with the QPNs and PSNs the CLC announced."""
    clc = [f for f in frames if f.values("smc.clc_msg")]
    assert [int(f.first("smc.clc_msg")) for f in clc] == [1, 2, 3]  # Proposal, Accept, Confirm
    assert all(int(f.first("tcp.srcport")) == port or int(f.first("tcp.dstport")) == port
               for f in clc)  # fmt: skip
    syn = [f for f in frames if f.values("tcp.flags.syn") and f.first("tcp.flags.syn") in
           ("1", "True")]  # fmt: skip
    assert len(syn) == 2  # SYN and SYN-ACK, with the SMC option
    accept, confirm = clc[1], clc[2]
    server_qpn = int(accept.first("smc.accept.server.qp.number"), 0)
    client_qpn = int(confirm.first("smc.confirm.client.qp.number"), 0)
    server_psn = int(accept.first("smc.accept.initial.psn"), 0)
    client_psn = int(confirm.first("smc.initial.psn"), 0)
    roce = [f for f in frames if "infiniband" in f.protocols]
    to_client = [f for f in roce if _ints(f, "infiniband.bth.destqp") == [client_qpn]]
    to_server = [f for f in roce if _ints(f, "infiniband.bth.destqp") == [server_qpn]]
    assert len(to_client) + len(to_server) == len(roce)
    # the first packet each way carries the initial PSN its CLC message announced
    assert _ints(to_client[0], "infiniband.bth.psn") == [server_psn]
    assert _ints(to_server[0], "infiniband.bth.psn") == [client_psn]
    for way in (to_client, to_server):  # and the PSNs go on without a gap (one packet each)
        psns = [_ints(f, "infiniband.bth.psn")[0] for f in way]
        assert psns == [(psns[0] + i) & 0xFFFFFF for i in range(len(psns))]
    # first contact: CONFIRM LINK from the server, its response from the client
    links = [(f in to_client, int(f.first("smc.confirm.link.response")))
             for f in roce if _ints(f, "smc.llc_msg") == [1]]  # fmt: skip
    assert links == [(True, 0), (False, 1)]
    for way in (to_client, to_server):
        cdcs = [f for f in way if _ints(f, "smc.llc_msg") == [0xFE]]
        assert len(cdcs) >= 100
        assert any(f.first("smc.rmbe.ctrl.peer.closed.conn") in ("1", "True") for f in cdcs)
        writes = [f for f in way if _ints(f, "infiniband.bth.opcode") == [10]]  # WRITE Only
        assert sum(int(f.first("infiniband.reth.dmalen")) for f in writes) == 100 * 1000


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_trace_of_links_up_before_it_decodes(version: str, env: dict[str, str],
                                               procs: Callable[..., Proc],
                                               tmp_path: Path) -> None:  # fmt: skip
    """A trace that starts while RoCE links exist: the client's first connection has
    talked already; during the trace it talks again, and a second connection comes on
    the link group there is (CLC without first contact, no CONFIRM LINK).  Every SEND
    decodes as SMC-R and nothing is malformed; each way's PSNs run on without a gap from
    the RNIC's; the WRITEs carry what was sent.  With SMC-Rv2 (a UEID in common) the LLC
    messages are v2 ones, whose length Linux (and so smcr) writes in host order where
    Wireshark reads big-endian: its heuristic skips them (as in the kernel's own
    capture, ``shared/golden``), so there they are only counted, not decoded."""
    extra = {"SMCR_RNIC": "roce"}
    if version == "v2":
        ueid = tmp_path / "ueid"
        ueid.write_text("SMCR-TRACE-TEST\n")
        extra["SMCR_UEID_FILE"] = str(ueid)
    server = procs("server", "127.0.0.2", **extra)
    port = server.first[1]
    client = procs("client", port, "127.0.0.2", **extra)
    assert client.first[1] == "SMCR"
    pcap = tmp_path / "trace.pcap"
    tracer = Trace(env, "-w", str(pcap), "-p", str(server.p.pid), "--json")
    try:
        client.say("talk")
        assert client.p.stdout is not None
        assert client.p.stdout.readline().split() == ["talked", "SMCR", "SMCR"]
        client.say("close")
        assert client.p.stdout.readline().strip() == "closed"
        assert wait_for(lambda: _connections_gone(env, server.p.pid))
        status, out, err = tracer.stop()
    finally:
        tracer.kill()
    assert status == 0, err
    (proc,) = json.loads(out)["processes"]
    assert (proc["dropped"], proc["bad"], proc["unframed"]) == (0, 0, 0)
    frames = decode(pcap)
    assert [(f.number, f.errors) for f in frames if f.malformed or f.errors] == []
    clc = [int(f.first("smc.clc_msg")) for f in frames if f.values("smc.clc_msg")]
    assert clc == [1, 2, 3]  # the second connection's; the first's was before the trace
    roce = [f for f in frames if "infiniband" in f.protocols]
    sends = [f for f in roce if _ints(f, "infiniband.bth.opcode") == [4]]
    llc = [f for f in sends if not f.values("smc.llc_msg")]
    if version == "v1":
        assert llc == []
    else:
        assert all(f.first("infiniband.bth.destqp") for f in llc)  # framed, not decoded
    assert not [f for f in sends if _ints(f, "smc.llc_msg") == [1]]  # no CONFIRM LINK
    ways: dict[int, list[DecodedFrame]] = {}
    for f in roce:
        ways.setdefault(_ints(f, "infiniband.bth.destqp")[0], []).append(f)
    assert len(ways) == 2
    for way in ways.values():
        psns = [_ints(f, "infiniband.bth.psn")[0] for f in way]
        assert psns == [(psns[0] + i) & 0xFFFFFF for i in range(len(psns))]
        cdcs = [f for f in way if _ints(f, "smc.llc_msg") == [0xFE]]
        assert len(cdcs) >= 200  # 100 round trips on each connection, each way
        writes = [f for f in way if _ints(f, "infiniband.bth.opcode") == [10]]
        assert sum(int(f.first("infiniband.reth.dmalen")) for f in writes) == 2 * 100 * 1000


def _bth_rows(pcap: Path) -> list[tuple[str, ...]]:
    """(source, destination, opcode, dest QP, PSN, DMA length) of every RoCE packet but ACKs."""
    out = subprocess.run(["tshark", "-n", "-r", str(pcap), "-Y",
                          "infiniband && infiniband.bth.opcode != 17", "-T", "fields",
                          "-e", "ip.src", "-e", "ip.dst", "-e", "infiniband.bth.opcode",
                          "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.psn",
                          "-e", "infiniband.reth.dmalen"], capture_output=True, text=True,
                         check=True, timeout=120)  # fmt: skip
    return [tuple(line.split("\t")) for line in out.stdout.splitlines()]


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("dumpcap") is None,
                    reason="needs root and dumpcap (a capture on lo)")
def test_over_roce_the_trace_has_the_packets_of_the_wire(
        env: dict[str, str], procs: Callable[..., Proc]) -> None:  # fmt: skip
    """Over RoCE the trace's QPNs and PSNs are the real ones: every packet a capture of lo
    sees between the two RNICs (ACKs aside) is in the trace, in order, with the same
    addresses, opcode, QP, PSN and length.  (lo hands the capture each GSO datagram
    unsegmented, so it shows the first packet of each; the trace has them all.)"""
    directory = Path(tempfile.mkdtemp(prefix="smcr-trace-"))
    os.chmod(directory, 0o755)  # dumpcap may drop to another user
    wire, traced = directory / "wire.pcapng", directory / "trace.pcap"
    cap = subprocess.Popen(["dumpcap", "-q", "-i", "lo", "-f", "udp port 4791", "-w",
                            str(wire)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as mark:
            def live() -> bool:  # a datagram of ours is in the file: it captures
                mark.sendto(b"mark", ("127.255.255.254", 4791))
                return wire.exists() and wire.stat().st_size > 1024
            assert wait_for(live)
        extra = {"SMCR_RNIC": "roce"}
        server = procs("server", "127.0.0.2", **extra)
        tracer = Trace(env, "-w", str(traced), "-p", str(server.p.pid))
        status, _out, err = _traced_round_trips(env, procs, tracer, server, server.first[1],
                                                "127.0.0.2", extra)  # fmt: skip
        assert status == 0, err
        stop_capture(cap)
        in_trace = _bth_rows(traced)
        ends = {row[0] for row in in_trace}
        assert len(ends) == 2
        on_wire = [row for row in _bth_rows(wire) if row[0] in ends and row[1] in ends]
        assert len(on_wire) >= 100  # (GSO datagrams show one packet each: not all 400)
        for src in ends:  # each way in PSN order (the two ways interleave as they may)
            wire_way = list(dict.fromkeys(r for r in on_wire if r[0] == src))  # (resent once)
            trace_way = [r for r in in_trace if r[0] == src]
            at = 0
            for row in wire_way:
                at = trace_way.index(row, at) + 1  # ValueError: a packet the trace lacks
    finally:
        if cap.poll() is None:
            stop_capture(cap)
        shutil.rmtree(directory, ignore_errors=True)


def test_pid_that_cannot_be_traced(env: dict[str, str], procs: Callable[..., Proc],
                                   tmp_path: Path) -> None:  # fmt: skip
    pcap = tmp_path / "x.pcap"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        out = trace_cmd(env, "-w", str(pcap), "-p", str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert out.returncode == 1
    assert f"pid {sleeper.pid}: not an smcr process" in out.stderr
    out = trace_cmd(env, "-w", str(pcap), "-p", str(sleeper.pid))  # reaped now
    assert out.returncode == 1 and f"pid {sleeper.pid}: no such process" in out.stderr
    assert not pcap.exists()
    server = procs("server")
    pcap.write_bytes(b"")  # an existing file is never written through
    out = trace_cmd(env, "-w", str(pcap), "-p", str(server.p.pid))
    assert out.returncode == 1 and "exists" in out.stderr
    assert pcap.read_bytes() == b""
    if os.geteuid() == 0:
        status, text = _as_nobody(env, ["trace", "-w", str(tmp_path / "y.pcap"),
                                        "-p", str(server.p.pid)])  # fmt: skip
    else:
        status, text = _trace_pid_1(env, tmp_path)
    assert status == 1, text
    assert "not yours" in text


def _trace_pid_1(env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    out = trace_cmd(env, "-w", str(tmp_path / "y.pcap"), "-p", "1")
    return out.returncode, out.stderr


def _as_nobody(env: dict[str, str], argv: list[str]) -> tuple[int, str]:
    """``smcr`` run by uid nobody: a forked child of this process (nobody cannot run
    this virtualenv's interpreter), its exit status and output."""
    import smcr.tools.trace  # noqa: F401, PLC0415 - imported before the fork: nobody cannot
    from smcr import cli  # noqa: PLC0415 - read this virtualenv

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            os.close(r)
            sys.stdout = sys.stderr = os.fdopen(w, "w", buffering=1)
            os.environ.clear()
            os.environ.update(env)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = cli.main(argv)
        except BaseException as exc:
            print(f"child failed: {exc!r}", file=sys.stderr)
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


def test_a_killed_tool_leaves_the_process_working(env: dict[str, str],
                                                  procs: Callable[..., Proc],
                                                  tmp_path: Path) -> None:  # fmt: skip
    server = procs("server")
    port = int(server.first[1])
    first = Trace(env, "-w", str(tmp_path / "a.pcap"), "-p", str(server.p.pid))
    os.kill(first.p.pid, signal.SIGSTOP)  # a tool that reads nothing, then dies
    try:
        client = procs("client", str(port))  # 100 round trips while the tool sleeps
        assert client.first[1] == "SMCR"
    finally:
        first.kill()
    # the process notices the tool's end and takes its hooks away: it can be traced again
    def again() -> Trace | None:
        try:
            return Trace(env, "-w", str(tmp_path / f"b{time.monotonic_ns()}.pcap"),
                         "-p", str(server.p.pid), "--json")  # fmt: skip
        except AssertionError as exc:
            assert "traced already" in str(exc), exc
            return None

    second = wait_for(again)
    assert second is not None
    try:
        client2 = procs("client", str(port))  # and it still serves SMC-R
        assert client2.first[1] == "SMCR"
        client.say("close")
        assert client.p.stdout is not None and client.p.stdout.readline().strip() == "closed"
        status, out, err = second.stop()
    finally:
        second.kill()
    assert status == 0, err
    (proc,) = json.loads(out)["processes"]
    assert proc["records"] > 300 and proc["dropped"] == 0


def test_stdout_and_count(env: dict[str, str], procs: Callable[..., Proc]) -> None:
    """``-w -`` streams the pcap to standard output; ``-c N`` stops after N frames; without
    ``-p`` every smcr process of the user is traced (here: the server, in this test's
    diag directory)."""
    server = procs("server")
    tool = subprocess.Popen([sys.executable, "-m", "smcr", "trace", "-w", "-", "-c", "5"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO)  # fmt: skip
    try:
        assert tool.stderr is not None
        assert f"tracing pid {server.p.pid} (".encode() in tool.stderr.readline()
        procs("client", str(server.first[1]))
        out, err = tool.communicate(timeout=60)
    finally:
        if tool.poll() is None:
            tool.kill()
            tool.communicate()
    assert tool.returncode == 0, err
    records = _pcap_records(out)
    assert len(records) == 5  # SYN, SYN-ACK, ACK, Proposal, Accept
    assert b"5 frames written to -" in err


def _pcap_records(data: bytes) -> list[bytes]:
    assert struct.unpack_from("<I", data)[0] == 0xA1B2C3D4
    off, out = 24, []
    while off < len(data):
        _sec, _usec, incl, _orig = struct.unpack_from("<IIII", data, off)
        out.append(data[off + 16 : off + 16 + incl])
        off += 16 + incl
    return out
