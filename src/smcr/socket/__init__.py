"""``SMCSocket``: a ``socket.socket`` (stream) that speaks SMC-R where the peer does.

Whether it may: discovery (:mod:`smcr.discovery`) says, per connection, whether
the peer offered SMC (the TCP option in its SYN or SYN-ACK, or a peer policy).
If not, the socket is plain TCP at once (reason ``0x03010000``) and the peer
never sees a CLC byte.  If so, the CLC handshake runs; after it a socket is in
one of two modes:

* ``SMCR``: data goes through the connection's data path
  (:class:`smcr.stack.conn.DataPath`): ``send`` writes into the peer's RMBE (inline,
  or through the send buffer, which the engine RDMA-WRITEs); ``recv`` copies out of
  our own RMBE.  The TCP connection stays open, idle; ``fileno()`` is a readiness
  descriptor of the runtime's.
* ``TCP``: fallback; every call goes to the TCP socket, after any bytes the
  peer sent behind its last CLC message (they are the application's).

Either way :meth:`SMCSocket.smc_info` tells how the socket is connected and the
local/peer decline codes (what ``smcss`` prints as ``<local>/<remote>``).

The socket is a subclass of ``socket.socket`` whose own descriptor is the TCP
socket (the runtime holds a duplicate of it, which outlives ours when the
application closes first).  Sockets of other families and types are plain
sockets (``PLAIN``), so ``smcr run`` can make every socket one of these.

Background work, as Linux's workers do it: a listening socket has an accept
queue (:class:`~smcr.socket.acceptq.AcceptQueue`) from ``listen`` on, whose handshakes run side by
side, driven by the process's watcher thread (:mod:`smcr.stack.watcher`) and
the runtime; ``accept`` takes what has finished.  A non-blocking ``connect``
returns ``EINPROGRESS`` and finishes the same way
(:class:`~smcr.socket.connecting.Connecting`).
Blocking ``connect`` runs its handshake in the caller's thread.

Closing.  ``close`` leaves what the send buffer still holds to the runtime,
which sends it and then the closing CDC, giving the peer ``close_wait_tx`` (2 s,
as Linux's ``smc_close_active``) after each read to take more; ``close`` returns
at once, as TCP's does.  With ``SO_LINGER`` on (kept on the TCP socket, where
``setsockopt`` passes it), ``close`` itself waits its linger time.  A linger
time of 0 is an abortive close: the send buffer is dropped and an abort CDC
sent, so the peer's reads end in ``ECONNRESET`` as after a TCP reset (the
runtime keeps the connection's RMB until the peer's closing CDC answers, as
Linux does: the peer may still be writing) -- Linux
SMC sends its ordinary close CDC there (an abort only when unread data remains)
and resets only the idle TCP connection, so its peer reads EOF; we follow what a
``socket.socket`` program asks for with that option.
``shutdown(SHUT_WR)`` sends the done-writing CDC after the send buffer's last
byte, however long that takes, as TCP sends its FIN after its data.

A socket in SMC-R mode that is garbage-collected unclosed is closed as
``close`` would: ``socket.socket``'s own finalizer warns (``ResourceWarning``)
and closes our descriptor, and a ``weakref.finalize`` (holding the socket's
calls and so the connection, never the socket) hands the connection to the runtime.  The
collector may run in any thread, even one holding the runtime's lock, and must
not wait: the runtime's progress thread takes the connection
(:meth:`Stack.orphan`), waits for the send buffer without blocking anyone (the
linger time or ``close_wait_tx``: what Linux's kernel does after ``close``,
done here by the thread that owns progress), then sends the closing CDC.
Sockets still referenced at interpreter exit are left to the runtime's own
end at exit (``finalize.atexit`` is off).

After ``fork`` an SMC-R connection stays in the parent's runtime; a child that
the parent hands it to (the parent closes its copy, as a forking server does)
uses it through the parent (:mod:`smcr.socket.fork`).  Listening sockets work in
the child, and a forking parent's accept queues pause until it accepts again
(:meth:`AcceptQueue.pause <smcr.socket.acceptq.AcceptQueue.pause>`).

The package's modules, bottom up: ``base`` (the socket's state, :class:`SmcInfo`, the
process's registries), ``numbers`` (the descriptor number ``fileno()`` gives out, one for
the socket's life), ``handshake`` (starting the CLC handshake and taking its outcome),
``sharing`` (``dup``, ``detach``, ``fromfd``: one connection, several socket objects),
``connecting`` (``connect``, and a non-blocking one in the background), ``acceptq`` (a
listener's accept queue), ``fork`` (connections across ``fork``: relayed by the parent),
``messages`` (``sendmsg``, ``recvmsg``, ``sendfile``) and ``api`` (:class:`SMCSocket`,
``create_connection``, ``create_server``).
"""

from smcr.socket.api import SMCSocket, create_connection, create_server, smc_socket_with_number
from smcr.socket.base import PlainSocket, SmcInfo, lets_go_of_buffer

__all__ = ["PlainSocket", "SMCSocket", "SmcInfo", "create_connection", "create_server",
           "lets_go_of_buffer", "smc_socket_with_number"]
