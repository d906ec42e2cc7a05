"""Unmodified-looking programs for the ``smcr run`` tests: standard library only.

Each is run as ``[smcr run] python -m tests.run.programs NAME ARGS...`` and prints
one JSON line (servers first print their port on a line of its own).  They
never import smcr: what they learn about it comes from ``getattr(sock,
"smc_info")``, which only an SMC socket has.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import http.client
import http.server
import json
import multiprocessing
import os
import selectors
import socket
import socketserver
import ssl
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CERT, KEY = str(HERE / "cert.pem"), str(HERE / "key.pem")


def mode(sock: Any) -> str:
    """SMCR/TCP for an SMC socket (or a TLS socket over one), 'plain' otherwise."""
    info = getattr(sock, "smc_info", None)
    return info().mode if info is not None else "plain"


def tcp_bytes(sock: socket.socket) -> tuple[int, int]:
    """(bytes acked, bytes received) of the kernel's TCP connection under ``sock``
    (``struct tcp_info``): what really went over TCP."""
    import _socket  # noqa: PLC0415 - the C type: every socket class is one

    raw = _socket.socket.getsockopt(sock, socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    acked, received = struct.unpack_from("=QQ", raw, 120)
    return int(acked), int(received)


def out(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


# ------------------------------------------------------------------ http


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"mode": mode(self.connection),
                           "is_socket": isinstance(self.connection, socket.socket)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def http_server(requests: str) -> None:
    """A ThreadingHTTPServer answering ``requests`` GETs with the mode of each connection."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    print(srv.server_address[1], flush=True)
    for _ in range(int(requests)):
        srv.handle_request()
    srv.server_close()
    out(done=True)


def http_clients(port: str) -> None:
    """urllib, then http.client: what the server said, and the client's own mode."""
    url = f"http://127.0.0.1:{port}/"
    first = json.loads(urllib.request.urlopen(url, timeout=20).read())
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=20)
    conn.connect()
    own = mode(conn.sock)
    conn.request("GET", "/")
    second = json.loads(conn.getresponse().read())
    conn.close()
    out(urllib=first, http_client=second, client_mode=own)


def _body(size: int) -> bytes:
    """``size`` bytes of a pattern both ends know (no length on the wire says it)."""
    return hashlib.shake_256(b"close-delimited").digest(size)


def close_delimited_server(size: str) -> None:
    """HTTP/1.0 and HTTP/0.9 as servers of the time answered: a body whose end is the close
    of the connection (no Content-Length).  Two clients: the first asks ``GET / HTTP/1.0``
    (status line and headers, then the body), the second ``GET /`` alone (HTTP/0.9: the
    body only); each connection is closed right after the last write, as ``socketserver``
    does when the handler returns."""
    srv = socket.create_server(("127.0.0.1", 0))
    print(srv.getsockname()[1], flush=True)
    modes, requests = [], []
    for _ in range(2):
        conn, _ = srv.accept()
        with conn, conn.makefile("rb") as reader:
            request = reader.readline()
            requests.append(request.decode())
            head = b""
            if request.rstrip() != b"GET /":  # (HTTP/0.9 has no headers, and none back)
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                head = b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n"
            conn.sendall(head + _body(int(size)))
            modes.append(mode(conn))
    srv.close()
    out(modes=modes, requests=requests)


