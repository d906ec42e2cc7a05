"""Provider-neutral verbs objects: keys, memory regions, completion queues, QP bookkeeping.

Design: what does not depend on how bytes move lives here, once, so that the
``shm`` RNIC and the coming RoCEv2 RNIC differ only in transport:

* :class:`KeyAllocator` draws lkeys/rkeys with :mod:`secrets` (a peer must not be
  able to guess another region's rkey) and never hands out a key that is live.
* :class:`MemoryRegion` is the registered buffer plus its keys and access flags;
  :meth:`ProtectionDomain.lookup_local` resolves an SGE against it.
* :class:`~smcr.rdma.completion.CompletionQueue` (its own module, imported here for
  the providers) is a thread-safe deque plus a doorbell socket pair.
* :class:`QueuePair` keeps state, attributes and capabilities and runs the state
  table of :mod:`smcr.rdma.qpstate`; providers implement the abstract hooks.  Its
  verbs take fault injection and a tap (``smcr trace``) through one attribute,
  :attr:`QueuePair.hooks`, None unless used: the data path tests only that.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import secrets
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any, Final

from smcr._mypyc import mypyc_attr
from smcr.rdma.completion import CompletionQueue
from smcr.rdma.qpstate import check_modify, rc_bring_up
from smcr.rdma.verbs import (
    AccessFlag,
    AsyncEvent,
    DeviceAttr,
    PathMtu,
    PortState,
    QpAttr,
    QpAttrMask,
    QpCap,
    QpState,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    VerbsError,
    WrOpcode,
)

PAGE: Final = 4096
"""MRs get page-aligned virtual addresses (:meth:`Device.next_iova`)."""


def random_qpn(taken: Container[int]) -> int:
    """A fresh random 24-bit QP number, not in ``taken`` (0 and 1 are reserved in IB).

    Random, as rxe's are not: a peer must not guess another connection's QP.
    """
    while True:
        qpn = secrets.randbits(24)
        if qpn > 1 and qpn not in taken:
            return qpn


RingTaker = Callable[[int, memoryview, int, int, int, int, int, int, int, int], tuple[int, int]]
"""A receiver's way through a run of SENDs (:meth:`QueuePair.set_receiver`), for a provider
whose receive ring is in memory: ``run(qp_num, area, lens, base, stride, depth, slot_size,
consumed, produced, posted)`` takes the SENDs from number ``consumed`` on, below
``produced``, up to the first it would not take, and returns ``(consumed, posted)`` after
them.  SEND ``i``'s slot is at ``base + (i % depth) * stride`` in ``area``: a 16-byte header
(u32 length, u32 kind, 1 for a SEND; little-endian) and the bytes; each SEND taken leaves
its receive posted again behind the others (the u32 length at ``lens + 4 * (i % depth)``
copied to ``lens + 4 * (posted % depth)``, then ``posted`` counts it).

