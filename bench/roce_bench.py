"""RDMA WRITE bandwidth of the RoCEv2 RNIC between two namespaces, beside Python TCP.

Run as root: ``python bench/roce_bench.py [--seconds 3] [--size 1048576] [--profile]
[--only write|pingpong]``.
It builds two network namespaces joined by a veth pair (MTU 9000, so path MTU
4096), then in the same run measures

* Python TCP over that veth (``sendall`` of 1 MiB buffers to a ``recv_into`` loop),
* a plain Python UDP loop of 4140-byte datagrams (``sendto``/``recv_into``): the
  per-packet floor a user-space RNIC starts from,
* RDMA WRITE from a process in one namespace into an MR of a process in the
  other: ``--depth`` WRITEs of ``--size`` bytes kept outstanding, all signaled,

then a SEND ping-pong of 44-byte messages (SMC-R's CDC size), and prints MB/s,
packets/s, CPU time, round-trip times, retransmissions and, with ``--profile``, the top
functions of each side's threads (cProfile per thread: the poster and the
progress thread).  The namespaces are removed at the end.

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.roce.netns import Hosts  # noqa: E402

from smcr.rdma import AccessFlag, PathMtu, RecvWr, SendFlag, SendWr, Sge, WrOpcode  # noqa: E402
from smcr.rdma import eventloop as engine_module  # noqa: E402
from smcr.rdma.roce import RoceDevice  # noqa: E402

RW = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE | AccessFlag.REMOTE_READ
TCP_PORT = 5201


# ------------------------------------------------------------------ child roles


def _profiled_engine(profiles: list[cProfile.Profile]) -> None:
    """Run every device progress thread under its own cProfile."""
    original = engine_module.Engine._run

    def run(self: engine_module.Engine) -> None:
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()
        try:
            original(self)
        finally:
            prof.disable()

    engine_module.Engine._run = run  # type: ignore[method-assign]


def _top(profiles: list[cProfile.Profile], n: int = 14) -> str:
    out = io.StringIO()
    for i, prof in enumerate(profiles):
        out.write(f"--- thread {i}\n")
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(n)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    return "\n".join(ln for ln in lines if not ln.startswith(("Ordered", "   List")))


def _cpu(since: resource.struct_rusage) -> tuple[float, float]:
    """(user, system) CPU seconds of this process since ``since``."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return (now.ru_utime - since.ru_utime, now.ru_stime - since.ru_stime)


def _say(obj: Any) -> None:
    print(json.dumps(obj), flush=True)


def _hear() -> Any:
    return json.loads(sys.stdin.readline())


def roce_role(role: str, address: str, args: argparse.Namespace) -> None:
    """One RNIC end: ``sink`` (exposes an MR) or ``source`` (WRITEs into it)."""
    profiles: list[cProfile.Profile] = []
    if args.profile:
        _profiled_engine(profiles)
    dev = RoceDevice(address, verify_icrc=not args.no_icrc_check, gso=not args.no_gso)
    pd = dev.alloc_pd()
    cq = dev.create_cq()
    qp = pd.create_qp(cq, cq)
    mr = pd.alloc_mr(args.size * args.depth, RW)
    _say({"gid": dev.gid.hex(), "qpn": qp.qp_num, "rkey": mr.rkey, "addr": mr.addr})
    peer = _hear()
    qp.to_rts(dgid=bytes.fromhex(peer["gid"]), dest_qp_num=peer["qpn"], rq_psn=7, sq_psn=7,
              access=RW, path_mtu=PathMtu.MTU_4096, timeout=14)  # fmt: skip
    _say("up")
    if role in ("ping", "pong"):
        main_prof = cProfile.Profile() if args.profile else None
        if main_prof:
            main_prof.enable()
        result = _ping_pong(role == "ping", qp, cq, mr, args)
        if main_prof:
            main_prof.disable()
            profiles.append(main_prof)
        dev.close()
        result["profile"] = _top(profiles)
        _say(result)
        return
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    if role == "sink":
        _hear()  # "done"
        cpu = _cpu(cpu0)
        dev.close()
        _say({"stats": dev.stats, "resp": qp.resp.stats, "profile": _top(profiles), "cpu": cpu})
        return
    main_prof = cProfile.Profile() if args.profile else None
    wrs = [SendWr(wr_id=i, opcode=WrOpcode.RDMA_WRITE, send_flags=SendFlag.SIGNALED,
                  sg_list=(Sge(mr.addr + i * args.size, args.size, mr.lkey),),
                  remote_addr=peer["addr"] + i * args.size, rkey=peer["rkey"])
           for i in range(args.depth)]  # fmt: skip
    if main_prof:
        main_prof.enable()
    t0 = time.monotonic()
    end = t0 + args.seconds
    done = 0
    qp.post_send(wrs)
    errors = 0
    while True:
        for wc in cq.wait(2.0, args.depth):
            if wc.status.value:
                errors += 1
                continue
            done += wc.byte_len
            if time.monotonic() < end:
                qp.post_send(wrs[wc.wr_id])
        if time.monotonic() >= end and not qp.req.wqes:
            break
        if errors:
            break
    elapsed = time.monotonic() - t0
    if main_prof:
        main_prof.disable()
        profiles.append(main_prof)
    stats = dict(qp.req.stats)
    cpu = _cpu(cpu0)
    dev.close()
    _say({"bytes": done, "seconds": elapsed, "errors": errors, "req": stats, "cpu": cpu,
          "dev": dev.stats, "threads": threading.active_count(), "profile": _top(profiles)})