def close_delimited_clients(port: str, size: str) -> None:
    """http.client reads an HTTP/1.0 body to the server's close; a raw socket sends an
    HTTP/0.9 request and reads to EOF: whether each body is whole."""
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=20)
    conn.connect()
    first_mode = mode(conn.sock)
    conn._http_vsn, conn._http_vsn_str = 10, "HTTP/1.0"  # type: ignore[attr-defined]
    conn.putrequest("GET", "/", skip_host=True, skip_accept_encoding=True)
    conn.endheaders()
    response = conn.getresponse()
    http10 = response.read()
    length_header = response.getheader("Content-Length")
    conn.close()
    with socket.create_connection(("127.0.0.1", int(port)), timeout=20) as s:
        second_mode = mode(s)
        s.sendall(b"GET /\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    expected = _body(int(size))
    out(http10_whole=http10 == expected, status=response.status, version=response.version,
        length_header=length_header, http09_whole=b"".join(chunks) == expected,
        modes=[first_mode, second_mode])  # fmt: skip


# ------------------------------------------------------------------ TLS


def tls_server() -> None:
    """One TLS connection: read to EOF, answer the SHA-256, report what it saw."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(CERT, KEY)
    srv = socket.create_server(("127.0.0.1", 0))
    print(srv.getsockname()[1], flush=True)
    conn, _ = srv.accept()
    tls = ctx.wrap_socket(conn, server_side=True)
    version = tls.version()
    digest = hashlib.sha256()
    reader = tls.makefile("rb")
    left = size = int.from_bytes(reader.read(8), "big")
    while left and (data := reader.read(min(left, 65536))):
        digest.update(data)
        left -= len(data)
    reader.close()
    tls.sendall(digest.digest())
    assert tls.recv(1) == b""  # the client's close_notify (or EOF)
    out(mode=mode(tls), version=version, size=size, is_sslsocket=isinstance(tls, ssl.SSLSocket),
        is_socket=isinstance(tls, socket.socket), tcp=tcp_bytes(tls))
    tls.close()
    srv.close()


def tls_listener(clients: str) -> None:
    """An HTTPS-style server: the *listening* socket is wrapped, accept() gives TLS
    sockets; each client's length-prefixed bytes are answered with their SHA-256."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(CERT, KEY)
    srv = ctx.wrap_socket(socket.create_server(("127.0.0.1", 0)), server_side=True)
    print(srv.getsockname()[1], flush=True)
    modes = []
    for _ in range(int(clients)):
        tls, _ = srv.accept()
        reader = tls.makefile("rb")
        size = int.from_bytes(reader.read(8), "big")
        tls.sendall(hashlib.sha256(reader.read(size)).digest())
        reader.close()
        modes.append(mode(tls))
        tls.close()
    srv.close()
    out(modes=modes)


def tls_client(port: str, size: str) -> None:
    """Send ``size`` random bytes over TLS (after their length), read the server's
    SHA-256 of them; report whether it matched and what went over TCP."""
    ctx = ssl.create_default_context(cafile=CERT)
    sock = socket.create_connection(("127.0.0.1", int(port)), timeout=30)
    tls = ctx.wrap_socket(sock, server_hostname="localhost")
    data = os.urandom(int(size))
    tls.sendall(len(data).to_bytes(8, "big") + data)
    digest = b""
    while len(digest) < 32 and (part := tls.recv(32 - len(digest))):
        digest += part
    out(mode=mode(tls), ok=digest == hashlib.sha256(data).digest(), tcp=tcp_bytes(tls))
    tls.close()


# ------------------------------------------------------------------ asyncio


async def _asyncio_tls(size: int) -> dict[str, Any]:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(CERT, KEY)
    client_ctx = ssl.create_default_context(cafile=CERT)
    seen: dict[str, Any] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["server"] = mode(writer.get_extra_info("socket")._sock)
        digest = hashlib.sha256()
        left = int.from_bytes(await reader.readexactly(8), "big")
        while left:
            data = await reader.read(min(left, 65536))
            digest.update(data)
            left -= len(data)
        writer.write(digest.digest())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                   server_hostname="localhost")
    client = mode(writer.get_extra_info("socket")._sock)
    data = os.urandom(size)
    writer.write(size.to_bytes(8, "big"))
    for i in range(0, size, 1 << 16):
        writer.write(data[i : i + (1 << 16)])
        await writer.drain()  # flow control: the transport pauses us when its buffer fills
    digest = await reader.readexactly(32)
    writer.close()
    server.close()
    await server.wait_closed()
    return {"client": client, "server": seen["server"],
            "ok": digest == hashlib.sha256(data).digest()}


async def _asyncio_sendfile(size: int) -> dict[str, Any]:
    import tempfile  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    data = os.urandom(size)
    srv = socket.create_server(("127.0.0.1", 0))
    srv.setblocking(False)
    cli = socket.socket()
    cli.setblocking(False)
    accepting = asyncio.ensure_future(loop.sock_accept(srv))
    await loop.sock_connect(cli, srv.getsockname())
    conn, _ = await accepting
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        sending = asyncio.ensure_future(loop.sock_sendfile(cli, f))
        got = bytearray()
        while len(got) < size:
            got += await loop.sock_recv(conn, 1 << 16)
        sent = await sending
        # where os.sendfile is missing (asyncio's own test patches it away), the native
        # path refuses, and the file position stays
        from unittest import mock  # noqa: PLC0415

        f.seek(0)
        with mock.patch("asyncio.unix_events.os", spec=[]):
            try:
                await loop._sock_sendfile_native(cli, f, 0, None)  # type: ignore[attr-defined]
                refused = "sent"
            except asyncio.SendfileNotAvailableError as exc:
                refused = f"{exc} at {f.tell()}"
    modes = [mode(cli), mode(conn)]
    for s in (cli, conn, srv):
        s.close()
    return {"modes": modes, "sent": sent, "ok": bytes(got) == data, "without": refused}


