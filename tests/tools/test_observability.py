"""smcr ss / stats / linkgroup / device / chk / top across processes (smcr.diag).

Two smcr processes are connected (shm RNIC) and a third -- the ``smcr``
command -- reports them.  Every test has its own diag directory
(``SMCR_DIAG_DIR``): other people's smcr processes on this host stay out of it.
Waits are for conditions, with deadlines.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from smcr.diag import paths, protocol
from smcr.stack.counters import bucket_of
from smcr.stack.runtime import BUFFER

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class Proc:
    """A peer program (diag_peers.py) with its own line protocol."""

    def __init__(self, env: dict[str, str], *args: str, netns: str | None = None) -> None:
        inside = ["ip", "netns", "exec", netns] if netns else []
        self.p = subprocess.Popen([*inside, sys.executable, str(HERE / "diag_peers.py"), *args],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env, cwd=REPO)  # fmt: skip
        assert self.p.stdout is not None
        self.first = self.p.stdout.readline().split()
        assert self.first and self.first[0] == "ready", self.first

    def say(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def exit(self) -> None:
        self.say("exit")
        assert self.p.wait(60) == 0

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def stop(self) -> None:
        """At the end of a test: leave normally if it still can (its atexit work runs:
        coverage's data among it), else be killed."""
        if self.p.poll() is None:
            try:
                self.say("exit")
                self.p.wait(20)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


def smcr_cmd(env: dict[str, str], *args: str, check: bool = True) -> str:
    """Run the ``smcr`` command (a third process); its standard output."""
    out = subprocess.run([sys.executable, "-m", "smcr", *args], env=env, capture_output=True,
                         text=True, timeout=120, check=False, cwd=REPO)  # fmt: skip
    if check:
        assert out.returncode == 0, out.stderr
    return out.stdout


def smcr_json(env: dict[str, str], *args: str) -> Any:
    return json.loads(smcr_cmd(env, *args, "--json"))


def wait_for(probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def pair(procs: Callable[..., Proc]) -> tuple[Proc, Proc, int]:
    server = procs("server")
    port = int(server.first[1])
    client = procs("client", str(port))
    assert client.first[1] == "SMCR"
    return server, client, port


def test_ss_sees_two_processes(env: dict[str, str], procs: Callable[..., Proc]) -> None:
    server, client, port = pair(procs)
    plain_port = int(client.first[2])
    sp, cp = server.p.pid, client.p.pid

    def rows() -> list[dict[str, Any]]:
        got = smcr_json(env, "ss", "-a")["sockets"]
        return got if len(got) >= 4 else []  # (the plain client is no smcr socket)

    got = wait_for(rows)
    by = {(r["pid"], r["state"], r["mode"]): r for r in got}
    listen = by[(sp, "LISTEN", "SMCR")]
    assert listen["local"] == f"127.0.0.1:{port}"
    srv = by[(sp, "ACTIVE", "SMCR")]
    cli = by[(cp, "ACTIVE", "SMCR")]
    assert srv["local"] == cli["peer"] and srv["peer"] == cli["local"]
    assert (srv["role"], cli["role"]) == ("SERV", "CLNT")
    assert srv["peer_gid"] == cli["gid"] and cli["peer_gid"] == srv["gid"]
    assert cli["tx_bytes"] == cli["rx_bytes"] == 100_000
    fallback = by[(sp, "ACTIVE", "TCP")]
    assert fallback["peer"] == f"127.0.0.1:{plain_port}"
    assert (fallback["local_code"], fallback["peer_code"]) == (0x03010000, 0)
    assert fallback["mode_text"] == "TCP 0x03010000/0x00000000"
    assert all(r["uid"] == os.getuid() and r["inode"] > 0 for r in got)
    assert {r["command"] for r in got} == {"python"} or all(r["command"] for r in got)

    table = smcr_cmd(env, "ss")
    head = table.splitlines()[0].split()
    assert head[:9] == ["State", "UID", "Inode", "Local", "Address", "Peer", "Address", "Intf",
                        "Mode"] and head[-2:] == ["PID", "Command"]  # fmt: skip
    assert "LISTEN" not in table  # hidden without -a, as smcss hides it
    assert "TCP 0x03010000/0x00000000" in table and " SMCR " in table
    assert "LISTEN" in smcr_cmd(env, "ss", "-l")
    assert "TCP 0x" not in smcr_cmd(env, "ss", "-R")
    debug = smcr_cmd(env, "ss", "-d")
    assert "rxprod-Cursor" in debug and "0000:000186a0" in debug  # 100000 bytes each way


@pytest.mark.root
def test_roce_processes_in_two_namespaces_seen_from_a_third(env: dict[str, str],
                                                            procs: Callable[..., Proc]) -> None:
    """Two smcr processes in their own network namespaces, joined by RoCE over a veth
    pair: ``ss``, ``linkgroup`` and ``stats`` run in the host's namespace see both, each
    with its namespace, RNIC, net device and GIDs, and their link group from both ends."""
    from tests.roce.netns import Hosts  # noqa: PLC0415 - needs root

    with Hosts() as hosts:
        server = procs("server", hosts.addr[0], netns=hosts.ns[0], SMCR_RNIC="roce")
        port = int(server.first[1])
        client = procs("client", str(port), hosts.addr[0], netns=hosts.ns[1], SMCR_RNIC="roce")
        assert client.first[1] == "SMCR"
        sp, cp = server.p.pid, client.p.pid
        assert sp != cp

        def rows() -> list[dict[str, Any]]:
            got = [r for r in smcr_json(env, "ss", "-a")["sockets"] if r["mode"] == "SMCR"]
            return got if len(got) >= 3 else []

        by = {(r["pid"], r["state"]): r for r in wait_for(rows)}
        srv, cli = by[(sp, "ACTIVE")], by[(cp, "ACTIVE")]
        assert by[(sp, "LISTEN")]["local"] == f"{hosts.addr[0]}:{port}"
        assert srv["local"] == cli["peer"] and srv["peer"] == cli["local"]
        assert (srv["device"], srv["netdev"]) == ("roce_veth0", "veth0")
        assert (cli["device"], cli["netdev"]) == ("roce_veth1", "veth1")
        assert srv["gid"] == cli["peer_gid"] == f"::ffff:{hosts.addr[0]}"
        assert cli["gid"] == srv["peer_gid"] == f"::ffff:{hosts.addr[1]}"
        assert srv["netns"] != cli["netns"] and own_netns() not in (srv["netns"], cli["netns"])
        assert cli["tx_bytes"] == cli["rx_bytes"] == 100_000

        groups = {(g["pid"], g["role"]): g for g in smcr_json(env, "linkgroup")["linkgroups"]}
        mine, theirs = groups[(sp, "SERV")], groups[(cp, "CLNT")]
        for group, netdev in ((mine, "veth0"), (theirs, "veth1")):
            assert group["type"] == "SINGLE" and group["conns"] == 1
            (link,) = group["links"]
            assert link["state"] == "LINK_ACTIVE" and link["netdev"] == netdev
        assert mine["links"][0]["qpn"] == theirs["links"][0]["peer_qpn"]
        assert mine["links"][0]["peer_qpn"] == theirs["links"][0]["qpn"]

        counts = smcr_json(env, "stats")["SMCR"]
        assert counts["srv_v1_succ_cnt"] + counts["srv_v2_succ_cnt"] >= 1
        assert counts["clnt_v1_succ_cnt"] + counts["clnt_v2_succ_cnt"] >= 1
        for p in (client, server):
            p.exit()


def own_netns() -> int:
    """The inode of this process's network namespace."""
    return os.stat("/proc/self/ns/net").st_ino


def test_closing_states_and_linkgroups(env: dict[str, str], procs: Callable[..., Proc]) -> None:
    server, client, _ = pair(procs)
    groups = wait_for(lambda: smcr_json(env, "linkgroup")["linkgroups"])
    roles = sorted((g["pid"], g["role"], g["type"], len(g["links"])) for g in groups)
    assert roles == sorted([(server.p.pid, "SERV", "SINGLE", 1),
                            (client.p.pid, "CLNT", "SINGLE", 1)])  # fmt: skip
    links = smcr_cmd(env, "linkgroup", "link-show", "-dd")
    assert "LINK_ACTIVE" in links and "Local-GID" in links
    devices = {d["name"]: d for d in smcr_json(env, "device")}
    shm = [d for d in devices.values() if d["type"] == "shm" and d["links"]]
    # (the device list shows this user's shm RNICs; ours have a link each, no failover)
    assert all(d["crit"] == "Yes" for d in shm)

    client.say("close")
    assert client.p.stdout is not None and client.p.stdout.readline().strip() == "closed"

    def server_state() -> str:
        """The server connection's state once it is no longer ACTIVE ("gone" once it has
        left the table); "" while it is ACTIVE (wait_for goes on)."""
        rows = smcr_json(env, "ss", "-a")["sockets"]
        states = [r["state"] for r in rows if r["pid"] == server.p.pid and r["mode"] == "SMCR"
                  and r["state"] != "LISTEN"]  # fmt: skip
        if not states:
            return "gone"
        return states[0] if states[0] != "ACTIVE" else ""

    # the echo server read EOF and closed too: its side passes through the closing states
    state = wait_for(server_state)
    assert state in ("PEERCLOSEWAIT1", "PEERCLOSEWAIT2", "APPCLOSEWAIT1", "APPCLOSEWAIT2",
                     "APPFINCLOSEWAIT1", "PEERFINCLOSEWAIT", "CLOSED", "gone"), state


def test_stats_totals_across_processes_with_an_exited_one(env: dict[str, str],
                                                          procs: Callable[..., Proc]) -> None:
    server, client, _ = pair(procs)
    client.exit()  # leaves its counters in the directory
    exited = Path(env["SMCR_DIAG_DIR"]) / paths.EXITED
    assert wait_for(lambda: list(exited.glob("*.json")))
    stats = smcr_json(env, "stats", "-a")["SMCR"]
    assert stats["clnt_v1_succ_cnt"] == 1 and stats["srv_v1_succ_cnt"] == 1
    assert stats["srv_fback"] == [{"local": 0x03010000, "peer": 0, "count": 1}]
    assert stats["tx_bytes"] >= 200_000 and stats["rx_bytes"] >= 200_000
    assert stats["tx_cnt"] >= 200 and stats["tx_pd"][0] >= 200  # 1000-byte sends: <= 8 KiB
    assert stats["rx_rmbsize"][bucket_of(BUFFER)] == 2  # two RMBs of the default size
    # some of the CDCs of those sends were read in place; how many depends on who polls first
    # (a spinner's readiness check delivers as before), so only that the counter moves
    assert 1 <= stats["inplace_cnt"] <= 4 * stats["tx_cnt"]
    text = smcr_cmd(env, "stats", "show", "-d")
    assert "SMC-R Connections Summary" in text and "TCP fallback" in text
    assert f"CDCs read in place         {stats['inplace_cnt']:12d}" in text
    assert f"Heard at a look-in         {stats['late_news_cnt']:12d}" in text
    assert "Given back when quiet" in text and stats["trimmed_bytes"] >= 0
    assert f"Handshake steps caught     {stats['clc_spin_cnt']:12d}" in text
    assert "0x03010000/0x00000000" in text and "peer did not indicate SMC" in text
    # folded: the single files went into the total, which counts the same
    assert not [p for p in exited.glob("*.json") if p.name != "total.json"]
    assert smcr_json(env, "stats", "-a")["SMCR"]["clnt_v1_succ_cnt"] == 1

    smcr_cmd(env, "stats", "reset")
    base = Path(env["SMCR_DIAG_DIR"]) / paths.BASELINE
    assert base.stat().st_mode & 0o777 == 0o600
    after = smcr_json(env, "stats")["SMCR"]
    assert after["clnt_v1_succ_cnt"] == after["srv_v1_succ_cnt"] == 0
    assert after["srv_fback_cnt"] == 0
    client2 = Proc(env, "client", server.first[1])
    try:
        since = wait_for(lambda: smcr_json(env, "stats")["SMCR"]["srv_v1_succ_cnt"] == 1)
        assert since
        now = smcr_json(env, "stats")["SMCR"]
        assert now["clnt_v1_succ_cnt"] == 1 and now["srv_fback_cnt"] == 1
        assert smcr_json(env, "stats", "-a")["SMCR"]["srv_v1_succ_cnt"] == 2
    finally:
        client2.kill()


# ---------------------------------------------------------------- hostile processes

def _fake(directory: Path, pid: int, behave: Callable[[socket.socket], None]) -> socket.socket:
    """A listening socket posing as process ``pid``'s endpoint; ``behave`` serves each client."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(directory / f"{pid}.sock"))
    srv.listen(8)

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=behave, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return srv


def _hang(conn: socket.socket) -> None:
    time.sleep(30)
    conn.close()


def _garbage(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(b"\x00\x00\x00\x10" + b"\xff" * 16)
    conn.close()


def _huge(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(struct.pack(">I", 0xFFFFFFF0) + b"{")
    time.sleep(5)
    conn.close()


def _half_then_die(conn: socket.socket) -> None:
    conn.recv(4096)
    body = json.dumps({"ok": True, "pid": 999002, "sockets": []}).encode()
    conn.sendall(struct.pack(">I", len(body)) + body[:10])
    conn.close()  # as a process killed mid-answer


def _liar(pid: int) -> Callable[[socket.socket], None]:
    def behave(conn: socket.socket) -> None:
        conn.recv(4096)
        answer = {"ok": True, "pid": pid, "process": {"comm": "evil\x1b[2J\x07", "pid": "x"},
                  "sockets": [{"state": "ACTIVE\x1b[31m", "mode": "SMCR", "uid": "root",
                               "inode": -1, "local": "1.2.3.4:5\x1b]0;pwned\x07",
                               "peer": ["not", "a", "string"], "token": 2**80},
                              "junk", 17, None],
                  "linkgroups": "nope", "counters": {"tx_bytes": -5, "clnt_v1_succ_cnt": 7,
                                                     "srv_fback": [{"local": "x"}, 3]}}
        conn.sendall(protocol.encode(answer))
        conn.close()
    return behave


def test_lying_hanging_and_garbage_processes_do_not_stall_the_tools(
        env: dict[str, str], procs: Callable[..., Proc]) -> None:
    server, client, _ = pair(procs)
    directory = Path(env["SMCR_DIAG_DIR"])
    fakes = [_fake(directory, 999001, _hang), _fake(directory, 999003, _garbage),
             _fake(directory, 999004, _huge), _fake(directory, 999002, _half_then_die),
             _fake(directory, 999005, _liar(999005)), _fake(directory, 999006, _liar(4))]
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(directory / "999007.sock"))
    stale.close()  # a process killed with its socket file left behind
    try:
        answer = smcr_json(env, "ss", "-a")
        errors = {p["pid"]: p.get("error", "") for p in answer["processes"]}
        assert errors[server.p.pid] == "" and errors[client.p.pid] == ""
        assert errors[999001] == "timed out"
        assert "not JSON" in errors[999003]
        assert "limit" in errors[999004]
        assert errors[999002] == "closed before the whole answer"
        assert errors[999006] == "answered as pid 4"
        assert errors[999005] == ""  # its lies are cleaned, below
        lies = [r for r in answer["sockets"] if r["pid"] == 999005]
        assert len(lies) == 1
        lie = lies[0]
        assert "\x1b" not in json.dumps(lie) and "\x07" not in json.dumps(lie)
        assert "uid" not in lie and "peer" not in lie  # wrong types dropped
        assert {(r["pid"], r["state"]) for r in answer["sockets"]} >= {
            (server.p.pid, "ACTIVE"), (client.p.pid, "ACTIVE")}
        assert not (directory / "999007.sock").exists()  # stale: cleaned up
        table = smcr_cmd(env, "ss", "-a")
        assert "\x1b" not in table and "\x07" not in table
        stats = smcr_json(env, "stats", "-a")["SMCR"]
        assert stats["clnt_v1_succ_cnt"] == 1 + 7  # a liar lies about its own counts only
        assert stats["tx_bytes"] >= 200_000  # -5 taken as 0
        assert smcr_json(env, "linkgroup")["linkgroups"]
    finally:
        for f in fakes:
            f.close()


# ---------------------------------------------------------------- chk and top

def test_chk_local_uses_smc(env: dict[str, str]) -> None:
    result = json.loads(smcr_cmd(env, "chk", "--json"))
    assert result["smc"] is True and result["echo_ok"] is True and result["mode"] == "SMCR"
    assert "[OK]" in smcr_cmd(env, "chk")


def test_chk_against_a_plain_server_says_why_not(env: dict[str, str]) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def echo() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    try:
        out = subprocess.run([sys.executable, "-m", "smcr", "chk", "-C", "127.0.0.1", "-p",
                              str(port), "--json"], env=env, capture_output=True, text=True,
                             timeout=120, check=False, cwd=REPO)  # fmt: skip
        assert out.returncode == 1, out.stderr
        result = json.loads(out.stdout)
        assert result["smc"] is False and result["echo_ok"] is True
        assert (result["local_code"], result["peer_code"]) == (0x03010000, 0)
        assert "did not indicate SMC" in result["reason"]
    finally:
        srv.close()


def test_top_reports_rates(env: dict[str, str], procs: Callable[..., Proc]) -> None:
    server, client, _ = pair(procs)
    view = smcr_json(env, "top", "-n", "2", "--interval", "0.2")
    smc = [c for c in view["connections"] if c["mode"] == "SMCR" and c["state"] == "ACTIVE"]
    assert len(smc) == 2 and all("tx_rate" in c for c in smc)  # idle: 0 B/s, but known
    assert len(view["linkgroups"]) == 2
    assert {p["pid"] for p in view["processes"]} == {server.p.pid, client.p.pid}


def test_info_says_versions_rnics_discovery_ueids_limits_and_who_answers(
        env: dict[str, str], procs: Callable[..., Proc], tmp_path: Path) -> None:  # fmt: skip
    """``smcr info`` (and ``--json``): what the environment set (the RNIC kind, discovery,
    the UEID file), Linux's defaults as limits, and the smcr processes of the diag
    directory (none, then the one started)."""
    ueids = tmp_path / "ueid"
    ueids.write_text("SMC-KVM-TEST\nnot a ueid\nSMCR-2ND\n")  # the middle line is invalid
    env = env | {"SMCR_UEID_FILE": str(ueids), "SMCR_DISCOVERY": "off", "SMCR_RNIC": "shm"}
    got = smcr_json(env, "info")
    assert got["smc_versions"] == ["SMC-Rv1", "SMC-Rv2"]
    assert got["python"] == ".".join(map(str, sys.version_info[:3]))
    assert got["rnic_default"] == "shm"
    assert got["discovery"] == {"mode": "off", "why": "SMCR_DISCOVERY=off"}
    assert got["ueids"] == ["SMC-KVM-TEST", "SMCR-2ND"]
    limits = got["limits"]  # Linux: net.smc.wmem/rmem, SMC_RMBS_PER_LGR_MAX, CLC/LLC waits
    assert (limits["sndbuf_size"], limits["rmb_size"], limits["max_conns"]) == (65536, 65536, 255)
    assert (limits["clc_wait"], limits["llc_wait"], limits["testlink_time"]) == (6.0, 2.0, 30.0)
    assert got["diag_directory"] == env["SMCR_DIAG_DIR"]
    assert got["processes"] == 0
    text = smcr_cmd(env, "info")
    assert "Discovery:      off (SMCR_DISCOVERY=off)" in text
    assert "UEIDs:          SMC-KVM-TEST, SMCR-2ND" in text
    assert "Limits:         255 connections per link group" in text
    assert f"Diag:           0 smcr process(es) answer in {env['SMCR_DIAG_DIR']}" in text
    pair(procs)  # two smcr processes: their endpoints answer,
    assert wait_for(lambda: smcr_json(env, "info")["processes"] == 2)
    rnics = {(r["name"], r["type"]) for r in smcr_json(env, "info")["rnics"]}  # and their RNICs
    (link, *_) = smcr_json(env, "linkgroup")["linkgroups"][0]["links"]
    both = {f"shm:{ipaddress.IPv6Address(link[k]).packed[-4:].hex()}" for k in ("gid", "peer_gid")}
    assert {name for name, kind in rnics if kind == "shm"} >= both
    ueids.write_text("")
    assert smcr_json(env, "info")["ueids"] == []
    assert "UEIDs:          (none)" in smcr_cmd(env, "info")


def test_top_live_view_shows_processes_link_groups_and_connections(
        env: dict[str, str], procs: Callable[..., Proc]) -> None:  # fmt: skip
    """``smcr top`` without ``--json``: the three tables of the live view, as a terminal
    shows them (wide enough for whole addresses)."""
    server, client, port = pair(procs)
    text = smcr_cmd(env | {"COLUMNS": "220"}, "top", "-n", "2", "--interval", "0.2")
    assert "smcr processes (2)" in text and "link groups" in text and "connections" in text
    lines = [line.replace("│", " ").split() for line in text.splitlines()]
    sp, cp = str(server.p.pid), str(client.p.pid)
    for pid in (sp, cp):  # the processes' table comes first
        proc_row = next(x for x in lines if x[:1] == [pid])
        assert (proc_row[1], proc_row[-1]) == ("python", "ok"), proc_row
    groups = {(x[0], x[2], x[3]) for x in lines if len(x) == 7 and x[0] in (sp, cp)}
    assert {(sp, "SERV", "SINGLE"), (cp, "CLNT", "SINGLE")} <= groups
    conns = [x for x in lines if len(x) >= 7 and x[1] in ("ACTIVE", "LISTEN")]
    assert [sp, "LISTEN", f"127.0.0.1:{port}", "-", "SMCR", "0", "B/s", "0", "B/s"] in conns
    smc = [x for x in conns if x[1] == "ACTIVE" and x[4] == "SMCR"]
    assert {x[0] for x in smc} == {sp, cp} and all(x[5:] == ["0", "B/s", "0", "B/s"] for x in smc)
    assert any(x[0] == sp and x[4] == "TCP" and x[5] == "0x03010000/0x00000000" for x in conns)


def test_top_rates_from_two_looks_and_their_units() -> None:
    """A connection's rate is its byte count's growth over the time between two looks
    (known by pid and inode; one seen once has none yet), shown in B/s, kB/s, MB/s, GB/s."""
    from rich.console import Console  # noqa: PLC0415

    from smcr.tools import top  # noqa: PLC0415

    def row(inode: int, tx: int, rx: int) -> dict[str, Any]:
        return {"pid": 7, "inode": inode, "state": "ACTIVE", "mode": "SMCR",
                "local": f"10.0.0.1:{inode}", "peer": "10.0.0.2:80", "tx_bytes": tx,
                "rx_bytes": rx}  # fmt: skip

    first = top.add_rates([row(1, 0, 0), row(2, 0, 0)], {}, 0.0)
    later = [row(1, 5_000_000, 1_500), row(2, 3_000_000_000, 5_000), row(3, 9, 9)]
    top.add_rates(later, first, 2.0)
    assert [(c.get("tx_rate"), c.get("rx_rate")) for c in later] == [
        (2_500_000.0, 750.0), (1_500_000_000.0, 2_500.0), (None, None)]  # fmt: skip
    console = Console(record=True, width=200)
    console.print(top.view(later, [], [{"pid": 7, "command": "x", "netns": 1}]))
    text = console.export_text()
    for shown in ("2.5 MB/s", "750 B/s", "1.5 GB/s", "2.5 kB/s", "smcr processes (1)"):
        assert shown in text, text
    rows = [line.split("│") for line in text.splitlines() if "10.0.0.1:3" in line]
    assert [cell.strip() for cell in rows[0][-3:-1]] == ["-", "-"]  # no rate before a 2nd look
