"""The per-process diag endpoint (smcr.diag.server) against hostile and clumsy clients.

Every test ends by asking the endpoint a proper question and getting the proper
answer: whatever came before, the endpoint is still there and still answers.
Waits are for conditions, with deadlines (no timed assertions).
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smcr.diag import client, protocol, server


def wait_for(cond: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def answer(request: dict[str, Any]) -> dict[str, Any]:
    if request["op"] == "counters":
        raise RuntimeError("a bug in the answer")
    if request["op"] == "snapshot":
        return {"big": "x" * (4 << 20)}  # more than a socket buffer: written in parts
    return {"hello": "there"}


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[server.Endpoint]:
    directory = tmp_path / "diag"
    directory.mkdir(mode=0o700)
    ep = server.Endpoint(directory / f"{os.getpid()}.sock", answer)
    yield ep
    ep.close()


def ping(ep: server.Endpoint) -> dict[str, Any]:
    return client.query(ep.path, {"op": "ping"}, timeout=10.0)


def raw(ep: server.Endpoint) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10.0)
    s.connect(str(ep.path))
    return s


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the endpoint closed this connection (EOF or reset), reading what came."""
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_answers_ping_with_its_pid(endpoint: server.Endpoint) -> None:
    got = ping(endpoint)
    assert got == {"hello": "there", "ok": True, "v": protocol.VERSION, "pid": os.getpid()}
    assert endpoint.path.stat().st_mode & 0o777 == 0o600


def test_a_failing_answer_is_an_error_answer(endpoint: server.Endpoint) -> None:
    got = client.query(endpoint.path, {"op": "counters"}, timeout=10.0)
    assert got["ok"] is False and "a bug in the answer" in got["error"]
    assert ping(endpoint)["ok"] is True


@pytest.mark.parametrize("request_bytes", [
    b"", b"\x00", b"GET / HTTP/1.0\r\n\r\n", b"\xff\xff\xff\xff" + b"x" * 100,
    protocol.encode({"op": "nonsense"}), struct.pack(">I", 5) + b"\xff\xfe\x00ab",
    struct.pack(">I", 4) + b"[1]\n", struct.pack(">I", 2) + b"{}",
    struct.pack(">I", protocol.MAX_REQUEST + 1) + b"{" * 10,
    protocol.encode({"op": "ping"}) + b"trailing", struct.pack(">I", 2000) + b"[" * 2000,
])  # fmt: skip
def test_garbage_is_refused_and_the_endpoint_goes_on(endpoint: server.Endpoint,
                                                     request_bytes: bytes) -> None:
    s = raw(endpoint)
    s.sendall(request_bytes)
    s.shutdown(socket.SHUT_WR)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    s.close()
    if data:  # an error answer, never an ok one
        (length,) = struct.unpack(">I", data[:4])
        reply = protocol.decode(data[4 : 4 + length])
        assert reply["ok"] is False
    assert ping(endpoint)["hello"] == "there"


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=6000),
                      st.binary(max_size=3000).map(lambda b: struct.pack(">I", len(b)) + b)))
def test_fuzzed_requests(endpoint: server.Endpoint, data: bytes) -> None:
    s = raw(endpoint)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        closed_by_peer(s)
    except (BrokenPipeError, ConnectionResetError):
        pass  # it closed first: a length over the limit
    finally:
        s.close()
    assert ping(endpoint)["ok"] is True


def test_silent_clients_are_dropped_and_do_not_stall_others(endpoint: server.Endpoint) -> None:
    """Fewer than MAX_CLIENTS silent clients: others are answered meanwhile; the silent
    ones are closed at their deadline."""
    idle = [raw(endpoint) for _ in range(server.MAX_CLIENTS - 2)]
    half = raw(endpoint)
    half.sendall(protocol.encode({"op": "ping"})[:3])  # a header never finished
    assert ping(endpoint)["ok"] is True
    for s in [*idle, half]:
        assert closed_by_peer(s)  # (recv returns at the endpoint's deadline, not ours)
        s.close()
    assert ping(endpoint)["ok"] is True


def test_a_flood_of_clients_beyond_the_limit(endpoint: server.Endpoint) -> None:
    """MAX_CLIENTS silent clients hold every slot: more are closed at once (not queued to
    hang), and once the silent ones time out, the endpoint answers again."""
    idle = [raw(endpoint) for _ in range(server.MAX_CLIENTS)]
    assert wait_for(lambda: len(endpoint._clients) == server.MAX_CLIENTS)
    extra = raw(endpoint)
    try:
        extra.sendall(protocol.encode({"op": "ping"}))
        assert extra.recv(10) == b""  # closed unanswered
    except (ConnectionResetError, BrokenPipeError):
        pass  # (closed before or with our request unread: as unanswered)
    extra.close()
    for s in idle:
        closed_by_peer(s)
        s.close()
    assert ping(endpoint)["ok"] is True