def asyncio_sendfile(size: str) -> None:
    """asyncio's sock_sendfile between two sockets of one process."""
    out(**asyncio.run(_asyncio_sendfile(int(size))))


def asyncio_tls(size: str) -> None:
    """asyncio streams with ssl= on both ends, in one process."""
    out(**asyncio.run(_asyncio_tls(int(size))))


# ------------------------------------------------------------------ children


def _smc_class_name(s: socket.socket) -> str:
    """The name of the first of smcr's classes in the hierarchy of ``s``'s class, else of
    the class right above it (``socket``: the C type)."""
    mro = type(s).__mro__
    return next((c.__name__ for c in mro if c.__module__.startswith("smcr")), mro[1].__name__)


def _report_child(queue: Any) -> None:
    s = socket.socket()
    queue.put(_smc_class_name(s))
    s.close()


def children() -> None:
    """Which socket class Python children get: subprocess, and multiprocessing's start
    methods (the first of smcr's classes above the one socket.socket makes)."""
    found: dict[str, str] = {}
    probe = ("import socket; s = socket.socket(); mro = type(s).__mro__; print(next((c.__name__ "
             "for c in mro if c.__module__.startswith('smcr')), mro[1].__name__))")
    found["subprocess"] = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                         text=True, check=True).stdout.strip()
    for method in ("fork", "spawn", "forkserver"):
        ctx: Any = multiprocessing.get_context(method)
        queue = ctx.Queue()
        proc = ctx.Process(target=_report_child, args=(queue,))
        proc.start()
        found[method] = queue.get(timeout=60)
        proc.join(30)
    found["self"] = _smc_class_name(socket.socket())
    out(**found)


# ------------------------------------------------------------------ socket API


def socket_api() -> None:
    """What other socket code relies on: untouched AF_UNIX, socketpair, isinstance, dup,
    fromfd, family/type, makefile and selectors over an SMC-R connection in one process."""
    results: dict[str, Any] = {}
    a, b = socket.socketpair()
    a.sendall(b"unix")
    results["socketpair"] = (b.recv(4) == b"unix" and mode(a) != "SMCR"
                             and a.family == socket.AF_UNIX)  # fmt: skip
    a.close()
    b.close()
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(20)
    cli = socket.create_connection(srv.getsockname(), timeout=20)
    conn, _ = srv.accept()
    conn.settimeout(20)
    results["modes"] = [mode(cli), mode(conn)]
    results["isinstance"] = all(isinstance(s, socket.socket) for s in (srv, cli, conn))
    results["family_type"] = [cli.family == socket.AF_INET, cli.type == socket.SOCK_STREAM]
    fw, fr = cli.makefile("wb"), conn.makefile("rb")
    fw.write(b"line one\n")
    fw.flush()
    results["makefile"] = fr.readline() == b"line one\n"
    fw.close()
    fr.close()
    sel = selectors.DefaultSelector()
    sel.register(conn, selectors.EVENT_READ)
    cli.sendall(b"x")
    results["selectors"] = bool(sel.select(20)) and conn.recv(1) == b"x"
    sel.close()
    dup = srv.dup()
    results["dup_listener"] = (isinstance(dup, socket.socket)
                               and dup.getsockname() == srv.getsockname())  # fmt: skip
    dup.close()
    adopted = socket.fromfd(srv.fileno(), srv.family, socket.SOCK_STREAM)  # a handed-over port
    adopted.settimeout(20)
    with socket.create_connection(srv.getsockname(), timeout=20) as other:
        taken, _ = adopted.accept()
        other.sendall(b"y")
        results["fromfd_listener"] = [adopted.getsockname() == srv.getsockname(),
                                      mode(taken), taken.recv(1).decode()]  # fmt: skip
        taken.close()
    adopted.close()
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    results["udp"] = mode(raw) in ("plain", "INIT") and raw.type == socket.SOCK_DGRAM
    raw.close()
    for s in (cli, conn, srv):
        s.close()
    out(**results)


