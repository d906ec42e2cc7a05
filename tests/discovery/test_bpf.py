"""The TCP option on the wire, by the sock_ops program (root: loading BPF needs it).

The session has the program enabled host-wide (``tests/discovery_on.py``);
these tests look at what it does to real segments, in fresh network namespaces,
and run ``enable``/``disable`` on a private pin directory and cgroup.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smcr.discovery import bpf, bpfsys, program
from tests.support import REPO_ROOT

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                       reason="needs root (BPF) and unshare"),
]


PINNED = sorted(["link", "map", "ports", "withheld", f"prog-v{program.VERSION}"])
"""What ``smcr enable`` pins."""


def run_optcheck(*args: str) -> dict[str, Any]:
    res = subprocess.run(["unshare", "--net", sys.executable, "-m", "tests.discovery.optcheck",
                          *args], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    found: dict[str, Any] = json.loads(res.stdout)
    return found


def test_option_only_in_syn_and_synack_when_both_ask() -> None:
    """Both ends want SMC: option in the SYN and the SYN-ACK, both read peer=1.  Only the
    client: in its SYN only, nobody reads peer.  Only the server: nowhere.  Data and
    FIN segments never carry it."""
    found = run_optcheck()
    by_port = {r["port"]: r for r in found["results"]}
    for r in found["results"]:
        both = bool(r["client_wants"] and r["server_wants"])
        assert (r["client_peer"], r["server_peer"]) == (both, both), r
    segs = found["segments"]
    assert len(segs) >= 4 * 6  # SYN, SYN-ACK, ACK, data, FINs per connection
    for seg in segs:
        client_to_server = seg["dport"] in by_port
        r = by_port[seg["dport"] if client_to_server else seg["sport"]]
        if seg["syn"] and not seg["ack"]:
            assert seg["smc"] is bool(r["client_wants"]), seg
        elif seg["syn"]:
            assert seg["smc"] is bool(r["client_wants"] and r["server_wants"]), seg
        else:
            assert seg["smc"] is False, seg
    syns = [s for s in segs if s["syn"]]
    assert len(syns) == 8


def test_syn_cookies_mean_plain_tcp_on_both_ends() -> None:
    """A SYN cookie's connection keeps no SYN: the server could not know the client
    asked, so the SYN-ACK does not echo the option and both ends stay TCP."""
    found = run_optcheck("--syncookies")
    for r in found["results"]:
        assert (r["client_peer"], r["server_peer"]) == (False, False), r
    synacks = [s for s in found["segments"] if s["syn"] and s["ack"]]
    assert len(synacks) == 4 and not any(s["smc"] for s in synacks)
    syn_with = [s for s in found["segments"] if s["syn"] and not s["ack"] and s["smc"]]
    assert len(syn_with) == 2  # the clients still asked


def test_program_passes_the_verifier_and_has_the_option_bytes() -> None:
    insns = program.build(map_fd=1234, ports_fd=1235, withheld_fd=1236)
    assert len(insns) % 8 == 0
    words = {int.from_bytes(insns[i + 4 : i + 8], "little", signed=True)
             for i in range(0, len(insns), 8)}  # fmt: skip
    assert int.from_bytes(bytes([254, 6, 0xE2, 0xD4]), "little", signed=True) in words
    assert int.from_bytes(bytes([0xC3, 0xD9, 0, 0]), "little", signed=True) in words
    status = bpf.status()
    assert status.enabled and status.prog_id > 0  # the session's copy was loaded and runs


@pytest.fixture
def private() -> Iterator[tuple[Path, Path]]:
    """A pin directory and a child cgroup of our own; both gone afterwards."""
    mount = bpf.cgroup2_mount()
    assert mount is not None
    tag = uuid.uuid4().hex[:8]
    pins, cgroup = bpf.BPFFS / f"smcr-test-{tag}", mount / f"smcr-test-{tag}"
    cgroup.mkdir()
    try:
        yield pins, cgroup
    finally:
        bpf.disable(pins)
        cgroup.rmdir()


def test_enable_status_disable_on_a_cgroup(private: tuple[Path, Path]) -> None:
    pins, cgroup = private
    assert not bpf.status(pins).enabled
    state = bpf.enable(cgroup, pins)
    assert state.enabled and state.cgroup == cgroup and not state.covers_us
    assert sorted(p.name for p in pins.iterdir()) == PINNED
    assert (pins / "map").stat().st_mode & 0o777 == 0o666
    assert (pins / "ports").stat().st_mode & 0o777 == 0o666
    assert (pins / "withheld").stat().st_mode & 0o777 == 0o600
    assert bpf.enable(cgroup, pins).prog_id == state.prog_id  # enabled already: kept
    # a process in that cgroup is covered, and so chooses the bpf mode
    script = ("import os, sys; open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid()));"
              "from smcr import discovery; print(discovery.current().mode)")
    res = subprocess.run([sys.executable, "-c", script, str(cgroup)], capture_output=True,
                         text=True, timeout=60, check=True,
                         env={**os.environ, "SMCR_BPF_DIR": str(pins)})  # fmt: skip
    assert res.stdout.strip() == "bpf"
    # we are not in it: our choice for those pins is not bpf
    res = subprocess.run([sys.executable, "-c", "from smcr import discovery;"
                          "print(discovery.current().mode, discovery.current().why)"],
                         capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, "SMCR_BPF_DIR": str(pins), "SMCR_PEERS": ""})
    assert res.stdout.startswith("off ") and "which this process is not in" in res.stdout
    assert bpf.disable(pins)
    assert not bpf.status(pins).enabled and not pins.exists()
    assert not bpf.disable(pins)


def test_enable_replaces_the_program_of_an_earlier_smcr(private: tuple[Path, Path]) -> None:
    """Pins without this smcr's maps are an earlier program's: ``enable`` puts this one in
    its place (an upgraded install's ``smcr enable``), once."""
    pins, cgroup = private
    old = bpf.enable(cgroup, pins)
    (pins / "ports").unlink()  # as an smcr before the ports map pinned it
    (pins / "withheld").unlink()
    new = bpf.enable(cgroup, pins)
    assert new.enabled and new.prog_id != old.prog_id
    assert new.replaced == old.prog_id  # (smcr enable says what that means for processes)
    assert sorted(p.name for p in pins.iterdir()) == PINNED
    # an older version of the program, pinned under its own version
    prog_fd = bpfsys.obj_get(str(pins / bpf.PROG_PIN))
    try:
        bpfsys.obj_pin(prog_fd, str(pins / "prog-v1"))
    finally:
        os.close(prog_fd)
    (pins / bpf.PROG_PIN).unlink()
    old, new = new, bpf.enable(cgroup, pins)
    assert new.enabled and new.prog_id != old.prog_id and new.replaced == old.prog_id
    assert sorted(p.name for p in pins.iterdir()) == PINNED
    again = bpf.enable(cgroup, pins)
    assert again.prog_id == new.prog_id and not again.replaced


def test_unprivileged_process_uses_the_pinned_map() -> None:
    """After root's ``smcr enable``, a process of user nobody marks its own sockets and
    reads the peer flags through the pinned map."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) missing")
    with tempfile.TemporaryDirectory() as tmp:  # (pytest's tmp_path is root's alone)
        src = Path(tmp) / "src"
        shutil.copytree(REPO_ROOT / "src" / "smcr", src / "smcr")
        for path in [Path(tmp), *src.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        assert nobody_peer_flags(src) == ["True", "True"]


def test_a_user_other_than_root_uses_the_option_after_roots_enable(
        private: tuple[Path, Path]) -> None:  # fmt: skip
    """After root's ``smcr enable`` (the link pin stays root's: whoever opens it may detach
    it), a process of user nobody in that cgroup chooses the bpf mode and its connections
    are SMC-R; before, it could not open the link, said "Permission denied" and got TCP."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) missing")
    pins, cgroup = private
    bpf.enable(cgroup, pins)
    assert (pins / "link").stat().st_mode & 0o777 == 0o600
    script = ("import smcr; from smcr import discovery; d = discovery.current();"
              "srv = smcr.create_server(('127.0.0.1', 0));"
              "c = smcr.create_connection(srv.getsockname(), timeout=20); s, _ = srv.accept();"
              "c.sendall(b'x'); assert s.recv(1) == b'x';"
              "print(d.mode, c.smc_info().mode, s.smc_info().mode)")
    with tempfile.TemporaryDirectory() as tmp:  # a copy of the package user nobody can read
        src, run = Path(tmp) / "src", Path(tmp) / "run"
        shutil.copytree(REPO_ROOT / "src" / "smcr", src / "smcr")
        run.mkdir()
        for path in [Path(tmp), *src.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        run.chmod(0o777)
        res = subprocess.run(
            ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && exec setpriv --reuid=65534 '
             '--regid=65534 --clear-groups "$2" -c "$3"', "sh", str(cgroup),
             os.path.realpath(sys.executable), script],
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp,
            env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin", "SMCR_BPF_DIR": str(pins),
                 "SMCR_PEERS": "", "SMCR_SHM_DIR": str(run / "shm"), "SMCR_DIAG": "0"},
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["bpf", "SMCR", "SMCR"]


