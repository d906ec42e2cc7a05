"""``smcr run``: unmodified standard-library programs get SMC-R between smcr ends, TCP with
everyone else (the programs are in :mod:`tests.run.programs`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smcr.run import parse_size
from smcr.run.launcher import environment, program_kind
from tests.support import REPO_ROOT

SMCR = [sys.executable, "-m", "smcr", "run"]
PROGRAM = [sys.executable, "-m", "tests.run.programs"]


def run(name: str, *args: str, smcr: bool = True, timeout: float = 120,
        env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run program ``name`` of :mod:`tests.run.programs` (``env``: variables added)."""
    cmd = [*SMCR, *PROGRAM] if smcr else PROGRAM
    res = subprocess.run([*cmd, name, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=timeout, check=False,
                         env=dict(os.environ, **env) if env else None)  # fmt: skip
    assert res.returncode == 0, res.stderr
    found: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return found


class Server:
    """A program that prints its port first, then (at the end) its JSON line."""

    def __init__(self, name: str, *args: str, smcr: bool = True) -> None:
        cmd = [*SMCR, *PROGRAM] if smcr else PROGRAM
        self.proc = subprocess.Popen([*cmd, name, *args], cwd=REPO_ROOT, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip().isdigit(), line + (self.proc.stderr.read() if self.proc.stderr else "")
        self.port = line.strip()

    def result(self, timeout: float = 60) -> dict[str, Any]:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for s in made:
        s.kill()


def test_http_server_and_clients_use_smcr_and_plain_clients_tcp(servers: list[Server]) -> None:
    srv = Server("http_server", "4")
    servers.append(srv)
    both = run("http_clients", srv.port)
    assert both["urllib"] == {"mode": "SMCR", "is_socket": True}
    assert both["http_client"] == {"mode": "SMCR", "is_socket": True}
    assert both["client_mode"] == "SMCR"
    plain = run("http_clients", srv.port, smcr=False)
    assert plain["urllib"]["mode"] == "TCP" and plain["client_mode"] == "plain"
    assert srv.result() == {"done": True}


def test_bodies_delimited_by_the_close_of_the_connection(servers: list[Server]) -> None:
    """HTTP/1.0 without Content-Length and HTTP/0.9 (``GET /`` alone): the server writes its
    last byte and closes at once; http.client and a raw socket read the whole body and
    then EOF over SMC-R (10 MiB: more than the client's RMB and the server's send buffer
    together, 4 MiB each by default, so the close comes with the body's tail unsent)."""
    size = str(10 * 1024 * 1024)
    srv = Server("close_delimited_server", size)
    servers.append(srv)
    found = run("close_delimited_clients", srv.port, size)
    end = srv.result()
    assert end["requests"] == ["GET / HTTP/1.0\r\n", "GET /\r\n"]
    assert found["modes"] == end["modes"] == ["SMCR", "SMCR"]
    assert (found["status"], found["version"], found["length_header"]) == (200, 10, None)
    assert found["http10_whole"] and found["http09_whole"]


def test_tls_records_travel_over_smcr_not_tcp(servers: list[Server]) -> None:
    """1 MiB over TLS: both ends in SMC-R mode, digest intact, and the TCP connection
    under it carried only the CLC handshake (a few hundred bytes each way)."""
    srv = Server("tls_server")
    servers.append(srv)
    client = run("tls_client", srv.port, str(1 << 20))
    server = srv.result()
    assert client["mode"] == "SMCR" and client["ok"] is True
    assert server["mode"] == "SMCR" and server["size"] == 1 << 20
    assert server["version"] == "TLSv1.3"
    assert server["is_sslsocket"] and server["is_socket"]
    for acked, received in (client["tcp"], server["tcp"]):
        assert acked < 2048 and received < 2048, (acked, received)


def test_tls_wrapped_listening_socket_accepts_tls_over_smcr(servers: list[Server]) -> None:
    """An HTTPS-style server wraps its listening socket: what it accepts is TLS over
    SMC-R, for several clients in turn (the wrapped listener keeps its accept queue)."""
    srv = Server("tls_listener", "3")
    servers.append(srv)
    for _ in range(3):
        client = run("tls_client", srv.port, str(256 << 10))
        assert client["mode"] == "SMCR" and client["ok"] is True
    assert srv.result() == {"modes": ["SMCR", "SMCR", "SMCR"]}


def test_tls_with_a_plain_peer_is_tls_over_tcp(servers: list[Server]) -> None:
    srv = Server("tls_server", smcr=False)
    servers.append(srv)
    client = run("tls_client", srv.port, str(1 << 20))
    server = srv.result()
    # over TCP the ssl module's own socket does the work (it has no smc_info)
    assert client["mode"] == "plain" and client["ok"] is True and server["mode"] == "plain"
    assert client["tcp"][0] > 1 << 20  # this time the records did go over TCP


def test_asyncio_streams_with_tls_and_flow_control() -> None:
    found = run("asyncio_tls", str(4 << 20))
    assert found == {"client": "SMCR", "server": "SMCR", "ok": True}


def test_asyncio_sock_sendfile_over_smcr() -> None:
    """asyncio would os.sendfile() into fileno(), smcr's readiness descriptor: under
    smcr run SMC-R sockets take asyncio's fallback, and every byte arrives."""
    found = run("asyncio_sendfile", str(3 << 20))
    assert found == {"modes": ["SMCR", "SMCR"], "sent": 3 << 20, "ok": True,
                     "without": "os.sendfile() is not available at 0"}


def test_python_children_get_smcr_whatever_starts_them() -> None:
    found = run("children")
    assert found == {name: "SMCSocket" for name in
                     ("subprocess", "fork", "spawn", "forkserver", "self")}  # fmt: skip


def test_standard_socket_api_keeps_working() -> None:
    found = run("socket_api")
    assert found == {"socketpair": True, "modes": ["SMCR", "SMCR"], "isinstance": True,
                     "family_type": [True, True], "makefile": True, "selectors": True,
                     "dup_listener": True, "fromfd_listener": [True, "SMCR", "y"], "udp": True}


def test_socketserver_threading_server(servers: list[Server]) -> None:
    srv = Server("socketserver_echo", "2")
    servers.append(srv)
    for smcr in (True, False):
        found = run("line_client", srv.port, smcr=smcr)
        expect = "SMCR" if smcr else "TCP"
        assert found["answer"] == {"mode": expect, "line": "hello\n"}
    assert srv.result() == {"done": True}


def test_smcr_is_imported_with_the_first_tcp_socket(servers: list[Server]) -> None:
    """An interpreter under smcr run imports nothing heavy of smcr (socket layer, runtime,
    engine, compiled modules, discovery) until its first TCP socket: sockets of other
    kinds and the modules smcr patches (ssl, asyncio: patched all the same) do not import
    it; that socket does, and connects by SMC-R."""
    srv = Server("socketserver_echo", "1")
    servers.append(srv)
    found = run("lazy_start", srv.port)
    assert found["hook"] == "smcr.run"
    assert found["start"] == found["not_tcp"] == []
    assert found["plain"] == ["plain"] * 4 and found["isinstance"]
    assert {"smcr.socket", "smcr.stack.runtime", "smcr.core.engine", "smcr.discovery",
            "smcr.native"} <= set(found["tcp"])  # fmt: skip
    assert found["mode"] == found["client_mode"] == "SMCR" and found["isinstance_tcp"]
    assert found["ssl_patched"]


def test_first_tcp_socket_of_a_subclass_or_from_a_descriptor(servers: list[Server]) -> None:
    """A subclass of socket.socket defined before smcr is imported makes SMC sockets (and
    only its own sockets are its instances); a socket made from a listening TCP socket's
    descriptor listens for SMC."""
    srv = Server("socketserver_echo", "1")
    servers.append(srv)
    found = run("hook_classes", srv.port)
    assert found["before"] == [] and found["from_fd_mode"] == "LISTEN"
    assert found["mode"] == found["client_mode"] == "SMCR"
    assert found["name"] == "Mine" and found["is_mine"] and found["is_socket"]
    assert not found["unix_is_mine"]


def test_a_setting_smcr_refuses_leaves_the_sockets_plain(servers: list[Server]) -> None:
    """SMC_RCVBUF is read when the first TCP socket imports smcr: a value it refuses is one
    line on standard error, and the program runs on with the standard library's sockets
    (the smcr command refuses it, so it is given as smcr run would give it)."""
    srv = Server("socketserver_echo", "1")
    servers.append(srv)
    env = environment(os.environ)
    env["SMC_RCVBUF"] = "12"
    res = subprocess.run([*PROGRAM, "line_client", srv.port], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    found = json.loads(res.stdout.strip().splitlines()[-1])
    assert found["answer"]["mode"] == "TCP" and found["client_mode"] == "plain"
    assert res.stderr.count("smcr run: not active in this interpreter") == 1, res.stderr


FORK_WHILE_IMPORTING = """
import os, signal, socket, threading
import smcr.run
held, release = threading.Event(), threading.Event()
def hold():
    with smcr.run._lock:  # as a thread importing smcr for its first TCP socket holds it
        held.set()
        release.wait()
holder = threading.Thread(target=hold)
holder.start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(30)  # (a child waiting for the lock forever ends here)
    os._exit(0 if hasattr(socket.socket(), "smc_info") else 1)
release.set()
holder.join()
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_child_forked_while_smcr_is_imported_makes_smc_sockets() -> None:
    """A child forked while another thread of its parent imports smcr (holding the lock
    that makes one SMC socket class) does not wait for that thread, gone in the child."""
    env = environment(os.environ)
    res = subprocess.run([sys.executable, "-c", FORK_WHILE_IMPORTING], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    assert res.stdout.strip() == "0", res.stderr


def test_the_compiled_modules_are_imported_with_the_first_tcp_socket(
        servers: list[Server]) -> None:  # fmt: skip
    """With the compiled build current, the first TCP socket imports the compiled modules
    (mypyc's shared library) and nothing imports them before."""
    from smcr import native  # noqa: PLC0415

    if not native.status().compiled:
        pytest.skip(f"not the compiled build: {native.status().describe()}")
    srv = Server("socketserver_echo", "1")
    servers.append(srv)
    found = run("lazy_start", srv.port)
    assert found["start"] == found["not_tcp"] == []
    assert "smcr_native__mypyc" in found["tcp"]
    assert found["mode"] == found["client_mode"] == "SMCR"


def test_the_runtime_starts_with_the_interpreter_when_eager(servers: list[Server]) -> None:
    """Under smcr run with SMCR_RUN_EAGER=1 the runtime's threads run from the start: a
    program's first SMC-R connection adds none (CPython's tests fail a test that leaves a
    thread behind).  What was alive before the program's first line (smcr's modules
    among it) is frozen, so a full collection walks fewer objects than it leaves out,
    and the program's own garbage is still collected."""
    srv = Server("socketserver_echo", "2")
    servers.append(srv)
    found = run("thread_count", srv.port, env={"SMCR_RUN_EAGER": "1"})
    assert found["mode"] == found["client_mode"] == "SMCR"
    assert found["before"] == found["after"] > 1
    assert found["walked"] < found["frozen"]
    assert found["cycle_collected"]
    lazy = run("thread_count", srv.port, env={"SMCR_RUN_EAGER": "0"})
    assert lazy["frozen"] == 0 and lazy["cycle_collected"]
    # a program that installs smcr itself, after its start: its objects stay collectable
    late = subprocess.run([sys.executable, "-c", "import gc; from smcr.run import install; "
                           "install(); print(gc.get_freeze_count())"], cwd=REPO_ROOT,
                          env=dict(os.environ, SMCR_RUN_EAGER="1"), capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert late.stdout.split() == ["0"], late.stderr


def test_forking_server_children_serve_requests_accepted_by_the_parent(
        servers: list[Server]) -> None:  # fmt: skip
    """socketserver.ForkingTCPServer: the parent accepts, a child serves each request over
    the parent's SMC-R connection (smcr.socket.fork); 4 MiB intact, both ends SMC-R."""
    sizes = "100,4194304,1"
    srv = Server("forking_server", "3")
    servers.append(srv)
    seen = run("digest_clients", srv.port, sizes)["seen"]
    end = srv.result()
    assert [s["ok"] for s in seen] == [True, True, True]
    assert {s["mode"] for s in seen} == {s["client_mode"] for s in seen} == {"SMCR"}
    pids = {s["pid"] for s in seen}
    assert len(pids) == 3 and end["server_pid"] not in pids  # each in a child of its own
    assert end["children_left"] == 0


def test_preforked_children_accept_on_an_inherited_listener(servers: list[Server]) -> None:
    srv = Server("prefork_server", "2")
    servers.append(srv)
    pids = set()
    for _ in range(2):
        found = run("line_client", srv.port)
        assert found["answer"]["mode"] == "SMCR" and found["client_mode"] == "SMCR"
        pids.add(found["answer"]["line"])
    assert len(pids) == 2  # two children, one client each
    assert srv.result() == {"exit_codes": [0, 0]}


def test_linux_smc_api_sockets_are_smc_sockets() -> None:
    """A program written for the kernel's SMC (AF_SMC, IPPROTO_SMC) runs under smcr run and
    uses SMC-R; without it, on this kernel (no SMC), making such sockets fails."""
    found = run("linux_smc_api")
    assert found == {"af_smc": [43, 0, "SMCR", "SMCR", "k"],
                     "ipproto_smc": [2, 256, "SMCR", "SMCR", "k"]}
    assert run("linux_smc_api", smcr=False) == {"af_smc": "EAFNOSUPPORT",
                                                  "ipproto_smc": "EPROTONOSUPPORT"}


def test_the_runtimes_own_sockets_are_not_smc_sockets() -> None:
    """The runtime's doorbells and readiness pairs are the standard library's sockets, not
    the SMC class ``socket.socketpair()`` gives under ``smcr run`` (each cost that class's
    look-up among the process's connections; a framework's suite made thousands)."""
    found = run("own_sockets")
    assert found == {"modes": ["SMCR", "SMCR"], "ready": True, "others": []}


def test_without_smcr_run_nothing_changes() -> None:
    found = run("children", smcr=False)
    assert found == {name: "socket" for name in
                     ("subprocess", "fork", "spawn", "forkserver", "self")}  # fmt: skip


def test_sizes_and_environment() -> None:
    assert parse_size("64k") == 65536 and parse_size("1M") == 1 << 20
    for bad in ("1k", "2g", "x", "-64k"):
        with pytest.raises(ValueError):
            parse_size(bad)
    env = environment({"PYTHONPATH": "/opt/lib", "PATH": "/bin"}, "64k", "1m", debug=True)
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0].endswith(os.path.join("smcr", "run", "boot")) and parts[-1] == "/opt/lib"
    assert (env["SMCR_RUN"], env["SMC_RCVBUF"], env["SMC_SNDBUF"], env["SMCR_RUN_DEBUG"]) == (
        "1", "65536", "1048576", "1")


def test_rmb_and_sndbuf_sizes_reach_the_sockets() -> None:
    probe = ("import socket; s = socket.socket();"
             "print(s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),"
             " s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))")
    res = subprocess.run([*SMCR, "-r", "64k", "-t", "128k", sys.executable, "-c", probe],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.split() == ["65536", "131072"]


def test_errors_of_the_command_line() -> None:
    res = subprocess.run([*SMCR, "no-such-command-smcr"], capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert res.returncode == 127 and "command not found" in res.stderr
    res = subprocess.run([*SMCR, "-r", "12", "true"], capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert res.returncode == 2
    assert res.stderr == ("smcr run: argument -r: '12' is not allowed: expected a size from 16k "
                          "to 1024m (k, m suffixes) (see smcr run -h)\n")
    res = subprocess.run([*SMCR, "--", "sh", "-c", f"{sys.executable} -c 'import socket; print("
                          "[c.__name__ for c in type(socket.socket()).__mro__])'"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert "'SMCSocket'" in res.stdout  # a Python program below a shell is covered


def test_debug_says_when_the_command_is_not_python(tmp_path: Path) -> None:
    """``-d`` tells that a command other than a Python program keeps its own connections
    on TCP (smcr reaches Python interpreters only); not for Python ones."""
    script = tmp_path / "tool"
    script.write_text("#!/usr/bin/env python3\nprint('ok')\n")
    script.chmod(0o755)
    for command, kind in ((["true"], "an ELF binary"), (["sh", "-c", "true"], "an ELF binary"),
                          ([sys.executable, "-c", "pass"], None), ([str(script)], None)):
        res = subprocess.run([*SMCR, "-d", *command], capture_output=True, text=True,
                             timeout=60, check=True)  # fmt: skip
        said = [line for line in res.stderr.splitlines() if "is not a Python program" in line]
        if kind is None:
            assert said == [], res.stderr
        else:
            assert said == [f"smcr run: {command[0]} is not a Python program ({kind}): its own "
                            "connections stay TCP; Python programs it starts use smcr"]
    assert program_kind("/nonexistent") == "unknown"