def own_sockets() -> None:
    """After an SMC-R connection in one process, with its descriptors asked for (readiness
    pairs) and watched: the SMC socket objects other than the program's three (the runtime's
    own doorbells and pairs must be plain sockets, not the program's kind)."""
    import gc  # noqa: PLC0415

    import smcr  # noqa: PLC0415

    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(20)
    cli = socket.create_connection(srv.getsockname(), timeout=20)
    conn, _ = srv.accept()
    sel = selectors.DefaultSelector()
    sel.register(conn, selectors.EVENT_READ)
    cli.sendall(b"x")
    ready = bool(sel.select(20)) and conn.recv(1) == b"x"
    sel.close()
    mine = {id(s) for s in (srv, cli, conn)}
    others = [repr(o) for o in gc.get_objects()
              if isinstance(o, smcr.SMCSocket) and id(o) not in mine and not o._closed]
    out(modes=[mode(cli), mode(conn)], ready=ready, others=others)
    for s in (cli, conn, srv):
        s.close()


def linux_smc_api() -> None:
    """Sockets made with Linux's SMC API (AF_SMC = 43, IPPROTO_SMC = 256): what they are,
    or the errno making them fails with."""
    results: dict[str, Any] = {}
    for name, family, proto in (("af_smc", 43, 0), ("ipproto_smc", socket.AF_INET, 256)):
        try:
            srv = socket.socket(family, socket.SOCK_STREAM, proto)
        except OSError as exc:
            results[name] = errno.errorcode[exc.errno or 0]
            continue
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(20)
        with srv, socket.socket(family, socket.SOCK_STREAM, proto) as cli:
            cli.connect(srv.getsockname())
            conn, _ = srv.accept()
            cli.sendall(b"k")
            results[name] = [int(cli.family), cli.proto, mode(cli), mode(conn),
                             conn.recv(1).decode()]  # fmt: skip
            conn.close()
    out(**results)


# ------------------------------------------------------------------ servers


class _Echo(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline()
        self.wfile.write(json.dumps({"mode": mode(self.request), "line": line.decode()}).encode()
                         + b"\n")


def socketserver_echo(clients: str) -> None:
    """A ThreadingTCPServer echoing one line per client, with its mode."""
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo) as srv:
        print(srv.server_address[1], flush=True)
        for _ in range(int(clients)):
            srv.handle_request()
    out(done=True)


def line_client(port: str) -> None:
    """One line to a line server; print its answer and our mode."""
    with socket.create_connection(("127.0.0.1", int(port)), timeout=20) as s:
        s.sendall(b"hello\n")
        answer = s.makefile("rb").readline()
        out(answer=json.loads(answer), client_mode=mode(s))


SMCR_HEAVY = ("smcr.socket", "smcr.stack", "smcr.core", "smcr.wire", "smcr.rdma",
              "smcr.discovery", "smcr.diag", "smcr.native", "smcr_native__mypyc")
"""smcr's socket layer, runtime, engine, codecs, RNICs, discovery, diag endpoint, the
choice of build and the compiled modules' shared library (with its modules)."""


def _smcr_heavy() -> list[str]:
    """Which of :data:`SMCR_HEAVY` (or their modules) this interpreter has imported."""
    return sorted(name for name in sys.modules
                  if name.startswith(SMCR_HEAVY) and name.split(".")[0] in ("smcr",
                                                                            "smcr_native__mypyc"))


def lazy_start(port: str) -> None:
    """What smcr has imported: at the start, after sockets that are not TCP (AF_UNIX,
    socketpair, UDP) and modules that ``smcr run`` patches (ssl, asyncio), and after a
    TCP connection to a line server (with its mode)."""
    found: dict[str, Any] = {"start": _smcr_heavy(), "hook": type(socket.socket).__module__}
    others = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), *socket.socketpair(),
              socket.socket(socket.AF_INET, socket.SOCK_DGRAM)]
    found["plain"] = [mode(s) for s in others]
    found["isinstance"] = all(isinstance(s, socket.socket) for s in others)
    for s in others:
        s.close()
    found["not_tcp"] = _smcr_heavy()
    with socket.create_connection(("127.0.0.1", int(port)), timeout=20) as s:
        s.sendall(b"lazy\n")
        answer = json.loads(s.makefile("rb").readline())
        found.update(tcp=_smcr_heavy(), mode=answer["mode"], client_mode=mode(s),
                     isinstance_tcp=isinstance(s, socket.socket))
    found["ssl_patched"] = ssl.SSLContext.sslsocket_class is not ssl.SSLSocket
    out(**found)