def test_many_clients_at_once(endpoint: server.Endpoint) -> None:
    results: list[bool] = []

    def one() -> None:
        try:
            results.append(ping(endpoint)["ok"] is True)
        except (client.QueryError, OSError):
            results.append(False)  # refused beyond MAX_CLIENTS: allowed

    threads = [threading.Thread(target=one) for _ in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 60 and any(results)
    assert ping(endpoint)["ok"] is True


def test_a_client_that_does_not_read_its_answer(endpoint: server.Endpoint) -> None:
    """A 4 MiB answer to a client that never reads: others are answered meanwhile, and the
    hog is dropped at its deadline."""
    hog = raw(endpoint)
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.sendall(protocol.encode({"op": "snapshot"}))
    assert ping(endpoint)["ok"] is True
    assert closed_by_peer(hog)
    hog.close()
    assert ping(endpoint)["ok"] is True


def test_a_big_answer_arrives_whole(endpoint: server.Endpoint) -> None:
    got = client.query(endpoint.path, {"op": "snapshot"}, timeout=20.0)
    assert len(got["big"]) == 4 << 20


def test_close_unlinks_the_socket(endpoint: server.Endpoint) -> None:
    endpoint.close()
    assert not endpoint.path.exists()


NOBODY = 65534


def _as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv (util-linux) to run a client as nobody")
def test_another_user_reads_nothing() -> None:
    """Another uid cannot read the process: in the private directory it cannot even reach
    the socket, and where a directory was opened up, SO_PEERCRED refuses it."""
    tmp_path = Path(tempfile.mkdtemp(prefix="smcr-diag-test-"))  # (pytest's is root's alone)
    try:
        _another_user(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _another_user(tmp_path: Path) -> None:
    tmp_path.chmod(0o711)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    ep = server.Endpoint(private / "1.sock", answer)
    code = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
            "try:\n s.connect(sys.argv[1]); print('connected')\n"
            "except PermissionError: print('EACCES')\n")
    try:
        out = _as_nobody(code.replace("sys.argv[1]", repr(str(ep.path))))
        assert out.stdout.strip() == "EACCES", out.stderr
    finally:
        ep.close()
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o755)
    ep = server.Endpoint(opened / "2.sock", answer)
    try:
        ep.path.chmod(0o666)  # as if someone made it reachable: the uid check still holds
        code = ("import socket,struct\ns=socket.socket(socket.AF_UNIX)\n"
                f"s.connect({str(ep.path)!r})\n"
                "try:\n s.sendall(struct.pack('>I',13)+b'{\"op\":\"ping\"}')\n"
                " print(repr(s.recv(100)))\n"
                "except (BrokenPipeError, ConnectionResetError): print('closed')\n")
        out = _as_nobody(code)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() in ("b''", "closed"), out.stdout
        assert ep.refused >= 1
        assert ping(ep)["ok"] is True  # and it still answers us
    finally:
        ep.close()


def test_the_tools_ask_no_socket_through_a_symlink_nor_another_owners(
        endpoint: server.Endpoint, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A ``<pid>.sock`` that is a symlink to some other socket of the host (here a live
    endpoint elsewhere), or a socket file of another uid, is not connected to: a user
    must not make root's ``smcr ss`` write its request into another socket."""
    scanned = tmp_path / "scanned"
    scanned.mkdir(mode=0o700)
    monkeypatch.setenv("SMCR_DIAG_DIR", str(scanned))
    (scanned / f"{os.getpid()}.sock").symlink_to(endpoint.path)
    replies = client.gather("ping", cleanup=False)
    assert [r.answer for r in replies] == [None]
    assert endpoint.answered == 0
    with pytest.raises(client.QueryError):
        client.query(scanned / f"{os.getpid()}.sock", {"op": "ping"}, 5.0, os.getuid())
    assert endpoint.answered == 0
    assert client.query(endpoint.path, {"op": "ping"}, 10.0, os.getuid())["ok"] is True
    with pytest.raises(client.QueryError):  # the real file, but not of the uid asked for
        client.query(endpoint.path, {"op": "ping"}, 5.0, os.getuid() + 1)
    assert endpoint.answered == 1
