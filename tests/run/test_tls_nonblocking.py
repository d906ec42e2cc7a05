"""TLS over SMC-R (:mod:`smcr.run.tls`) on non-blocking sockets driven by readiness, as
event loops drive it (tornado's ``SSLIOStream``: ``do_handshake_on_connect=False``,
then ``do_handshake``/``recv_into``/``send`` whenever ``selectors`` says the
descriptor is ready), held against ``ssl``'s own socket over TCP in the same test.

Both ends are in this process; the SMC-R pair is wrapped by a context class that
``smcr.run.patches.patch_ssl`` made (what ``smcr run`` does to ``ssl.SSLContext``), so the
TCP pair gets ``ssl.SSLSocket`` and the SMC-R pair ``SmcTlsSocket``.
"""

from __future__ import annotations

import contextlib
import selectors
import ssl
import time
import types
from collections.abc import Callable

from smcr.run.patches import patch_ssl
from smcr.run.tls import SmcTlsSocket
from tests.socket.test_error_paths import pair
from tests.support import REPO_ROOT

CERT = str(REPO_ROOT / "tests" / "run" / "cert.pem")
KEY = str(REPO_ROOT / "tests" / "run" / "key.pem")
DEADLINE = 10.0  # seconds a story may wait for readiness before it gives up


class Context(ssl.SSLContext):
    """An ``SSLContext`` whose ``wrap_socket`` is ``smcr run``'s (the module's own stays)."""


_module = types.ModuleType("ssl_of_these_tests")
_module.SSLContext = Context  # type: ignore[attr-defined]
patch_ssl(_module)

Story = Callable[[ssl.SSLSocket, ssl.SSLSocket, selectors.BaseSelector], object]


def tls_both(story: Story) -> tuple[object, object]:
    """``story(client, server, selector)`` over TLS on TCP, then on SMC-R."""
    return run_tls("tcp", story), run_tls("smc", story)