def _ping_pong(ping: bool, qp: Any, cq: Any, mr: Any, args: argparse.Namespace) -> dict[str, Any]:
    """44-byte SENDs back and forth (SMC-R's CDC size), signaled and solicited."""
    rounds = args.rounds
    recv = [RecvWr(wr_id=1000 + i, sg_list=(Sge(mr.addr + 64 * i, 64, mr.lkey),))
            for i in range(16)]  # fmt: skip
    qp.post_recv(recv)
    send = SendWr(wr_id=1, opcode=WrOpcode.SEND, send_flags=SendFlag.SIGNALED
                  | SendFlag.SOLICITED, sg_list=(Sge(mr.addr + 4096, 44, mr.lkey),))  # fmt: skip
    if not ping:
        _say("ready")
    else:
        _hear()
    samples: list[float] = []
    for _ in range(rounds):
        t0 = time.monotonic()
        if ping:
            qp.post_send(send)
        got = False
        while not got:  # send completions pass by; a round ends with the peer's SEND
            wcs = cq.wait(5.0)
            if not wcs:
                raise TimeoutError("no completion in 5 s")
            for wc in wcs:
                if wc.wr_id >= 1000:
                    got = True
                    qp.post_recv(recv[wc.wr_id - 1000])
        if not ping:
            qp.post_send(send)
        samples.append(time.monotonic() - t0)
    samples.sort()
    return {"median_us": samples[len(samples) // 2] * 1e6,
            "p99_us": samples[len(samples) * 99 // 100] * 1e6}


def tcp_role(role: str, address: str, args: argparse.Namespace) -> None:
    """Python TCP over the same veth: ``sink`` reads into a buffer, ``source`` sendalls."""
    buf = bytearray(1 << 20)
    if role == "sink":
        with socket.create_server((address, TCP_PORT)) as srv:
            _say("ready")
            conn, _ = srv.accept()
            with conn:
                view = memoryview(buf)
                while conn.recv_into(view):
                    pass
        _say("done")
        return
    with socket.create_connection((address, TCP_PORT)) as s:
        t0 = time.monotonic()
        end = t0 + args.seconds
        sent = 0
        while time.monotonic() < end:
            s.sendall(buf)
            sent += len(buf)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
        elapsed = time.monotonic() - t0
    _say({"bytes": sent, "seconds": elapsed})


def udp_role(role: str, address: str, args: argparse.Namespace) -> None:
    """A plain Python UDP loop, 4140-byte datagrams (a RoCE packet's size): the floor."""
    buf = bytearray(4140)
    if role == "sink":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            s.bind((address, TCP_PORT))
            s.settimeout(1.0)
            _say("ready")
            got = 0
            t0 = t1 = 0.0
            while True:
                try:
                    s.recv_into(buf)
                except TimeoutError:
                    break
                t1 = time.monotonic()
                if not got:
                    t0 = t1
                got += 1
        _say({"packets": got, "seconds": t1 - t0})
        return
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        end = time.monotonic() + args.seconds
        sent = 0
        while time.monotonic() < end:
            for _ in range(100):
                s.sendto(buf, (address, TCP_PORT))
            sent += 100
    _say({"sent": sent})


# ---------------------------------------------------------------------- driver


def _spawn(ns: str, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__, *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip


def _ask(p: subprocess.Popen[str], msg: Any = None) -> Any:
    assert p.stdin is not None and p.stdout is not None
    if msg is not None:
        p.stdin.write(json.dumps(msg) + "\n")
        p.stdin.flush()
    return json.loads(p.stdout.readline())


def _pingpong(hosts: Hosts, common: list[str]) -> tuple[Any, Any]:
    pong = _spawn(hosts.ns[1], "--role", "roce-pong", "--address", hosts.addr[1], *common)
    ping = _spawn(hosts.ns[0], "--role", "roce-ping", "--address", hosts.addr[0], *common)
    info_pong, info_ping = _ask(pong), _ask(ping)
    assert _ask(pong, info_ping) == "up" and _ask(ping, info_pong) == "up"
    assert _ask(pong) == "ready"
    lat = _ask(ping, "go")
    pong_out = _ask(pong)
    for p in (pong, ping):
        p.wait(10)
    return lat, pong_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=1 << 20, help="bytes per WRITE")
    ap.add_argument("--depth", type=int, default=4, help="WRITEs outstanding")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-icrc-check", action="store_true",
                    help="skip ICRC verification on receive (to see what it costs)")
    ap.add_argument("--no-gso", action="store_true", help="one packet per system call")
    ap.add_argument("--rounds", type=int, default=2000, help="SEND ping-pong round trips")
    ap.add_argument("--only", choices=("write", "pingpong"),
                    help="run only the RDMA WRITE (with TCP) or only the ping-pong")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        kind, role = args.role.split("-")
        {"roce": roce_role, "tcp": tcp_role, "udp": udp_role}[kind](role, args.address, args)
        return
    common = ["--seconds", str(args.seconds), "--size", str(args.size), "--depth",
              str(args.depth), "--rounds", str(args.rounds)]
    common += ["--profile"] if args.profile else []
    common += ["--no-icrc-check"] if args.no_icrc_check else []
    common += ["--no-gso"] if args.no_gso else []
    with Hosts(mtu=9000) as hosts:
        if args.only == "pingpong":
            lat, pong_out = _pingpong(hosts, common)
            print(f"SEND ping-pong, 44 B: median {lat['median_us']:.0f} us, "
                  f"p99 {lat['p99_us']:.0f} us per round trip ({args.rounds} rounds)")
            if args.profile:
                print("\n=== ping ===\n" + lat["profile"])
                print("\n=== pong ===\n" + pong_out["profile"])
            return
        sink = _spawn(hosts.ns[1], "--role", "tcp-sink", "--address", hosts.addr[1], *common)
        assert _ask(sink) == "ready"
        src = _spawn(hosts.ns[0], "--role", "tcp-source", "--address", hosts.addr[1], *common)
        tcp = _ask(src)
        _ask(sink)
        udp, udp_sent = {"packets": 0, "seconds": 1.0}, 0
        if args.only is None:
            sink = _spawn(hosts.ns[1], "--role", "udp-sink", "--address", hosts.addr[1],
                          *common)  # fmt: skip
            assert _ask(sink) == "ready"
            src = _spawn(hosts.ns[0], "--role", "udp-source", "--address", hosts.addr[1],
                         *common)  # fmt: skip
            udp_sent = _ask(src)["sent"]
            udp = _ask(sink)
        sink = _spawn(hosts.ns[1], "--role", "roce-sink", "--address", hosts.addr[1], *common)
        src = _spawn(hosts.ns[0], "--role", "roce-source", "--address", hosts.addr[0], *common)
        info_sink, info_src = _ask(sink), _ask(src)
        assert _ask(sink, info_src) == "up" and _ask(src, info_sink) == "up"
        roce = _ask(src)
        sink_out = _ask(sink, "done")
        for p in (sink, src):
            p.wait(10)
        lat = pong_out = {"median_us": 0.0, "p99_us": 0.0, "profile": ""}
        if args.only is None:
            lat, pong_out = _pingpong(hosts, common)
    tcp_mbs = tcp["bytes"] / tcp["seconds"] / 1e6
    roce_mbs = roce["bytes"] / roce["seconds"] / 1e6
    pkts = roce["req"]["packets"] / roce["seconds"]
    print(f"veth MTU 9000, path MTU 4096, {args.seconds:.1f} s each, WRITE {args.size} B x "
          f"{args.depth} outstanding")
    print(f"Python TCP       : {tcp_mbs:9.1f} MB/s")
    print(f"Python UDP loop  : {udp['packets'] / udp['seconds']:9,.0f} datagrams/s of 4140 B "
          f"received ({udp['packets']:,} of {udp_sent:,} sent)")
    print(f"RoCEv2 RDMA WRITE: {roce_mbs:9.1f} MB/s  ({roce_mbs / tcp_mbs:.2f}x TCP), "
          f"{pkts:,.0f} packets/s sent")
    print(f"requester: {roce['req']}  errors: {roce['errors']}")
    for side, out in (("source", roce), ("sink", sink_out)):
        user, system = out["cpu"]
        print(f"{side} CPU: user {user:.2f} s, system {system:.2f} s "
              f"({(user + system) / roce['seconds']:.0%} of one core)")
    print(f"sink device: {sink_out['stats']}  responder: {sink_out['resp']}")
    if args.only is None:
        print(f"SEND ping-pong, 44 B: median {lat['median_us']:.0f} us, "
              f"p99 {lat['p99_us']:.0f} us per round trip ({args.rounds} rounds)")
    if args.profile:
        print("\n=== source (poster + progress thread) ===\n" + roce["profile"])
        print("\n=== sink (progress thread) ===\n" + sink_out["profile"])
        if args.only is None:
            print("\n=== ping (progress thread + application) ===\n" + lat["profile"])
            print("\n=== pong (progress thread + application) ===\n" + pong_out["profile"])


if __name__ == "__main__":
    main()
