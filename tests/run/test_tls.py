"""``smcr.run.tls`` in one process: the ``ssl.SSLSocket`` API of a TLS socket over SMC-R,
held against the ``ssl`` module's own socket over TCP in the same story.

The patch goes on a subclass of ``ssl.SSLContext`` (:func:`smcr.run.patches.patch_ssl` takes
the module whose ``SSLContext`` it changes), so the rest of the test session keeps the
``ssl`` module as it is.  A TCP socket wrapped by that context gets ssl's own socket;
an SMC socket in SMC-R mode gets :class:`~smcr.run.tls.SmcTlsSocket`.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import tempfile
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import smcr
from smcr.run import patches, tls
from tests.run.programs import CERT, KEY
from tests.socket.test_error_paths import recv_exactly


class Context(ssl.SSLContext):
    """An SSLContext class of this module's own, for the patch."""


patches.patch_ssl(types.SimpleNamespace(SSLContext=Context))  # type: ignore[arg-type]


def outcome(call: Callable[[], object]) -> object:
    """What a call gives: its result, or its exception's type and errno."""
    try:
        return call()
    except (OSError, ValueError, NotImplementedError) as exc:
        return type(exc), getattr(exc, "errno", None)


def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server's, client's): our certificate, ALPN ``smcr-test`` on both."""
    server = Context(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(CERT, KEY)
    client = Context(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(CERT)
    for ctx in (server, client):
        ctx.set_alpn_protocols(["smcr-test"])
    return server, client


@contextmanager
def tls_pair(kind: str) -> Iterator[tuple[ssl.SSLSocket, ssl.SSLSocket]]:
    """A connected (client, server) pair of TLS sockets, handshakes done: over SMC-R
    (``"smc"``: both ends SMCSocket) or over TCP (``"tcp"``: ssl's own sockets)."""
    server_ctx, client_ctx = contexts()
    make_server = smcr.create_server if kind == "smc" else socket.create_server
    make_client = smcr.create_connection if kind == "smc" else socket.create_connection
    with make_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(20)
        accepted: list[ssl.SSLSocket] = []

        def serve() -> None:
            conn, _ = srv.accept()
            accepted.append(server_ctx.wrap_socket(conn, server_side=True))

        t = threading.Thread(target=serve)
        t.start()
        raw = make_client(srv.getsockname(), timeout=20)
        client = client_ctx.wrap_socket(raw, server_hostname="localhost")
        t.join(20)
        assert accepted, "the server's handshake did not end"
        server = accepted[0]
    try:
        yield client, server
    finally:
        client.close()
        server.close()


def story(c: ssl.SSLSocket, s: ssl.SSLSocket) -> list[object]:
    """What a program sees of the SSLSocket API, in order."""
    der = ssl.PEM_cert_to_DER_cert(Path(CERT).read_text())
    cipher = c.cipher()
    seen: list[object] = [c.version(), cipher[1] if cipher else None,
                          c.getpeercert()["subject"], c.getpeercert(True) == der,  # type: ignore[index]
                          s.getpeercert(), c.selected_alpn_protocol(),
                          s.selected_alpn_protocol(), c.compression(),
                          c.session_reused]  # fmt: skip
    s.sendall(b"abc")
    seen += [c.recv(1), c.pending(), c.recv(10), c.pending()]  # one record: two left in it
    buf = bytearray(16)
    s.send(b"hello")
    n = c.recv_into(buf)
    seen.append(bytes(buf[:n]))
    seen += [outcome(lambda: c.recv(1, socket.MSG_PEEK)), outcome(lambda: c.send(b"x", 1)),
             outcome(lambda: c.recvfrom(1)), outcome(lambda: c.connect(("127.0.0.1", 9))),
             outcome(c.dup)]  # fmt: skip
    data = os.urandom(100_000)
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        seen.append(c.sendfile(f))
    seen.append(recv_exactly(s, len(data)) == data)
    c.settimeout(0.2)
    seen += [c.gettimeout(), outcome(lambda: c.recv(1))]  # nothing comes: timed out
    c.settimeout(20)
    unwrapped: list[socket.socket] = []
    t = threading.Thread(target=lambda: unwrapped.append(s.unwrap()))
    t.start()
    seen.append(c._sslobj is not None)  # type: ignore[attr-defined]  # (programs look)
    plain_c = c.unwrap()  # both ends shut TLS down; the connection beneath carries on
    t.join(20)
    plain_s = unwrapped[0]
    # the same object, in clear text now (ftplib's ccc keeps using it), once only
    seen += [plain_c is c, plain_s is s, c._sslobj, outcome(c.unwrap)]  # type: ignore[attr-defined]
    plain_s.sendall(b"in clear")
    seen.append(recv_exactly(plain_c, 8))
    plain_c.sendall(b"back")
    seen += [recv_exactly(plain_s, 4), c.version()]
    return seen


def test_the_sslsocket_api_over_smcr_answers_as_over_tcp() -> None:
    with tls_pair("tcp") as (c, s):
        assert type(c) is not tls.SmcTlsSocket
        over_tcp = story(c, s)
    with tls_pair("smc") as (c, s):
        assert type(c) is tls.SmcTlsSocket and type(s) is tls.SmcTlsSocket
        assert isinstance(c, ssl.SSLSocket) and c.smc_info().mode == "SMCR"
        over_smc = story(c, s)
    assert over_smc == over_tcp
    assert over_tcp[0] == "TLSv1.3" and over_tcp[5:7] == ["smcr-test", "smcr-test"]
    assert over_tcp[9:13] == [b"a", 2, b"bc", 0]


def reset_story(c: ssl.SSLSocket, s: ssl.SSLSocket) -> list[object]:
    """The client resets the connection (``SO_LINGER`` 0: over SMC-R an abort CDC);
    the server reads, then writes, then reads with ragged EOFs not suppressed."""
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    seen: list[object] = [s.read()]

    def errors(call: Callable[[], object]) -> object:
        try:
            return call()
        except OSError as exc:
            return type(exc), exc.errno

    seen.append(errors(lambda: s.write(b"late")))
    s.suppress_ragged_eofs = False  # type: ignore[attr-defined]
    seen.append(errors(s.read))
    return seen


def test_a_reset_reads_as_a_ragged_eof_as_over_tcp() -> None:
    """``ssl`` reports a reset beneath ``read``/``write`` as a TLS EOF (``SSL_read_ex``
    returns 0; ``_ssl.c`` makes that an ``SSLEOFError``, ``b""`` when suppressed): a
    client that closes with the server's TLS 1.3 session tickets unread resets the
    connection, and CPython's test servers stopped at the ``ConnectionResetError`` we
    raised instead (test_ssl's get_server_certificate tests, about 1 run in 10)."""
    with tls_pair("tcp") as (c, s):
        over_tcp = reset_story(c, s)
    with tls_pair("smc") as (c, s):
        assert type(s) is tls.SmcTlsSocket
        over_smc = reset_story(c, s)
    assert over_smc == over_tcp
    assert over_tcp == [b"", (ssl.SSLEOFError, ssl.SSL_ERROR_EOF),
                        (ssl.SSLEOFError, ssl.SSL_ERROR_EOF)]  # fmt: skip


def test_what_a_tls_socket_over_smcr_refuses() -> None:
    """Where the SMC socket beneath cannot follow ssl's socket: ``detach`` (the descriptor
    is not where the records go) is refused with EOPNOTSUPP; the repr names both."""
    with tls_pair("smc") as (c, _s):
        with pytest.raises(OSError) as exc:
            c.detach()
        assert exc.value.errno == 95  # EOPNOTSUPP
        assert repr(c).startswith("<smcr.SmcTlsSocket over <smcr.socket.SMCSocket fd=")




@pytest.mark.parametrize("kind", ["tcp", "smc"])
def test_a_failed_call_keeps_no_hold_on_the_buffer(kind: str) -> None:
    """tornado's "bytearray resizable after error": the program keeps the error and
    resizes its buffer (a view kept by a frame of ours forbids it: ``BufferError``)."""
    with tls_pair(kind) as (c, s):
        c.settimeout(0.05)
        buf = bytearray(100)
        kept: list[OSError] = []
        for call in (lambda: c.recv_into(buf), lambda: c.read(10, buf)):
            with pytest.raises(TimeoutError) as timed_out:
                call()
            kept.append(timed_out.value)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # reset: writes fail
        c.settimeout(5)
        data = bytearray(1 << 20)
        with pytest.raises(OSError) as info:
            for _ in range(100):  # (send, as event loops write: ssl's own sendall is
                c.send(data)  # Python, and its error keeps a view of the data over TCP too)
        kept.append(info.value)
        buf.append(1)
        del data[:]