def run_tls(kind: str, story: Story, server_hostname: str = "localhost") -> object:
    server_ctx = Context(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(CERT, KEY)
    client_ctx = Context(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(CERT)
    with pair(kind) as (a, b), selectors.DefaultSelector() as sel:
        a.setblocking(False)
        b.setblocking(False)
        client = client_ctx.wrap_socket(a, server_hostname=server_hostname,
                                        do_handshake_on_connect=False)  # fmt: skip
        server = server_ctx.wrap_socket(b, server_side=True, do_handshake_on_connect=False)
        assert isinstance(client, SmcTlsSocket) == isinstance(server, SmcTlsSocket) == (
            kind == "smc")  # fmt: skip
        try:
            return story(client, server, sel)
        finally:
            client.close()
            server.close()


def handshake(client: ssl.SSLSocket, server: ssl.SSLSocket,
              sel: selectors.BaseSelector) -> dict[str, str]:  # fmt: skip
    """Both handshakes, each step when its descriptor is ready for what the last one
    wanted; the reasons of those that failed (``SSLError.reason``) by role."""
    failed: dict[str, str] = {}
    todo = {client, server}
    for tls in todo:
        sel.register(tls, selectors.EVENT_WRITE)
    deadline = time.monotonic() + DEADLINE
    while todo:
        assert time.monotonic() < deadline, "handshake: no readiness"
        for key, _ in sel.select(1.0):
            ready = key.fileobj
            assert isinstance(ready, ssl.SSLSocket)
            try:
                ready.do_handshake()
            except ssl.SSLWantReadError:
                sel.modify(ready, selectors.EVENT_READ)
            except ssl.SSLWantWriteError:
                sel.modify(ready, selectors.EVENT_WRITE)
            except ssl.SSLError as exc:
                failed["server" if ready is server else "client"] = str(exc.reason)
                todo.discard(ready)
                sel.unregister(ready)
            else:
                todo.discard(ready)
                sel.unregister(ready)
    return failed


def pump(sel: selectors.BaseSelector, sender: ssl.SSLSocket | None, data: bytes,
         receiver: ssl.SSLSocket, chunk: int = 65536) -> bytes:  # fmt: skip
    """Send ``data`` (from its start, if a sender is given; up to 128 KiB a call) and
    receive until as many bytes came (up to ``chunk`` a call), one call per readiness
    event, as an event loop does; what came."""
    got = bytearray()
    sent = 0
    sel.register(receiver, selectors.EVENT_READ)
    if sender is not None:
        sel.register(sender, selectors.EVENT_WRITE)
    deadline = time.monotonic() + DEADLINE
    try:
        while len(got) < len(data) and time.monotonic() < deadline:
            for key, _ in sel.select(1.0):
                if key.fileobj is sender:
                    try:
                        sent += sender.send(data[sent : sent + 131072])
                    except ssl.SSLWantWriteError:
                        continue
                    if sent == len(data):
                        sel.unregister(sender)
                        sender = None
                else:
                    buf = bytearray(chunk)
                    try:
                        got += buf[: receiver.recv_into(buf)]
                    except ssl.SSLWantReadError:
                        continue
    finally:
        for tls in (sender, receiver):
            if tls is not None:
                sel.unregister(tls)
    return bytes(got)


PATTERN = bytes(range(251))  # a length prime to the record size: misplaced bytes show


def records_behind_a_read(client: ssl.SSLSocket, server: ssl.SSLSocket,
                          sel: selectors.BaseSelector) -> object:  # fmt: skip
    """Many records sent at once; the receiver reads one chunk per readable event: the
    records behind the one it read must keep the descriptor readable."""
    assert handshake(client, server, sel) == {}
    data = PATTERN * 1000  # 15 records of 16 KiB
    return pump(sel, client, data, server, chunk=16384) == data


def test_records_not_yet_read_keep_the_descriptor_readable_as_on_tcp() -> None:
    assert tls_both(records_behind_a_read) == (True, True)


def both_ways_at_once(client: ssl.SSLSocket, server: ssl.SSLSocket,
                      sel: selectors.BaseSelector) -> object:  # fmt: skip
    """Each end sends 16 MB (more than the socket takes: SMC-R's send buffer and the
    peer's RMB, TCP's buffers) and reads what the other sends, each call when the
    selector says so, retrying a send that raised ``SSLWantWriteError`` with the same
    bytes; a read raising anything but ``SSLWantReadError`` fails, as in an event
    loop.  What each end received, and whether a send ever had to wait."""
    assert handshake(client, server, sel) == {}
    data = {client: PATTERN * 66000, server: PATTERN[::-1] * 66000}
    sent = dict.fromkeys(data, 0)
    got = {tls: bytearray() for tls in data}
    waited = False
    for tls in data:
        sel.register(tls, selectors.EVENT_READ | selectors.EVENT_WRITE)
    deadline = time.monotonic() + 3 * DEADLINE
    buf = bytearray(65536)
    while any(len(got[tls]) < len(data[tls]) for tls in data):
        assert time.monotonic() < deadline, "no readiness"
        for key, events in sel.select(1.0):
            end = key.fileobj
            assert isinstance(end, ssl.SSLSocket)
            if events & selectors.EVENT_READ:
                with contextlib.suppress(ssl.SSLWantReadError):
                    got[end] += buf[: end.recv_into(buf)]
            if events & selectors.EVENT_WRITE and sent[end] < len(data[end]):
                try:
                    sent[end] += end.send(data[end][sent[end] : sent[end] + 131072])
                except ssl.SSLWantWriteError:
                    waited = True
                if sent[end] == len(data[end]):
                    sel.modify(end, selectors.EVENT_READ)
    for tls in data:
        sel.unregister(tls)
    return waited, got[server] == data[client], got[client] == data[server]


def test_sends_that_wait_and_reads_between_them_as_on_tcp() -> None:
    tcp, smc = tls_both(both_ways_at_once)
    # (TCP's buffers may take it all while both ends read; SMC-R's must make sends wait,
    # or this test would not test what it is for)
    assert tcp[1:] == (True, True) and smc == (True, True, True)  # type: ignore[index]


def test_the_peer_learns_why_a_handshake_failed_as_on_tcp() -> None:
    """The client rejects the server's certificate (another name): the server's
    handshake fails with the alert the client sent, not with a bare end of stream."""
    tcp, smc = (run_tls(kind, handshake, server_hostname="elsewhere.example")
                for kind in ("tcp", "smc"))  # fmt: skip
    assert tcp == smc
    assert isinstance(tcp, dict) and tcp["client"] == "CERTIFICATE_VERIFY_FAILED"
    assert "BAD_CERTIFICATE" in tcp["server"]
