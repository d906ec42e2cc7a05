"""Consumer bells (the shm RNIC's): a peer's SEND wakes the thread that waits for it.

Why: an event loop waits in ``select`` on a connection's readiness descriptor.  Rung
through the CQ, a message costs two wake-ups at the receiving end (the progress thread,
which takes the CDC and makes the descriptor readable; then the loop's thread), each a
scheduling delay on a busy host.  A consumer bell lets the requester make the
descriptor readable itself, so the thread that reads is the one woken, as over TCP.

How, per connection and with no descriptor of it in the peer:

* the consumer's readiness descriptor is a unix datagram socket bound to a name in the
  abstract namespace that the requester can compute: the CQ's *bell prefix* (a random
  nonce the CQ publishes in its notification segment at :data:`NONCE`) and a readiness
  number (*rid*);
* the notification segment has a *watch word* per connection token (u32 at
  :data:`WATCHES` + 4 * (token mod :data:`WATCH_SLOTS`)): the consumer stores the rid
  there when the descriptor is unreadable and a message would make it readable
  (:meth:`WatchSlot.arm`), then fences and looks at the CQ once more;
* a requester that placed a SEND whose key (``post_writes_send(wake=token)``: a CDC's
  alert token) names an armed watch word, with the CQ armed for its progress thread or
  its standby, stores 0 there and sends one datagram to that name from a socket of its
  own process (:func:`ring_consumer`) instead of ringing the CQ; a CQ armed for an
  application thread asleep on it (:data:`~smcr.rdma.completion.ARM_SLEEPER`) is always
  rung, since that thread takes the news for everyone.

Dekker's pattern again (:mod:`smcr.rdma.shm.cq`): the consumer stores the rid, fences,
looks; the requester stores ``produced``, fences, loads the word.  One of them sees the
other.  A consumer that takes its own arm back (:meth:`WatchSlot.take`) and finds it gone
knows a datagram was sent or is on its way; one that failed (the requester died between
the two steps) is covered by the consumer looking for the datagram before it trusts it
(:meth:`smcr.stack.readiness.Readiness.set`).

A requester rings names only of a CQ that answered its probe at the hello
(:func:`probe`: the name of rid 0 is bound by the CQ): across network namespaces (where
abstract names differ) or with an older consumer it rings the CQ as before.  Names in
the abstract namespace can be seen and written by other users of the network namespace:
a stranger's datagram is a spurious readability, which a read that finds nothing clears;
a stranger that binds a name first leaves that connection on the CQ's path.
"""

from __future__ import annotations

import os
import socket
import struct
from mmap import mmap
from typing import Final

NONCE: Final = 8
"""Offset of the CQ's bell nonce (u64, never 0) in its notification segment."""
WATCHES: Final = 64 + (1 << 16)
"""Offset of the first watch word (after the ARMED word and the QPs' mark bytes)."""
WATCH_SLOTS: Final = 1 << 15
WATCH_MASK: Final = WATCH_SLOTS - 1
WATCHES_END: Final = WATCHES + 4 * WATCH_SLOTS

_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_U32_PACK: Final = _U32.pack_into
_U32_UNPACK: Final = _U32.unpack_from
_DONTWAIT: Final = socket.MSG_DONTWAIT


def prefix_of(nonce: int) -> bytes:
    """The bell names' common start for a CQ with ``nonce``."""
    return b"\0smcr-ready-%016x-" % nonce


def publish_nonce(notify: mmap) -> bytes:
    """Give a new notification segment its nonce; returns its names' prefix."""
    nonce = 0
    while not nonce:
        nonce = int.from_bytes(os.urandom(8), "little")
    _U64.pack_into(notify, NONCE, nonce)
    return prefix_of(nonce)


def peer_prefix(notify: mmap) -> bytes:
    """The prefix of a peer CQ's bell names, b"" when its segment has none (an older
    consumer: its segment ends before the watch words, or holds no nonce)."""
    if len(notify) < WATCHES_END:
        return b""
    nonce: int = _U64.unpack_from(notify, NONCE)[0]
    return prefix_of(nonce) if nonce else b""


_RINGER: list[socket.socket] = []
"""The process's socket for ringing consumer bells (made on first use)."""


def _ringer() -> socket.socket:
    """The ringing socket.  Its send buffer as large as the kernel allows: a datagram counts
    against it until its consumer reads it (a ring that does not fit goes to the CQ)."""
    if not _RINGER:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
        _RINGER.append(sock)
    return _RINGER[0]


def probe(prefix: bytes) -> bool:
    """Whether the CQ of ``prefix`` can be rung by name from here (its rid 0 answers; a full
    queue answers too)."""
    try:
        _ringer().sendto(b"", prefix + b"0")
    except BlockingIOError:
        return True
    except OSError:
        return False
    return True


def ring_consumer(notify: mmap, prefix: bytes, token: int) -> bool:
    """After a SEND keyed ``token`` was placed and the fence passed: ring the consumer whose
    watch word for ``token`` is armed.  Returns whether it was rung (the caller then rings
    nobody else); False when none was armed, or the datagram could not go (the caller
    rings the CQ; the consumer, finding its arm taken, looks for the datagram before it
    trusts it: module doc)."""
    at = WATCHES + 4 * (token & WATCH_MASK)
    rid: int = _U32_UNPACK(notify, at)[0]
    if not rid:
        return False
    _U32_PACK(notify, at, 0)
    try:
        _ringer().sendto(b"r", _DONTWAIT, prefix + b"%d" % rid)
    except OSError:
        return False
    return True


class WatchSlot:
    """A connection's watch word in its CQ's notification segment (consumer side)."""

    def __init__(self, notify: mmap, offset: int, rid: int, name: bytes, sink: bytes) -> None:
        self.notify = notify
        self.offset = offset
        self.rid = rid
        self.name = name
        """The readiness socket's name: what a requester rings."""
        self.sink = sink
        """The name of the readiness socket's sink (its fill makes it unwritable)."""
        self.armed = False
        """Whether this end stored its rid and has not taken it back since."""
        self.rung = 0
        """How often a requester took the arm (rang the bell): ``smcr`` tests count it."""

    def arm(self) -> None:
        """Store the rid (the caller fences and looks at the CQ after)."""
        if not self.notify.closed:
            _U32_PACK(self.notify, self.offset, self.rid)
        self.armed = True

    def take(self) -> bool:
        """Take the arm back: True when it was still there (nobody rang), False when a
        requester took it (a datagram went or is on its way)."""
        self.armed = False
        notify = self.notify
        if notify.closed:
            return True
        if _U32_UNPACK(notify, self.offset)[0] == self.rid:
            _U32_PACK(notify, self.offset, 0)
            return True
        self.rung += 1
        return False
