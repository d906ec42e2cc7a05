"""Consumer bells (the shm RNIC's): a peer's SEND wakes the thread that waits for it.

Why: an event loop waits in ``select`` on a connection's readiness descriptor.  Rung
through the CQ, a message costs two wake-ups at the receiving end (the progress thread,
which takes the CDC and makes the descriptor readable; then the loop's thread), each a
scheduling delay on a busy host.  A consumer bell lets the requester make the
descriptor readable itself, so the thread that reads is the one woken, as over TCP.

How, per connection and with no descriptor of it in the peer:

* the consumer's readiness descriptor is a unix datagram socket bound to a name in the
  abstract namespace that the requester can compute: the process's *bell prefix* (a
  random nonce, :class:`Names`, that its CQs publish in their notification segments at
  :data:`NONCE`) and a readiness number (*rid*);
* the notification segment has a *watch word* per connection token (u32 at
  :data:`WATCHES` + 4 * (token mod :data:`WATCH_SLOTS`)): the consumer stores the rid
  there when the descriptor is unreadable and a message would make it readable
  (:meth:`WatchSlot.arm`), and looks at the CQ once more;
* a requester that placed a SEND whose key (``post_writes_send(wake=token)``: a CDC's
  alert token) names an armed watch word, with the CQ armed for its progress thread or
  its standby, stores 0 there and sends one datagram to that name from a socket of its
  own process (:func:`ring_consumer`) instead of ringing the CQ; a CQ armed for an
  application thread asleep on it (:data:`~smcr.rdma.completion.ARM_SLEEPER`) is always
  rung, since that thread takes the news for everyone.

Why no message goes unheard: the requester stores ``produced``, fences, then loads the
CQ's arm word (:mod:`smcr.rdma.shm.cq`, whose Dekker pattern stands as it was) and the
watch word.  One that does not see the rid (not stored yet, or still in the consumer's
store buffer: the consumer does not fence) rings the CQ as before, or nobody where the
arm word says a poller is awake and will poll before it sleeps; the thread that takes
the message then makes the descriptor readable itself.  One that sees it rings the name.
So a bell only ever replaces a ring of the CQ, and the consumer's look after arming is
not what keeps a message from going unheard (it takes one that came meanwhile sooner).
A consumer that takes its own arm back (:meth:`WatchSlot.take`) and finds it gone knows
a datagram was sent or is on its way; one that failed (the requester died between the
two steps) is covered by the consumer looking for the datagram once it has taken the
message, at once or a little later (:meth:`smcr.stack.readiness.Readiness.set`,
:class:`~smcr.stack.readiness.DeferredChecks`).

A requester rings names only of a CQ that answered its probe at the hello (:func:`probe`:
the name of rid 0 is bound by the consumer's process): across network namespaces (where
abstract names differ) or with an older consumer it rings the CQ as before.  Names in the
abstract namespace can be seen and written by other users of the network namespace: a
stranger's datagram is a spurious readability, which a read that finds nothing clears; a
stranger that binds a name first leaves that descriptor a socket pair, rung by the CQ's
path.
"""

from __future__ import annotations

import _socket
import atexit
import os
import socket
import struct
from mmap import mmap
from typing import Final

from smcr import plainsock
from smcr.rdma import doorbell
from smcr.rdma.doorbell import bell_name
from smcr.rdma.stores import store_u32, store_u64

NONCE: Final = 8
"""Offset of the CQ's bell nonce (u64, never 0) in its notification segment."""
WATCHES: Final = 64 + (1 << 16)
"""Offset of the first watch word (after the ARMED word and the QPs' mark bytes)."""
WATCH_SLOTS: Final = 1 << 15
WATCH_MASK: Final = WATCH_SLOTS - 1
WATCHES_END: Final = WATCHES + 4 * WATCH_SLOTS

_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_U32_UNPACK: Final = _U32.unpack_from
_DONTWAIT: Final = socket.MSG_DONTWAIT


def prefix_of(nonce: int) -> bytes:
    """The bell names' common start for a process with ``nonce``."""
    return b"\0smcr-ready-%016x-" % nonce