def nobody_peer_flags(src: Path) -> list[str]:
    script = ("import socket; from smcr.discovery.bpf import SocketFlags; f = SocketFlags();"
              "ls = socket.socket(); ls.bind(('127.0.0.1', 0)); f.want(ls.fileno()); ls.listen();"
              "c = socket.socket(); f.want(c.fileno()); c.connect(ls.getsockname());"
              "a, _ = ls.accept(); print(f.peer(c.fileno()), f.peer(a.fileno()))")
    res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          os.path.realpath(sys.executable), "-c", script],
                         capture_output=True, text=True, timeout=60, check=False,
                         env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_processes_started_by_ip_netns_exec_find_the_pins() -> None:
    """``ip netns exec`` mounts the namespace's own /sys over ours, hiding /sys/fs/bpf:
    the second copy of the pins under /run serves such processes."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2 missing")
    ns = f"smcr-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c",
                              "import os; from smcr import discovery;"
                              "print(os.path.exists('/sys/fs/bpf/smcr/map'),"
                              " discovery.current().mode)"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                             check=True)  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)
    assert res.stdout.split() == ["False", "bpf"]


def smcr_cli(*args: str, env: dict[str, str] | None = None,
             prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run([*prefix, sys.executable, "-m", "smcr", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_the_enable_discovery_disable_commands(private: tuple[Path, Path]) -> None:
    """``smcr enable --cgroup`` / ``smcr discovery`` / ``smcr disable`` as a user types them
    (private pins through ``SMCR_BPF_DIR``): what each says, and what ``discovery`` reports
    of a program started here (outside that cgroup, peers listed: policy)."""
    pins, cgroup = private
    env = {"SMCR_BPF_DIR": str(pins), "SMCR_DISCOVERY": "auto",
           "SMCR_PEERS": "10.1.0.0/16:5000, [fd00::/8]:8000-8099"}  # fmt: skip
    out = smcr_cli("discovery", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) | {"why": ""} == {
        "mode": "policy", "why": "", "bpf_enabled": False, "bpf_cgroup": None,
        "bpf_pin_dir": str(pins), "peers": ["10.1.0.0/16:5000", "[fd00::/8]:8000-8099"],
        "tcp_ports": []}
    out = smcr_cli("enable", "--cgroup", str(cgroup), env=env)
    assert out.returncode == 0, out.stderr
    state = bpf.status(pins)
    assert state.enabled and state.cgroup == cgroup
    assert out.stdout.strip() == (
        f"SMC TCP option enabled for cgroup {cgroup} (program id {state.prog_id}, pinned in "
        f"{pins}); smcr sockets of its processes now use discovery")  # fmt: skip
    (pins / "withheld").unlink()  # as an earlier smcr left it: enable replaces, and says so
    out = smcr_cli("enable", "--cgroup", str(cgroup), env=env)
    first, state = state, bpf.status(pins)
    assert out.returncode == 0 and state.prog_id != first.prog_id, out.stderr
    assert out.stdout.splitlines()[1] == (
        f"smcr enable: it replaced an earlier smcr's program (id {first.prog_id}): processes "
        "started before keep that program's map and open TCP connections until they restart")
    out = smcr_cli("discovery", env=env)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("discovery: policy (")
    assert lines[1] == (f"TCP option: enabled for cgroup {cgroup}, pinned in {pins}; "
                        "this process is outside that cgroup")  # fmt: skip
    assert lines[2:] == ["peer: 10.1.0.0/16:5000", "peer: [fd00::/8]:8000-8099"]
    out = smcr_cli("disable", env=env)
    assert (out.returncode, out.stdout) == (0, "SMC TCP option disabled\n")
    assert not bpf.status(pins).enabled and not pins.exists()
    out = smcr_cli("disable", env=env)
    assert (out.returncode, out.stdout) == (0, "SMC TCP option was not enabled\n")
    out = smcr_cli("discovery", env=env | {"SMCR_PEERS": "", "SMCR_DISCOVERY": "off"})
    assert out.stdout.splitlines()[:2] == ["discovery: off (SMCR_DISCOVERY=off)",
                                           f"TCP option: not enabled ({bpf.status(pins).why})"]


def test_enable_without_root_says_why(private: tuple[Path, Path]) -> None:
    """A user's ``smcr enable`` fails with status 1 and says that loading BPF needs root."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) missing")
    pins, cgroup = private
    with tempfile.TemporaryDirectory() as tmp:  # a copy of the package user nobody can read
        src = Path(tmp) / "src"
        shutil.copytree(REPO_ROOT / "src" / "smcr", src / "smcr")
        for path in [Path(tmp), *src.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             os.path.realpath(sys.executable), "-m", "smcr", "enable", "--cgroup", str(cgroup)],
            capture_output=True, text=True, timeout=60, check=False, cwd=tmp,
            env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin", "SMCR_BPF_DIR": str(pins)},
        )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "smcr enable: loading a BPF program needs root (CAP_BPF, CAP_NET_ADMIN)" in out.stderr
    assert not bpf.status(pins).enabled