Its C form, for a provider whose poll runs in C (the shm RNIC's ``_place.c``), is a capsule
named :data:`RING_TAKER_C` holding a function of this ABI::

    long long run(PyObject *ctx, long long qp_num, unsigned char *area, long long len,
                  long long lens, long long base, long long stride, long long depth,
                  long long slot_size, long long *consumed, long long produced,
                  long long *posted);

the same walk over ``area[:len]`` with the context object given beside the capsule
(:meth:`QueuePair.set_receiver`'s ``c_run``), ``*consumed`` and ``*posted`` moved past the
SENDs taken; it returns how many it took, and never fails (a SEND it cannot take ends
the run, for the provider to offer to the receiver)."""

RING_TAKER_C: Final = "smcr.rdma.RING_TAKER.v1"
"""The name (and ABI version) of a :data:`RingTaker`'s C form."""


class Device(ABC):
    """An RNIC: one port, a GID, a MAC and the net device it serves.

    :param name: device name (``shm0``, ``rxe0``...), as ``ibv_devices`` shows it.
    :param gid: 16-byte GID (IPv6 or IPv4-mapped, spec §9).
    :param mac: 6-byte MAC of the port (SMC-R sends it in CLC/LLC).
    :param netdev: the net device this RNIC serves (pnet), if any.
    :param attr: capabilities.
    """

    def __init__(
        self, name: str, gid: bytes, mac: bytes, netdev: str | None, attr: DeviceAttr
    ) -> None:
        self.name = name
        self.gid = gid
        self.mac = mac
        self.netdev = netdev
        self.attr = attr
        self.port_state = PortState.ACTIVE
        self._events: deque[AsyncEvent] = deque()
        self._event_cond = threading.Condition()
        self._lock = threading.Lock()
        self._pds: list[ProtectionDomain] = []
        self._cqs: list[CompletionQueue] = []
        self._next_pd = 1
        #: where :meth:`next_iova` hands out the next MR's address; a provider starts
        #: it at a random page of its own range
        self._next_iova = 0

    @property
    def max_mtu(self) -> PathMtu:
        """The port's active MTU: the largest path MTU a QP may use."""
        return self.attr.active_mtu

    def post_async_event(self, event: AsyncEvent) -> None:
        """Queue an asynchronous event (provider side)."""
        with self._event_cond:
            self._events.append(event)
            self._event_cond.notify_all()

    def get_async_event(self, timeout: float | None = 0.0) -> AsyncEvent | None:
        """The oldest asynchronous event (``ibv_get_async_event``), waiting up to ``timeout``."""
        with self._event_cond:
            if not self._events:
                self._event_cond.wait(timeout)
            return self._events.popleft() if self._events else None

    def alloc_pd(self) -> ProtectionDomain:
        """Allocate a protection domain (numbered from 1, kept until the device closes)."""
        with self._lock:
            pd = self._new_pd(self._next_pd)
            self._next_pd += 1
            self._pds.append(pd)
        return pd

    def next_iova(self, length: int) -> int:
        """A fresh page-aligned virtual address range for an MR, followed by a guard page."""
        with self._lock:
            addr = self._next_iova
            self._next_iova += -(-max(length, 1) // PAGE) * PAGE + PAGE
        return addr

    def create_cq(self, depth: int = 4096) -> CompletionQueue:
        """Create a completion queue of ``depth`` entries; closed with the device if not before."""
        cq = self._new_cq(depth)
        self._cqs.append(cq)
        return cq

    @abstractmethod
    def _new_pd(self, pd_id: int) -> ProtectionDomain:
        """The provider's protection domain numbered ``pd_id``."""

    def _new_cq(self, depth: int) -> CompletionQueue:
        """The provider's completion queue (a provider may need its own kind)."""
        return CompletionQueue(depth)

    def _deregister_all(self) -> None:
        """Deregister every MR of every PD: closing a device revokes all remote access."""
        for pd in self._pds:
            for mr in list(pd.mrs.values()):
                mr.dereg()

    def _close_cqs(self) -> None:
        """Close every CQ created from this device."""
        for cq in self._cqs:
            cq.close()

    @abstractmethod
    def close(self) -> None:
        """Close the device and everything created from it."""

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KeyAllocator:
    """Unpredictable 32-bit keys, unique among the live ones.

    Why :mod:`secrets`: an rkey is the only thing that guards a region against a
    peer that guesses; rxe's ``index << 8 | 8 random bits`` gives 256 guesses,
    a full random 32-bit key gives 2**32.  Key 0 is never used (it reads as
    "no key" in traces and in zeroed shared memory).
    """

    def __init__(self) -> None:
        self._live: set[int] = set()
        self._lock = threading.Lock()

    def new_key(self) -> int:
        """Draw a fresh key and mark it live."""
        with self._lock:
            while True:
                key = secrets.randbits(32)
                if key and key not in self._live:
                    self._live.add(key)
                    return key

    def release(self, key: int) -> None:
        """Mark ``key`` dead; it may be drawn again later (never while live)."""
        with self._lock:
            self._live.discard(key)

    def is_live(self, key: int) -> bool:
        """Whether ``key`` is currently handed out."""
        return key in self._live


def give_back_pages(memory: mmap.mmap, start: int, length: int) -> int:
    """Let the whole pages of ``memory[start : start + length]`` go (their bytes read as
    zeros afterwards): a shared mapping's file is punched (``MADV_REMOVE``: every mapping
    of it loses them), private memory is dropped (``MADV_DONTNEED``).

    :returns: bytes given back (0 for a range without a whole page, or a mapping that
        refuses both).
    """
    page = mmap.PAGESIZE  # (the kernel's: madvise rounds a length up to it)
    first = -(-max(start, 0) // page) * page
    end = min(start + length, len(memory)) // page * page
    if end <= first:
        return 0
    for advice in (mmap.MADV_REMOVE, mmap.MADV_DONTNEED):
        try:
            memory.madvise(advice, first, end - first)
        except OSError:
            continue
        return end - first
    return 0


def zeroed_memory(length: int) -> memoryview:
    """``length`` zero bytes whose pages are backed only once written: an anonymous
    mapping, not a ``bytearray`` (which writes all of its zeros at once, so that a
    connection's 4 MiB buffer would cost 4 MiB however little it sends).

    :raises VerbsError: ENOMEM when the mapping fails.
    """
    try:
        return memoryview(mmap.mmap(-1, length))
    except OSError as e:
        raise VerbsError(errno.ENOMEM, f"cannot map {length} bytes: {e}") from e


class MemoryRegion:
    """A registered buffer: ``buf`` seen by the peer at ``[addr, addr + length)``.

    ``addr`` is a virtual address chosen by the device (verbs' iova); SGEs and
    remote addresses are expressed in it, so the same numbers can go into a RETH.
    ``lkey == rkey`` as in rxe, which keeps one key per region to revoke.
    """

    def __init__(
        self,
        pd: ProtectionDomain,
        buf: memoryview,
        *,
        addr: int,
        key: int,
        access: AccessFlag,
        on_dereg: Callable[[MemoryRegion], None],
    ) -> None:
        self.pd = pd
        self.buf = buf
        self.addr = addr
        self.length = len(buf)
        self.lkey = key
        self.rkey = key
        self.access = access
        self.access_bits = int(access)
        self._on_dereg = on_dereg
        self.valid = True

    def discard(self, start: int = 0, length: int = -1) -> int:
        """Give the pages of ``[start, start + length)`` (all of the region by default)
        back to the kernel; their bytes read as zeros afterwards.

        For memory that nobody writes into or reads for a while (a pooled RMB or send
        buffer, the used part of an idle connection's send buffer): it returns to the host
        until it is written again.  Only the whole pages inside the range go, and only a
        mapping can let them go (a shared segment is punched, so every mapping of it, the
        peer's included, lets the pages go); a plain buffer keeps its memory.

        :returns: bytes given back (0: none could be).
        """
        memory = self.buf.obj
        if not isinstance(memory, mmap.mmap) or len(memory) != self.length:
            return 0  # (a view of part of a mapping: its pages' offsets are not known)
        return give_back_pages(memory, start, self.length - start if length < 0 else length)

    def dereg(self) -> None:
        """Deregister: remote and local access end now; ``buf`` must not be used after."""
        if self.valid:
            self.valid = False
            self._on_dereg(self)

    def __enter__(self) -> MemoryRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dereg()


def scatter(views: Sequence[memoryview], off: int, data: memoryview) -> None:
    """Copy ``data`` into the SGE views at byte offset ``off`` of their concatenation.

    How every RNIC places a message into a scatter list (the SGEs of a receive, the
    destination of a READ; ``views`` from :meth:`ProtectionDomain.lookup_local`): one
    slice assignment per SGE it touches.  The caller has checked that it fits.

    :param views: the SGEs' memory, in order.
    :param off: where ``data`` starts in the concatenation (a later packet of a message).
    :param data: the bytes to place.
    """
    if len(views) == 1:
        views[0][off : off + len(data)] = data
        return
    pos, n = 0, len(data)
    for v in views:
        size = len(v)
        if off >= size:
            off -= size
            continue
        take = min(size - off, n - pos)
        v[off : off + take] = data[pos : pos + take]
        pos += take
        off = 0
        if pos == n:
            return


# tests subclass it in Python (a PD that only holds MRs); mypyc allows that only if told
@mypyc_attr(allow_interpreted_subclasses=True)
class ProtectionDomain(ABC):
    """A protection domain: the MRs and QPs that may be used together.

    :attr:`pd_id` is published to peers so a responder can refuse an rkey of a
    different PD (spec §6 step 3).
    """

    def __init__(self, pd_id: int) -> None:
        self.pd_id = pd_id
        self.mrs: dict[int, MemoryRegion] = {}

    def lookup_local(self, sge: Sge, need: int) -> memoryview | None:
        """The slice of local memory an SGE names, or ``None`` if lkey/bounds/access fail.

        :param need: ``int(AccessFlag.LOCAL_WRITE)`` where the device writes (RECV,
            READ destination), else 0; a plain int because this is the data path.
        """
        mr = self.mrs.get(sge.lkey)
        if mr is None or not mr.valid or need & ~mr.access_bits:
            return None
        off = sge.addr - mr.addr
        if off < 0 or sge.length < 0 or off + sge.length > mr.length:
            return None
        return mr.buf[off : off + sge.length]

    @abstractmethod
    def alloc_mr(self, length: int, access: AccessFlag) -> MemoryRegion:
        """Allocate and register ``length`` bytes a peer may reach as ``access`` allows."""

    @abstractmethod
    def reg_mr(self, buffer: bytearray | memoryview, access: AccessFlag) -> MemoryRegion:
        """Register an existing writable buffer (providers may refuse remote access)."""

    @abstractmethod
    def create_qp(
        self,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        cap: QpCap | None = None,
        *,
        sq_sig_all: bool = False,
    ) -> QueuePair:
        """Create an RC QP in RESET (``ibv_create_qp``).

        :param sq_sig_all: complete every send WR, signaled or not.
        """

    @abstractmethod
    def dealloc(self) -> None:
        """Free the PD (its MRs and QPs must be gone: EBUSY otherwise)."""


@mypyc_attr(allow_interpreted_subclasses=True)
class QpTap:
    """Something that watches one QP's posts onto its send queue (``smcr trace``, tests):
    subclass it, override what you watch, attach it with :meth:`QueuePair.set_tap`.

    Told of the posts the QP took (not of those it refused by raising), in the
    caller's thread, under whatever lock the caller holds: keep it short, never block.
    A WR a post hands on inside the QP (a fused batch falling back to the generic
    post) is told once, as the call the caller made.
    """

    def posting(self, qp: QueuePair) -> None:
        """A post onto ``qp``'s send queue is about to run (none of its WRs went yet)."""

    def sent(self, qp: QueuePair, wrs: list[SendWr]) -> None:
        """``qp.post_send`` took ``wrs``."""

    def writes_sent(self, qp: QueuePair, writes: Sequence[tuple[int, int, memoryview]],
                    message: bytes) -> None:  # fmt: skip
        """``qp.post_writes_send`` took these inline WRITEs and the SEND of ``message``."""


class QpHooks:
    """What one QP has besides its work: failures injected (:meth:`QueuePair.fail_next`)
    and a tap (:meth:`QueuePair.set_tap`).  A QP without either has none
    (``hooks`` None), which is all its verbs test: nothing else on the data path."""

    def __init__(self) -> None:
        self.tap: QpTap | None = None
        self.failures: dict[str, tuple[OSError, int]] = {}
        """Verb (``post_send``, ``post_recv``, ``modify``) -> (error, calls left to fail)."""


class QueuePair(ABC):
    """An RC queue pair: state machine and attributes here, transport in the provider."""

    receiver: Callable[[int, memoryview, int, int], bool] | None = None
    """:meth:`set_receiver`'s, or None."""

    ring_taker: RingTaker | None = None
    """:meth:`set_receiver`'s ``run``, or None."""

    c_taker: object = None
    """:meth:`set_receiver`'s ``c_run``: the run's C form (a capsule, :data:`RingTaker`), or
    None."""

    c_taker_ctx: object = None
    """The context object the C form is called with."""

    peer_gone = False
    """The provider saw the peer's process end, not its QP torn down (shm: the rendezvous
    connection closed while the peer QP's state word still said RTR/RTS; destroy and ERR
    write it first).  What that process posted has been delivered, as shm runs a post at
    once -- save WRs an RNR kept in its send queue, which needs our receive queue empty
    at the time.  Providers that cannot tell (RoCE: unacknowledged packets die with the
    process) leave it False."""

    def __init__(
        self,
        pd: ProtectionDomain,
        qp_num: int,
        *,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        cap: QpCap,
        max_mtu: PathMtu,
    ) -> None:
        self.pd = pd
        self.qp_num = qp_num
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.cap = cap
        self.attr = QpAttr(qp_state=QpState.RESET)
        self._max_mtu = max_mtu
        self._state_lock = threading.RLock()
        self.hooks: QpHooks | None = None
        """Failures injected and a tap (:class:`QpHooks`), None without either."""

    def set_receiver(self, receiver: Callable[[int, memoryview, int, int], bool] | None,
                     run: RingTaker | None = None,
                     c_run: tuple[object, object] | None = None) -> None:  # fmt: skip
        """Let ``receiver`` take SENDs in place, where the provider can offer it (shm; other
        providers complete every receive as before).

        The provider calls ``receiver(qp_num, area, offset, length)`` for a SEND that
        arrived while nothing waits in the receive CQ before it but completions of sends
        (:meth:`~smcr.rdma.completion.CompletionQueue.only_sends_wait`), only from within that
        CQ's :meth:`~smcr.rdma.completion.CompletionQueue.poll` (so under whatever lock
        the consumer polls with), with the message's bytes at ``area[offset:offset +
        length]``, valid during the call only.  True: the message is consumed, the
        receive WR it would have filled stays posted, and no completion is made for it
        (one :data:`~smcr.rdma.completion.TAKEN_IN_PLACE` per poll stands for them);
        False: it is delivered into the next receive WR as usual, and so is every SEND
        behind it in that poll (order is kept).  The consumer's zero-copy receive for
        messages it can act on at once, which an RNIC can offer when it holds the
        receive ring in memory the consumer can read.

        ``run``, where given, takes a run of them in one call, as ``receiver`` would one
        by one (:data:`RingTaker`); the provider calls it first and ``receiver`` for the
        first one it did not take.  ``c_run``, where given, is ``run``'s C form and the
        context it takes, ``(capsule, ctx)`` (:data:`RingTaker`): a provider whose poll
        runs in C calls it in ``run``'s place.
        """
        self.receiver = receiver
        self.ring_taker = run if receiver is not None else None
        taker, ctx = c_run if c_run is not None and receiver is not None else (None, None)
        self.c_taker, self.c_taker_ctx = taker, ctx

    def ring_after(self, whom: int) -> None:  # noqa: B027 - most providers ring nobody
        """After a post made in C by the provider's poster for C callers (the shm RNIC's
        ``post_inline``, which the stack's fast lane calls): ring whom it named (socket
        calls stay in Python).  Providers without one have nobody to ring."""

    @property
    def state(self) -> QpState:
        """The current state (``ibv_query_qp``'s ``qp_state``)."""
        return self.attr.qp_state

    def query(self) -> QpAttr:
        """A copy of the current attributes."""
        with self._state_lock:
            return dataclasses.replace(self.attr)

    def modify(self, attr: QpAttr, mask: QpAttrMask) -> None:
        """``ibv_modify_qp``: validate against the state table, then apply.

        :raises VerbsError: EINVAL on an illegal request (nothing changes), or
            whatever the provider raises when it cannot reach the peer (at RTR).
        """
        if self.hooks is not None:
            self._fault("modify")
        with self._state_lock:
            new = check_modify(self.attr.qp_state, attr, mask, self._max_mtu)
            if new is QpState.ERR:
                self._to_error(None)
            elif new is QpState.RESET:
                self._reset()
            else:
                self._apply_modify(new, attr, mask)

    def to_rts(
        self,
        *,
        dgid: bytes,
        dest_qp_num: int,
        rq_psn: int,
        sq_psn: int,
        access: AccessFlag,
        **options: Any,
    ) -> None:
        """Walk RESET->INIT->RTR->RTS with the masks of spec §7.2.

        :param dgid: the peer's GID; exchanged out of band (CLC in SMC-R), like
            the peer's QPN (``dest_qp_num``) and initial PSN (``rq_psn``).
        :param sq_psn: our initial PSN.
        :param access: the QP access flags (spec §6).
        :param options: ``path_mtu``, ``timeout``, ``retry_cnt``, ``rnr_retry``,
            ``min_rnr_timer``, ``max_rd_atomic``; see
            :func:`~smcr.rdma.qpstate.rc_bring_up` for the Linux defaults.
        """
        for attr, mask in rc_bring_up(
            dgid=dgid,
            dest_qp_num=dest_qp_num,
            rq_psn=rq_psn,
            sq_psn=sq_psn,
            access=access,
            **options,
        ):
            self.modify(attr, mask)

    def fail_next(self, verb: str, error: OSError, times: int = 1) -> None:
        """Fault injection: the next ``times`` calls of ``verb`` raise ``error`` and do nothing.

        For what a software RNIC cannot be made to do on purpose, so that the layers
        above can be tested against it: a send queue that stays full (``ENOMEM``),
        a post or a modify that fails (``EIO``, ``EINVAL``).  ``verb`` is
        ``"post_send"`` (also :meth:`post_writes_send`, the other way onto the send
        queue: they count down together), ``"post_recv"`` or ``"modify"``; a second
        call for a verb replaces the first.  Costs nothing once met: the QP's
        :attr:`hooks` go when no failure (and no tap) is left.
        """
        if times < 1:
            raise ValueError(f"times must be at least 1, not {times}")
        if verb not in ("post_send", "post_recv", "modify"):
            raise KeyError(verb)
        with self._state_lock:
            hooks = self.hooks if self.hooks is not None else QpHooks()
            hooks.failures[verb] = (error, times)
            self.hooks = hooks

    def failures_left(self, verb: str) -> int:
        """How many calls of ``verb`` still fail (:meth:`fail_next`)."""
        hooks = self.hooks
        left = hooks.failures.get(verb) if hooks is not None else None
        if left is None:
            return 0
        _error, times = left
        return times

    def set_tap(self, tap: QpTap | None) -> None:
        """Attach ``tap`` to watch this QP's posts onto the send queue, or (None) take
        the tap away."""
        with self._state_lock:
            hooks = self.hooks if self.hooks is not None else QpHooks()
            hooks.tap = tap
            self.hooks = hooks if tap is not None or hooks.failures else None

    @property
    def tap(self) -> QpTap | None:
        """The tap attached (:meth:`set_tap`), or None."""
        hooks = self.hooks
        return hooks.tap if hooks is not None else None

    def _fault(self, verb: str) -> None:
        """Raise the failure injected for ``verb`` if one is left (:meth:`fail_next`); the
        last one met takes the hooks away unless a tap or other failures remain."""
        with self._state_lock:
            hooks = self.hooks
            left = hooks.failures.get(verb) if hooks is not None else None
            if hooks is None or left is None:
                return
            error, times = left
            if times > 1:
                hooks.failures[verb] = (error, times - 1)
            else:
                del hooks.failures[verb]
                if not hooks.failures and hooks.tap is None:
                    self.hooks = None
        raise error

    def _copy_attrs(self, attr: QpAttr, mask: QpAttrMask) -> None:
        """Store the fields that ``mask`` names (the provider calls this when it commits)."""
        m = QpAttrMask
        pairs = (
            (m.ACCESS_FLAGS, "qp_access_flags"),
            (m.PKEY_INDEX, "pkey_index"),
            (m.PORT, "port_num"),
            (m.AV, "ah_attr"),
            (m.PATH_MTU, "path_mtu"),
            (m.DEST_QPN, "dest_qp_num"),
            (m.RQ_PSN, "rq_psn"),
            (m.SQ_PSN, "sq_psn"),
            (m.TIMEOUT, "timeout"),
            (m.RETRY_CNT, "retry_cnt"),
            (m.RNR_RETRY, "rnr_retry"),
            (m.MIN_RNR_TIMER, "min_rnr_timer"),
            (m.MAX_QP_RD_ATOMIC, "max_rd_atomic"),
            (m.MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic"),
        )
        for bit, name in pairs:
            if mask & bit:
                setattr(self.attr, name, getattr(attr, name))

    def _check_sges(self, sges: tuple[Sge, ...], limit: int) -> None:
        """Refuse a WR with too many SGEs, as ``ibv_post_*`` does (EINVAL)."""
        if len(sges) > limit:
            raise VerbsError(errno.EINVAL, f"{len(sges)} SGEs, the QP takes {limit}")

    @abstractmethod
    def _apply_modify(self, new: QpState, attr: QpAttr, mask: QpAttrMask) -> None:
        """Provider hook: commit a validated modify to INIT, RTR or RTS (state lock held)."""

    @abstractmethod
    def _to_error(self, event: str | None) -> None:
        """Provider hook: move to ERR and flush (a modify to ERR; state lock held).

        :param event: if given, also raise a QP_FATAL async event with this reason.
        """

    @abstractmethod
    def _reset(self) -> None:
        """Provider hook: back to RESET, all work dropped without completions (lock held)."""

    def post_send(self, wrs: SendWr | Iterable[SendWr]) -> None:
        """Queue send-queue work requests, in order (``ibv_post_send``): the provider's
        :meth:`_post_send`, unless failures are injected or a tap watches."""
        if self.hooks is None:
            self._post_send(wrs)
        else:
            self._hooked_post_send(wrs)

    def _hooked_post_send(self, wrs: SendWr | Iterable[SendWr]) -> None:
        self._fault("post_send")
        tap = self.tap
        if tap is None:
            self._post_send(wrs)
            return
        batch = [wrs] if isinstance(wrs, SendWr) else list(wrs)
        tap.posting(self)
        self._post_send(batch)
        tap.sent(self, batch)

    def discard_remote(self, rkey: int, addr: int, length: int) -> int:
        """Give back the pages of the peer's memory at ``[addr, addr + length)`` of
        ``rkey``, which this QP alone writes and whose bytes nobody needs any more: an SMC
        connection's sender knows which part of the peer's RMB the peer has read and it
        will not write into soon (an idle connection's), where the peer cannot know when
        its sender writes.  No verb of RDMA's: an RNIC whose requester maps the peer's
        memory (shm) can; the others leave the pages where they are.

        :returns: bytes given back (0: none), or -1 when not now (a WR of this QP may be
            about to write there: ask again later).
        """
        return 0

    def post_writes_send(self, writes: Sequence[tuple[int, int, memoryview]], message: bytes,
                         wr_id: int, signaled: bool, wake: int = 0) -> None:  # fmt: skip
        """Post inline RDMA WRITEs, then one inline SEND, as one batch.

        The shape of SMC-R's data path (payload, then the CDC announcing it),
        like the ``ibv_wr_*`` batch API of rdma-core (``ibv_wr_start`` ...
        ``ibv_wr_complete``), which exists because building one ``ibv_send_wr``
        per operation costs too much.  Same semantics as :meth:`post_send` with
        one unsignaled ``RDMA_WRITE | INLINE`` WR (``wr_id`` 0) per
        ``(remote_addr, rkey, data)`` and a final ``SEND | INLINE`` WR; providers
        may fuse it (:class:`~smcr.rdma.shm.qp.ShmQp` does, in
        :meth:`_post_writes_send`).  Needs ``max_inline_data`` for the largest piece.
        The SEND is solicited, as Linux posts every CDC (``smc_wr_tx_send``: the
        BTH's SE bit).  Failures injected for ``post_send`` fail this too.

        ``wake``: the peer's key of the consumer the SEND is for (a CDC's alert token), for
        a provider whose peers may ring that consumer rather than their CQ
        (:mod:`smcr.rdma.bells`); 0 for none.  Others ignore it.
        """
        if self.hooks is None:
            self._post_writes_send(writes, message, wr_id, signaled, wake)
            return
        self._fault("post_send")
        tap = self.tap
        if tap is not None:
            tap.posting(self)
        self._post_writes_send(writes, message, wr_id, signaled, wake)
        if tap is not None:
            tap.writes_sent(self, writes, message)

    @abstractmethod
    def _post_send(self, wrs: SendWr | Iterable[SendWr]) -> None:
        """Provider: :meth:`post_send`'s work."""

    def _post_writes_send(self, writes: Sequence[tuple[int, int, memoryview]], message: bytes,
                          wr_id: int, signaled: bool, wake: int = 0) -> None:  # fmt: skip
        """:meth:`post_writes_send`'s work; this default builds the WRs and posts them
        (:meth:`_post_send`: the caller's one post, not a second one; ``wake`` unused, so
        the peer's CQ is rung as for any SEND)."""
        flags = SendFlag.INLINE | SendFlag.SOLICITED
        flags |= SendFlag.SIGNALED if signaled else SendFlag.NONE
        wrs = [SendWr(wr_id=0, opcode=WrOpcode.RDMA_WRITE, remote_addr=addr, rkey=rkey,
                      send_flags=SendFlag.INLINE, inline_data=data)
               for addr, rkey, data in writes]  # fmt: skip
        wrs.append(SendWr(wr_id=wr_id, opcode=WrOpcode.SEND, send_flags=flags,
                          inline_data=message))  # fmt: skip
        self._post_send(wrs)

    def next_psns(self) -> tuple[int, int] | None:
        """(PSN of the next packet we send, PSN expected next from the peer), for a provider
        that numbers packets (RoCE; ``smcr trace``), else None."""
        return None

    def acknowledged(self) -> bool:
        """Whether the peer has acknowledged everything this QP sent (nothing in flight
        or queued); always for a provider that delivers at once (shm).  The host waits
        for it before it takes a QP away at exit: a last CDC or DELETE LINK lost with the
        QP would be retried by nobody."""
        return True

    def delivery_mark(self) -> int | None:
        """A number that changes whenever the transport delivers over this QP, either way
        (the peer acknowledged packets of ours, or the peer's arrived in order), or the
        peer is heard at all (a retransmission it sent), for a provider with packets in
        flight to watch (RoCE); None for one that delivers at once (shm).  The host asks
        it every few milliseconds while it runs, to tell a slow link from a dead one."""
        return None

    def post_recv(self, wrs: RecvWr | Iterable[RecvWr]) -> None:
        """Queue receive work requests, in order (``ibv_post_recv``): the provider's
        :meth:`_post_recv`, unless failures are injected."""
        if self.hooks is not None:
            self._fault("post_recv")
        self._post_recv(wrs)

    @abstractmethod
    def _post_recv(self, wrs: RecvWr | Iterable[RecvWr]) -> None:
        """Provider: :meth:`post_recv`'s work."""

    @abstractmethod
    def destroy(self) -> None:
        """Destroy the QP; no completions are generated for its outstanding work."""