class Names:
    """This process's bell names: a random nonce (their prefix), the probe bound to rid 0,
    and the next rid.  Made afresh in a forked child (:meth:`ready`), whose names must not
    be its parent's."""

    def __init__(self) -> None:
        self.pid = 0
        self.nonce = 0
        self.prefix = b""
        self.probe: _socket.socket | None = None
        self.rid = 0

    def ready(self) -> bool:
        """Whether this process can have named readiness descriptors (made on first use)."""
        if self.pid != os.getpid():
            self._start()
        return self.probe is not None

    def _start(self) -> None:
        self.pid = os.getpid()
        self.close()  # (a parent's, in a forked child: the parent's own stays bound)
        self.nonce = 0
        while not self.nonce:
            self.nonce = int.from_bytes(os.urandom(8), "little")
        self.prefix = prefix_of(self.nonce)
        self.rid = int.from_bytes(os.urandom(2), "little")
        probe_sock = plainsock.datagram()
        try:
            probe_sock.bind(self.name(0))
        except OSError:  # (no abstract namespace for us: readiness as socket pairs)
            probe_sock.close()
            return
        self.probe = probe_sock

    def close(self) -> None:
        """Close the probe (at exit; in a forked child, its parent's)."""
        if self.probe is not None:
            self.probe.close()
            self.probe = None

    def new_rid(self) -> int:
        """A rid for a new readiness descriptor (0: none, names are not available)."""
        if not self.ready():
            return 0
        self.rid = self.rid % 0xFFFFFFFE + 1
        return self.rid

    def name(self, rid: int) -> bytes:
        """The name of readiness descriptor ``rid`` (0: the probe): :func:`bell_name`."""
        return bell_name(self.prefix, rid)


NAMES: Final = Names()
atexit.register(NAMES.close)


def publish_nonce(notify: mmap) -> int:
    """Give a new notification segment this process's nonce (0 where names are not
    available: then no peer rings by name); returns it."""
    nonce = NAMES.nonce if NAMES.ready() else 0
    store_u64(notify, NONCE, nonce)
    return nonce


def peer_prefix(notify: mmap) -> bytes:
    """The prefix of a peer CQ's bell names, b"" when its segment has none (an older
    consumer: its segment ends before the watch words, or holds no nonce)."""
    if len(notify) < WATCHES_END:
        return b""
    nonce: int = _U64.unpack_from(notify, NONCE)[0]
    return prefix_of(nonce) if nonce else b""


RINGERS: Final[list[_socket.socket]] = []
"""The process's socket for ringing consumer bells, once made (on first use; the lane's
``send_now`` rings with it where it is there, :mod:`smcr.stack.sender`)."""


def _ringer() -> _socket.socket:
    """The ringing socket.  Its send buffer as large as the kernel allows: a datagram counts
    against it until its consumer reads it (a ring that does not fit goes to the CQ)."""
    if not RINGERS:
        sock = plainsock.datagram()
        plainsock.widen_send_buffer(sock)
        RINGERS.append(sock)
    return RINGERS[0]


@atexit.register
def _close_ringer() -> None:
    while RINGERS:
        RINGERS.pop().close()


def probe(prefix: bytes) -> bool:
    """Whether the CQ of ``prefix`` can be rung by name from here (its rid 0 answers; a full
    queue answers too)."""
    try:
        _ringer().sendto(b"", bell_name(prefix, 0))
    except BlockingIOError:
        return True
    except OSError:
        return False
    return True


def ring_consumer(notify: mmap, prefix: bytes, token: int) -> bool:
    """After a SEND keyed ``token`` was placed and the fence passed: ring the consumer whose
    watch word for ``token`` is armed.  Returns whether it was rung (the caller then rings
    nobody else); False when none was armed, or the datagram could not go (the caller
    rings the CQ; the consumer, finding its arm taken, looks for the datagram: module
    doc)."""
    at = WATCHES + 4 * (token & WATCH_MASK)
    rid: int = _U32_UNPACK(notify, at)[0]
    if not rid:
        return False
    store_u32(notify, at, 0)
    return ring_name(prefix, rid)


def ring_name(prefix: bytes, rid: int) -> bool:
    """Send the ring (one datagram) to the consumer bell named ``rid`` under ``prefix``,
    its watch word taken (:func:`ring_consumer`); whether it went."""
    return doorbell.ring_rid(_ringer(), prefix, rid) == 0


class WatchSlot:
    """A connection's watch word in its CQ's notification segment (consumer side)."""

    def __init__(self, notify: mmap, offset: int, rid: int) -> None:
        self.notify = notify
        self.offset = offset
        self.rid = rid
        """The readiness descriptor's rid: its name is what a requester rings."""
        self.armed = False
        """Whether this end stored its rid and has not taken it back since."""
        self.rung = 0
        """How often a requester took the arm (rang the bell): ``smcr`` tests count it."""

    def arm(self) -> None:
        """Store the rid (the caller looks at the CQ after: module doc)."""
        if not self.notify.closed:
            store_u32(self.notify, self.offset, self.rid)
        self.armed = True

    def holds(self) -> bool:
        """Whether the arm is still there (no requester took it)."""
        return self.notify.closed or _U32_UNPACK(self.notify, self.offset)[0] == self.rid

    def take(self) -> bool:
        """Take the arm back: True when it was still there (nobody rang), False when a
        requester took it (a datagram went or is on its way)."""
        self.armed = False
        notify = self.notify
        if notify.closed:
            return True
        if _U32_UNPACK(notify, self.offset)[0] == self.rid:
            store_u32(notify, self.offset, 0)
            return True
        self.rung += 1
        return False