def hook_classes(port: str) -> None:
    """Sockets the first TCP socket may be: a subclass of socket.socket defined before it
    (as libraries do at import), and one made from a TCP listener's descriptor (made by
    the C type, which smcr run does not change)."""
    import _socket  # noqa: PLC0415 - the C type, under socket.socket

    class Mine(socket.socket):
        pass

    found: dict[str, Any] = {"before": _smcr_heavy()}
    raw = _socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.bind(("127.0.0.1", 0))
    raw.listen()
    listener = socket.socket(fileno=raw.detach())
    found["from_fd"] = listener.smc_info().mode if hasattr(listener, "smc_info") else "plain"
    found["from_fd_mode"] = getattr(listener, "smc_mode", "plain")
    listener.close()
    unix = socket.socket(socket.AF_UNIX)
    with Mine(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(("127.0.0.1", int(port)))
        s.sendall(b"mine\n")
        answer = json.loads(s.makefile("rb").readline())
        found.update(mode=answer["mode"], client_mode=mode(s), name=type(s).__name__,
                     is_mine=isinstance(s, Mine), unix_is_mine=isinstance(unix, Mine),
                     is_socket=isinstance(s, socket.socket))
    unix.close()
    out(**found)


def thread_count(port: str) -> None:
    """Threads of this process (``_thread._count()``, what CPython's tests compare) before
    and after an SMC-R connection to a line server; the objects a full collection walks
    and those it leaves out (frozen); whether a cycle the program lets go is collected."""
    import _thread  # noqa: PLC0415 - the count CPython's threading_helper reads
    import gc  # noqa: PLC0415
    import weakref  # noqa: PLC0415

    before = _thread._count()
    with socket.create_connection(("127.0.0.1", int(port)), timeout=20) as s:
        s.sendall(b"count\n")
        answer = json.loads(s.makefile("rb").readline())

    class Node:
        pass

    node = Node()
    node.me = node  # type: ignore[attr-defined]
    gone = weakref.ref(node)
    del node
    gc.collect()
    out(before=before, after=_thread._count(), mode=answer["mode"], client_mode=mode(s),
        walked=len(gc.get_objects()), frozen=gc.get_freeze_count(),
        cycle_collected=gone() is None)  # fmt: skip


def prefork_server(workers: str) -> None:
    """Listen, fork ``workers`` children that accept one client each (the parent never
    accepts): each child answers its mode and pid."""
    srv = socket.create_server(("127.0.0.1", 0))
    print(srv.getsockname()[1], flush=True)
    pids = []
    for _ in range(int(workers)):
        pid = os.fork()
        if pid == 0:
            conn, _ = srv.accept()
            conn.makefile("rb").readline()
            conn.sendall(json.dumps({"mode": mode(conn), "line": str(os.getpid())}).encode()
                         + b"\n")
            conn.close()
            os._exit(0)
        pids.append(pid)
    codes = [os.waitpid(pid, 0)[1] for pid in pids]
    out(exit_codes=codes)


class _DigestHandler(socketserver.StreamRequestHandler):
    """Reads a length line and that many bytes; answers the SHA-256, the bytes reversed,
    and a JSON line of its pid and mode."""

    def handle(self) -> None:
        n = int(self.rfile.readline())
        data = self.rfile.read(n)
        self.wfile.write(hashlib.sha256(data).hexdigest().encode() + b"\n" + data[::-1])
        self.wfile.write(json.dumps({"pid": os.getpid(), "mode": mode(self.request)}).encode()
                         + b"\n")


def forking_server(clients: str) -> None:
    """socketserver.ForkingTCPServer: each request served in a child of its own."""
    with socketserver.ForkingTCPServer(("127.0.0.1", 0), _DigestHandler) as srv:
        print(srv.server_address[1], flush=True)
        for _ in range(int(clients)):
            srv.handle_request()
        srv.collect_children(blocking=True)
        out(server_pid=os.getpid(), children_left=len(srv.active_children or ()))


def digest_clients(port: str, sizes: str) -> None:
    """One connection per size: send that many random bytes, check the answer."""
    seen = []
    for size in map(int, sizes.split(",")):
        data = os.urandom(size)
        with socket.create_connection(("127.0.0.1", int(port)), timeout=60) as s:
            s.sendall(f"{size}\n".encode() + data)
            f = s.makefile("rb")
            ok = f.readline().strip().decode() == hashlib.sha256(data).hexdigest()
            ok = ok and f.read(size) == data[::-1]
            seen.append({"ok": ok, "client_mode": mode(s), **json.loads(f.readline())})
    out(seen=seen)


def main() -> None:
    name, *args = sys.argv[1:]
    globals()[name](*args)


if __name__ == "__main__":
    main()
