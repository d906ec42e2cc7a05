"""One SMC-R connection's data path: cursors, CDC, flow control, urgent data.

Design (Linux ``smc_tx.c``, ``smc_rx.c``, ``smc_cdc.c``; spec §4, §5):

* Cursors are kept as *absolute* byte counts (Python ints never wrap); the
  wire's ``(wrap, count)`` form is made only when a CDC is built or read.
  A received cursor is taken only if it moves forward (``compare`` > 0), which
  is Linux's ``smc_cdc_cursor_to_host`` rule, and checked to stay inside the
  buffer it addresses: a peer cannot make us read or write outside a ring.
* The send path: the application has copied ``n`` bytes into the send buffer
  (payload never enters the engine); :meth:`Connection.flush` RDMA-WRITEs as
  much as the peer's RMBE has room for -- split where either ring wraps -- and
  then posts the CDC with the new producer cursor.  The send buffer space is
  given back when that CDC's send completes (``smc_cdc_tx_handler``).
* The receive path: the application reads from its own RMBE and reports the
  count; a CDC with the consumer cursor goes out by Linux's
  ``smc_tx_consumer_update`` rule (see :meth:`Connection.consumed`).
* Close flags are sticky (spec §4) and drive :mod:`smcr.core.close`.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

from smcr.core.close import CloseInput, Send, SmcState, step
from smcr.core.events import Action, PostSend, RdmaWrite, ReleaseConnection, ShutdownTcp
from smcr.wire.cdc import (
    CDC,
    CDC_MSG_LENGTH,
    CDC_MSG_TYPE,
    CdcMessage,
    ConnectionStateFlags,
    ProducerFlags,
    sequence_before,
)
from smcr.wire.cursor import WRAP_LIMIT, Cursor


class Link(Protocol):
    """The link a connection sends on (:class:`smcr.core.linkgroup.Link`) as this module sees
    it: connections are kept per link (their rkeys, the peer's rtokens), nothing of the
    link is read here.  A protocol, not the class: the link group module holds
    connections, and an import back from here would close a circle."""

    @property
    def qpn(self) -> int:
        """The link's QP number."""

    @property
    def port(self) -> int:
        """The RNIC port of our QP."""

    @property
    def link_id(self) -> int:
        """The link's id in its group."""

# The CDC layout (smcr.wire.cdc.CDC, spec §4) packed here with plain ints: the
# data path builds one CDC per send, and CdcMessage's enums and Cursor objects
# cost more than the rest of that path (tests/core check both give the same bytes).
_PACK: Final = CDC.pack

SOCK_MIN_SNDBUF_HALF: Final = 2304  # Linux SOCK_MIN_SNDBUF / 2 (spec §4, rule 3)
SHUT_WR, SHUT_RDWR = 1, 2

CSF = ConnectionStateFlags
PF = ProducerFlags
_WRITE_BLOCKED: Final = int(PF.WRITE_BLOCKED)
_URGENT_PENDING: Final = int(PF.URGENT_DATA_PENDING)
_URGENT_PRESENT: Final = int(PF.URGENT_DATA_PRESENT)
_UPDATE_REQUESTED: Final = int(PF.CONSUMER_CURSOR_UPDATE_REQUESTED)
_FAILOVER: Final = int(PF.FAILOVER_VALIDATION)
_CLOSED_OR_ABORT: Final = int(CSF.PEER_CONNECTION_CLOSED | CSF.PEER_CONNECTION_ABORT)
_ABORT: Final = int(CSF.PEER_CONNECTION_ABORT)
_CLOSED: Final = int(CSF.PEER_CONNECTION_CLOSED)
_DONE: Final = int(CSF.PEER_DONE_WRITING)
_DONE_OR_CLOSED: Final = _DONE | _CLOSED
SIGNAL_EVERY: Final = 16  # CDC sends between two signaled ones (see Connection.send_cdc)


@dataclass(frozen=True, slots=True, init=False)
class Rmb:
    """A registered receive buffer as the peer sees it (one RMBE, index 1).  Made per
    connection: ``__init__`` written out (:class:`smcr.core.events.SendClc`)."""

    rkey: int
    vaddr: int
    size: int

    def __init__(self, rkey: int, vaddr: int, size: int) -> None:
        object.__setattr__(self, "rkey", rkey)
        object.__setattr__(self, "vaddr", vaddr)
        object.__setattr__(self, "size", size)


def to_cursor(absolute: int, size: int) -> Cursor:
    """The wire cursor of an absolute byte position in a ring of ``size`` bytes."""
    wrap, count = divmod(absolute, size)
    return Cursor(wrap % WRAP_LIMIT, count)


def advance_to(absolute: int, received: Cursor, size: int) -> int:
    """Move ``absolute`` forward to a received cursor; a backward cursor is ignored."""
    return _advance(absolute, received.wrap, received.count, size)


def _advance(absolute: int, wrap: int, count: int, size: int) -> int:
    """:func:`advance_to` on plain ints (the data path): :func:`~smcr.wire.cursor.compare`
    of ``to_cursor(absolute)`` and ``(wrap, count)``, without building cursors."""
    span = size * WRAP_LIMIT
    diff = (wrap * size + count - absolute) % span
    if diff >= span // 2:
        diff -= span
    return absolute + diff if diff > 0 else absolute


class PeerFaultError(Exception):
    """The peer broke the CDC protocol on this connection: abort it."""


class Connection:
    """One connection's cursors and close state (Linux ``struct smc_connection``)."""

    def __init__(self, conn_id: int, token: int, rmb: Rmb, sndbuf_size: int) -> None:
        self.id = conn_id
        self.token = token
        self.rmb = rmb
        self.sndbuf_size = sndbuf_size
        self.sndbuf_limit = sndbuf_size
        """Bytes of the send buffer the application may have in flight (written, not yet
        confirmed): its size, or less once the application lowers ``SO_SNDBUF`` after
        the buffer was allocated (TCP's send buffer shrinks then; the ring keeps its
        size, :attr:`sndbuf_size`, for the cursors' arithmetic)."""
        self.state = SmcState.INIT
        self.link: Link | None = None
        """The link the connection sends on (Linux ``conn->lnk``); :attr:`qpn`,
        :attr:`peer_rkey`, :attr:`peer_vaddr`, :attr:`wr_ids` and :attr:`cdc_pending`
        are that link's, copied here for the data path and switched with it."""
        self.qpn = 0
        self.rmb_keys: dict[Link, tuple[int, int]] = {}
        """Our RMB's (rkey, vaddr) per link of the group (Linux ``rmb_desc->mr[]``)."""
        self.port_keys: dict[int, tuple[int, int]] = {}
        """Our RMB's registrations per port the host made (``Provider.register_rmb``),
        kept when a link goes: a link over that port later uses them again."""
        self.peer_token = 0
        self.peer_rtoken: dict[Any, tuple[int, int]] = {}
        """The peer RMB's (rkey, vaddr) per link (the group's rtoken, shared: the very dict of
        :meth:`LinkGroup.rtoken_add <smcr.core.linkgroup.LinkGroup.rtoken_add>`, keyed by its
        links)."""
        self.peer_rmbe_offset = 0  # our RMBE's place in the peer RMB (CLC rmbe_idx)
        self.peer_rkey = 0
        self.peer_vaddr = 0
        self.peer_rmb_size = 0
        self.wr_ids: Iterator[int] = itertools.repeat(0)  # the link's WR ids once attached
        self.cdc_pending: deque[tuple[int, Connection, int]] = deque()
        """(wr_id, self, producer cursor) per CDC in flight, in the link's queue once attached:
        a completion frees the send buffer up to there (``Engine.send_completed``)."""
        self.unsignaled = 0
        self.autocork = 0  # bytes (Config.autocork_size, at most half the send buffer); 0: off
        self.unanswered = False  # a CDC with new data went out, no CDC came from the peer since
        self.echo_pending = False  # and one of them asked for an answer (UPDATE_REQUESTED)
        self.ask_backoff = 0  # sends that go without asking after an answer found nothing corked
        self.ask_skip = 0  # of which this many are left
        # tx side
        self.tx_app = 0  # bytes the application put into the send buffer
        self.tx_sent = 0  # bytes RDMA-written = our producer cursor
        self.tx_fin = 0  # bytes whose CDC completed: send buffer free up to here
        self.peer_cons = 0  # the peer's consumer cursor: its RMBE is free up to here
        self.peer_hold = 1
        """Bytes of the peer's RMBE left free (1; 0 from a failover until its consumer
        cursor moves).  A Linux peer that read everything and whose consumer-cursor CDC
        went with a failed link never sends that cursor again: its switch sends the
        validation CDC alone, and asked for an update (``cons_curs_upd_req``) it sends
        only what its send buffer holds, nothing when that is empty
        (``smc_tx_sndbuf_nonempty``); a sender that saw its RMBE full would wait for ever.
        The byte held back is always there to write after a switch, with the request,
        and reading it makes the peer answer (``smc_tx_consumer_update``)."""
        self.seq = 0
        self.tx_flags = 0  # our connection state flags (sticky), byte 25
        self.urg_tx_end: int | None = None  # end of an outstanding MSG_OOB write
        # rx side
        self.rx_prod = 0  # the peer's producer cursor
        self.rx_cons = 0  # what the application consumed
        self.rx_cons_sent = 0  # the consumer cursor last sent
        self.rx_seq = 0
        self.rx_flags = 0  # the peer's connection state flags (sticky)
        self.peer_write_blocked = False
        self.peer_blocked_last = False  # the peer's last CDC said: bytes wait for room
        self.rx_complete = False  # link down after the peer's process ended, nothing lost
        self.peer_wants_update = False
        self.urg_rx_pos: int | None = None  # absolute position of an unread urgent byte
        self.released = False
        self.tcp_shut = 0  # how far the TCP socket was shut down (SHUT_WR, SHUT_RDWR)
        self.reset_reason = ""
        self.stats_write_blocked = 0

    # ------------------------------------------------------------ queries

    def sndbuf_space(self) -> int:
        """Bytes the application may copy into the send buffer now."""
        return self.sndbuf_limit - (self.tx_app - self.tx_fin)

    def peer_space(self) -> int:
        """Free bytes in the peer's RMBE (``smc_cdc_... peer_rmbe_space``)."""
        return self.peer_rmb_size - self.peer_hold - (self.tx_sent - self.peer_cons)

    def rx_available(self) -> int:
        """Bytes readable from our RMBE."""
        return self.rx_prod - self.rx_cons

    def tx_pending(self) -> int:
        """Bytes in the send buffer not yet RDMA-written (``smc_tx_prepared_sends``)."""
        return self.tx_app - self.tx_sent

    @property
    def peer_closed(self) -> bool:
        """The peer sent closed or abort (``smc_cdc_rxed_any_close``)."""
        return bool(self.rx_flags & _CLOSED_OR_ABORT)

    @property
    def peer_done(self) -> bool:
        """No more data will come from the peer (EOF after the RMBE is drained)."""
        return bool(self.rx_flags) or self.state is SmcState.CLOSED

    def readable(self, need: int) -> bool:
        """Whether a reader that waits for ``need`` bytes waits no more: they are there, or
        no more will come, or the connection was reset, or an urgent byte came."""
        return (self.rx_prod - self.rx_cons >= need or self.peer_done or bool(self.reset_reason)
                or self.urg_rx_pos is not None)  # fmt: skip

    @property
    def peer_finished(self) -> bool:
        """The peer ended its stream in order (done writing or closed, no abort).

        Its last CDC announced its last byte, written before it (RC ordering):
        once those are read, the reader sees EOF even if the link has gone down
        since -- over a user-space RNIC a peer process that closes and exits
        takes its link with it, while TCP would still deliver the EOF.  The same
        once a peer process that ended without closing left nothing unsent
        (:attr:`rx_complete`, :meth:`link_down`).
        """
        return ((bool(self.rx_flags & _DONE_OR_CLOSED) and not self.rx_flags & _ABORT)
                or self.rx_complete)  # fmt: skip

    @property
    def aborted(self) -> bool:
        """The connection was reset (peer abort or link down)."""
        return bool(self.rx_flags & _ABORT) or bool(self.reset_reason)

    def sends_ended(self) -> bool:
        """No more data goes out: reset, the peer closed or aborted, or our close began."""
        return bool(self.reset_reason or self.peer_closed or self.tx_flags)

    # ------------------------------------------------------------ tx

    def written(self, n: int, out: list[Action], urgent: bool = False) -> None:
        """The application copied ``n`` more bytes into the send buffer."""
        self.tx_app += n
        if urgent and n:
            self.urg_tx_end = self.tx_app
        self.flush(out)

    def direct_room(self) -> int:
        """How many bytes :meth:`write_inline` takes now (0 while any wait in the send buffer)."""
        sent = self.tx_sent
        if self.tx_app != sent or self.urg_tx_end is not None:
            return 0
        return max(0, min(self.sndbuf_limit - (sent - self.tx_fin), self.peer_space()))

    def cork(self, n: int) -> bool:
        """Whether a send of ``n`` bytes should wait in the send buffer (autocorking).

        Linux ``smc_should_autocork``: yes while a CDC is outstanding and what
        waits stays within the corking size.  Outstanding here means: a CDC asked
        the peer for an answer and none came (:meth:`echo_wanted`), so a CDC is
        sure to arrive and flush what waits (:meth:`receive_cdc_fields`), as
        Linux's CDC completion does.  Only bytes that will fit the peer's RMBE
        then, so that the flush sends them all; never urgent data.  Only sends of
        at most a quarter of the corking size: a larger one pays its own CDC, and
        corking it would cost a copy into the send buffer that the inline path
        saves (``smcr bench``: 64 KiB writes took more CPU corked).
        """
        if not self.echo_pending or self.urg_tx_end is not None or n * 4 > self.autocork:
            return False
        sent = self.tx_sent
        waiting = self.tx_app - sent + n
        return (waiting <= self.autocork and waiting <= self.peer_space()
                and n <= self.sndbuf_space())  # fmt: skip

    def corked(self, n: int) -> None:
        """The application copied ``n`` bytes into the send buffer after :meth:`cork`
        said yes: they wait there for the peer's answer, no CDC now."""
        self.tx_app += n

    def echo_wanted(self, n: int) -> bool:
        """Whether the CDC of a send of ``n`` bytes asks the peer to answer it
        (``UPDATE_REQUESTED``: the peer sends its cursors at once), so that sends
        behind it may be corked (:meth:`cork`).

        Yes when autocorking is on, the peer has not answered since our last
        CDC with data (so this send follows another: a burst may be under way),
        none asked yet, and sends this size may be corked.  A lone send and a
        send that answers the peer's message (request/response) ask nothing,
        and cost the peer no extra CDC.  Nor, mostly, do the sends of a
        connection whose answers come with nothing corked meanwhile (sends no
        faster than the peer answers, or far apart): after each such answer,
        twice as many sends as the last time (up to 64) go before one asks again.
        """
        if not (self.unanswered and not self.echo_pending and 0 < n * 4 <= self.autocork):
            return False  # (the caller may skip the call when one of the flags says no)
        if self.ask_skip:
            self.ask_skip -= 1
            return False
        return True

    def write_inline(self, data: memoryview, request: bool = False
                     ) -> tuple[list[tuple[int, int, memoryview]], bytes, int, bool]:  # fmt: skip
        """The application's bytes, RDMA-written straight from its buffer, and their CDC.

        The data path's one call per ``send`` where the RNIC takes inline WRITEs:
        what :meth:`written` and :meth:`flush` do, without the copy into the send
        buffer and without action objects (the send path's largest costs after
        the copy).  Only for at most :meth:`direct_room` bytes, so that all go
        out now and none has to wait in the send buffer; they occupy send-buffer
        space until their CDC completes, as copied bytes do: one accounting.

        :returns: ``(writes, cdc, wr_id, signaled)`` as
            :meth:`~smcr.rdma.base.QueuePair.post_writes_send` takes them: a
            ``(remote_addr, rkey, piece)`` per WRITE (two where the peer's RMBE
            wraps), then the CDC to SEND behind them.
        :param request: ask the peer to answer the CDC (:meth:`echo_wanted`); asked too
            while :attr:`peer_hold` is 0, as :meth:`flush` does.
        :raises ValueError: for no bytes or more than :meth:`direct_room`.
        """
        n, sent, rsize = len(data), self.tx_sent, self.peer_rmb_size
        peer_free = self.peer_space()
        if (not 0 < n <= peer_free or n > self.sndbuf_limit - (sent - self.tx_fin)
                or self.tx_app != sent or self.urg_tx_end is not None):  # fmt: skip
            raise ValueError(f"inline write of {n} bytes: {self.direct_room()} fit now")
        vaddr, rkey = self.peer_vaddr, self.peer_rkey
        dst = sent % rsize
        first = rsize - dst
        if n <= first:
            writes = [(vaddr + dst, rkey, data)]
        else:
            writes = [(vaddr + dst, rkey, data[:first]), (vaddr, rkey, data[first:])]
        flags = 0
        if n == peer_free:  # the peer's RMBE is full now
            flags = _WRITE_BLOCKED
            self.stats_write_blocked += 1
        if request or not self.peer_hold:
            flags |= _UPDATE_REQUESTED
            self.echo_pending = True
        self.tx_app = self.tx_sent = sent + n
        self.unanswered = True
        cdc, wr_id, signaled = self._cdc(flags)
        return writes, cdc, wr_id, signaled

    def flush(self, out: list[Action], force_cdc: bool = False, request: bool = False) -> None:
        """RDMA WRITE what fits into the peer's RMBE, then one CDC (``smc_tx_rdma_writes``).

        :param request: ask the peer to answer the CDC if it carries bytes (autocorking:
            more are likely to come while it does, :meth:`cork`).  Asked too while
            :attr:`peer_hold` is 0: what we know of the peer's consumer cursor may be
            old.
        """
        pending = self.tx_app - self.tx_sent
        space = self.peer_space()
        n = min(pending, space)
        if n <= 0 and not force_cdc:
            return
        flags = 0
        if pending and pending >= space:
            flags = _WRITE_BLOCKED
            self.stats_write_blocked += 1
        if n > 0:
            self._writes(n, out)
            self.unanswered = True
            if request or not self.peer_hold:
                flags |= _UPDATE_REQUESTED
                self.echo_pending = True
        if self.urg_tx_end is not None:
            if self.tx_sent >= self.urg_tx_end:
                flags |= _URGENT_PRESENT
                self.urg_tx_end = None
            else:
                flags |= _URGENT_PENDING
        self.send_cdc(out, flags)

    def _writes(self, n: int, out: list[Action]) -> None:
        """At most three WRITEs: a piece ends where the send buffer or the RMBE wraps."""
        sent, sbsize, rsize = self.tx_sent, self.sndbuf_size, self.peer_rmb_size
        left = n
        while left:
            src = sent % sbsize
            dst = sent % rsize
            chunk = min(left, sbsize - src, rsize - dst)
            out.append(RdmaWrite(self.qpn, self.id, src, chunk, self.peer_vaddr + dst,
                                 self.peer_rkey))  # fmt: skip
            sent += chunk
            left -= chunk
        self.tx_sent = sent

    def send_cdc(self, out: list[Action], flags: int = 0) -> None:
        """Post a CDC with both cursors (every CDC carries the consumer cursor).

        Signaled only every :data:`SIGNAL_EVERY` CDCs, when a quarter of the
        send buffer awaits confirmation, when it carries close flags, or when
        the sender may have to wait after it (peer's RMBE full, bytes left in
        the send buffer): RC completes in order, so one completion frees the
        buffer behind all the CDCs before it (Linux signals each; a completion
        is cheap there).
        """
        data, wr_id, signaled = self._cdc(flags)
        out.append(PostSend(self.qpn, data, wr_id, signaled))

    def _cdc(self, flags: int) -> tuple[bytes, int, bool]:
        """Build the next CDC (:meth:`send_cdc`): its bytes, WR id and whether signaled."""
        self.seq = seq = (self.seq + 1) & 0xFFFF
        rx_cons, tx_sent = self.rx_cons, self.tx_sent
        pwrap, pcount = divmod(tx_sent, self.peer_rmb_size)
        cwrap, ccount = divmod(rx_cons, self.rmb.size)
        data = _PACK(CDC_MSG_TYPE, CDC_MSG_LENGTH, seq, self.peer_token, pwrap & 0xFFFF, pcount,
                     cwrap & 0xFFFF, ccount, flags, self.tx_flags)  # fmt: skip
        self.rx_cons_sent = rx_cons
        self.peer_wants_update = False
        wr_id = next(self.wr_ids)
        self.cdc_pending.append((wr_id, self, tx_sent))
        self.unsignaled = unsignaled = self.unsignaled + 1
        # signaled too when the sender may now have to wait (the peer's RMBE is full,
        # or bytes wait in the send buffer): no later CDC may come to free the space
        # this one's bytes hold until the peer reads
        if (unsignaled >= SIGNAL_EVERY or (tx_sent - self.tx_fin) * 4 > self.sndbuf_limit
                or self.tx_flags or flags & _WRITE_BLOCKED or self.tx_app > tx_sent):  # fmt: skip
            self.unsignaled = 0
            return data, wr_id, True
        return data, wr_id, False

    def switch_cursor(self, seq_fin: int, out: list[Action]) -> None:
        """Carry on over the link now set (``smc_switch_cursor``, after ``smc_switch_conns``
        made it the connection's): the sent cursor goes back to what the last completed
        CDC announced (:attr:`tx_fin`; or to the peer's consumer cursor if that is ahead:
        those bytes were read), a failover-validation CDC names ``seq_fin``, the sequence
        number of that last completed CDC (``smcr_cdc_msg_send_validation``: cursors
        zero, unsignaled here and not counted in :attr:`cdc_pending`, which holds
        only cursor-carrying CDCs), then the bytes from there are written again and
        a CDC announces them.  Rewriting bytes the peer already has is harmless (same
        bytes, same place); a cursor it already saw, or an older sequence number,
        it ignores.  The byte of the peer's RMBE held back (:attr:`peer_hold`) may go
        now, with a request for the peer's consumer cursor, which may have been lost.
        """
        self.tx_fin = max(self.tx_fin, self.peer_cons)
        self.tx_sent = self.tx_fin
        self.unsignaled = 0
        self.echo_pending = False  # (an answer asked for over the old link may never come)
        if self.state in (SmcState.INIT, SmcState.CLOSED):
            return
        self.peer_hold = 0
        data = _PACK(CDC_MSG_TYPE, CDC_MSG_LENGTH, seq_fin, self.peer_token, 0, 0, 0, 0,
                     _FAILOVER, 0)  # fmt: skip
        out.append(PostSend(self.qpn, data, next(self.wr_ids), False))
        self.flush(out, force_cdc=True)

    def cdc_completed(self, tx_sent: int) -> None:
        """The CDC announcing ``tx_sent`` went out: the send buffer is free up to there."""
        self.tx_fin = max(self.tx_fin, tx_sent)

    # ------------------------------------------------------------ rx

    def consumed(self, n: int, out: list[Action], force: bool = False) -> None:
        """The application read ``n`` bytes; maybe send the consumer cursor.

        Linux ``smc_tx_consumer_update``: send when the peer asked, when forced
        (urgent byte), or when more than ``max(RMBE/10, SOCK_MIN_SNDBUF/2)``
        bytes are unconfirmed *and* the peer either sees at most half of the
        RMBE free or told us it is blocked.
        """
        self.rx_cons += n
        if self.state is SmcState.CLOSED or self.tx_flags & _CLOSED_OR_ABORT:
            return
        size = self.rmb.size
        unconfirmed = self.rx_cons - self.rx_cons_sent
        peer_free = size - (self.rx_prod - self.rx_cons_sent)
        if (
            self.peer_wants_update
            or force
            or (
                unconfirmed > max(size // 10, SOCK_MIN_SNDBUF_HALF)
                and (peer_free <= size // 2 or self.peer_write_blocked)
            )
        ):
            self.peer_write_blocked = False
            self.send_cdc(out)

    def receive_cdc(self, msg: CdcMessage, out: list[Action]) -> None:
        """Take a decoded CDC (see :meth:`receive_cdc_fields`)."""
        p, c = msg.producer_cursor, msg.consumer_cursor
        self.receive_cdc_fields(msg.sequence_number, p.wrap, p.count, c.wrap, c.count,
                                int(msg.producer_flags), int(msg.connection_state_flags),
                                out)  # fmt: skip

    def receive_cdc_fields(self, seq: int, pwrap: int, pcount: int, cwrap: int, ccount: int,
                           pflags: int, sflags: int, out: list[Action]) -> None:  # fmt: skip
        """Take a CDC's fields (``smc_cdc_msg_recv_action``).

        :raises PeerFaultError: a cursor outside a ring, or more data than our RMBE holds.
        """
        if pflags & _FAILOVER:
            if sequence_before(self.rx_seq, seq):
                raise PeerFaultError("failover validation CDC newer than the last CDC received")
            return
        if sequence_before(seq, self.rx_seq):
            return  # old sequence number: dropped, as smc_cdc_rx_handler does
        self.rx_seq = seq
        if self.echo_pending:  # (autocorking: cork, echo_wanted)
            if self.tx_app > self.tx_sent:
                self.ask_backoff = 0
            else:  # asking was in vain: ask less often
                self.ask_backoff = self.ask_skip = min(64, self.ask_backoff * 2 or 1)
        self.unanswered = self.echo_pending = False
        size = self.rmb.size
        peer_size = self.peer_rmb_size or 1  # 0: the CLC Confirm is still on its way
        if pcount >= size or ccount >= peer_size:
            raise PeerFaultError("CDC cursor outside the ring")
        prod = self.rx_prod
        held = divmod(prod, size)
        if (pwrap, pcount) != (held[0] & 0xFFFF, held[1]):
            prod = _advance(prod, pwrap, pcount, size)
            if prod - self.rx_cons > size:
                raise PeerFaultError("peer wrote more than our RMBE holds")
            self.rx_prod = prod
        cons = self.peer_cons
        held = divmod(cons, peer_size)
        if (cwrap, ccount) != (held[0] & 0xFFFF, held[1]):
            cons = _advance(cons, cwrap, ccount, peer_size)
            if cons > self.tx_sent:
                raise PeerFaultError("peer consumed more than we wrote")
            if cons != self.peer_cons:  # (it moved: the hold of a failover ends)
                self.peer_cons = cons
                self.peer_hold = 1
        if pflags:
            if pflags & _URGENT_PRESENT and prod > self.rx_cons:
                self.urg_rx_pos = prod - 1
            if pflags & _UPDATE_REQUESTED:
                self.peer_wants_update = True
                if self.peer_rmb_size:  # (else its CDC overtook its CLC Confirm: we answer
                    self.send_cdc(out)  # once that is here, ClcHandshakes._complete)
        self.peer_write_blocked = self.peer_blocked_last = bool(pflags & _WRITE_BLOCKED)
        if self.tx_app > self.tx_sent and self.peer_space() > 0:
            self.flush(out, request=self.autocork > 0)  # (corked bytes: more may follow)
        new_flags = sflags & ~self.rx_flags
        if new_flags:
            self.rx_flags |= sflags
            self._peer_close(new_flags, out)

    def _peer_close(self, new: int, out: list[Action]) -> None:
        if new & _ABORT:
            ev = CloseInput.PEER_ABORT_RELEASED if self.released else CloseInput.PEER_ABORT
        elif new & _CLOSED:
            ev = CloseInput.PEER_CLOSED_RELEASED if self.released else CloseInput.PEER_CLOSED
        else:
            ev = CloseInput.PEER_DONE_WRITING
        self.close_step(ev, out)

    # ------------------------------------------------------------ close

    def close_step(self, ev: CloseInput, out: list[Action]) -> None:
        """Run the close table and do what the transition says."""
        send, new = step(self.state, ev)
        first_close_cdc = not self.tx_flags
        if send is Send.DONE_WRITING:
            self.tx_flags |= _DONE
        elif send is Send.CLOSE:
            if self.tx_app - self.tx_sent > self.peer_space():
                # bytes of ours that cannot go now (the host's wait for them ended): a
                # closed CDC would end the peer's stream short without a word, so abort
                # (the peer's reads fail, as a TCP reset's do) and drop them
                self.tx_app = self.tx_sent
                self.urg_tx_end = None
                self.tx_flags |= _ABORT
            else:  # unread bytes: an abort too, as TCP resets then
                self.tx_flags |= _ABORT if self.rx_available() > 0 else _CLOSED
        elif send is Send.ABORT:
            self.tx_flags |= _ABORT
        if send is not Send.NOTHING:
            self.flush(out, force_cdc=True)
            if first_close_cdc:  # Linux shuts the TCP socket down after its first close CDC
                self.shut_tcp(SHUT_WR if send is Send.DONE_WRITING else SHUT_RDWR, out)
        old, self.state = self.state, new
        if new is SmcState.CLOSED and old is not SmcState.CLOSED:
            self.shut_tcp(SHUT_RDWR, out)
            if self.released:
                out.append(ReleaseConnection(self.id))

    def shut_tcp(self, how: int, out: list[Action]) -> None:
        """Shut the TCP socket down ``how`` far, unless it is already (an active close
        shut it both ways after its closing CDC; the peer's answer, which ends the
        connection, asked for it once more)."""
        if how > self.tcp_shut:
            self.tcp_shut = how
            out.append(ShutdownTcp(self.id, how))

    def app_close(self, out: list[Action]) -> None:
        """The application closed (or released) the socket (``smc_close_active``)."""
        if self.released:
            return
        self.released = True
        if self.state is SmcState.CLOSED:
            out.append(ReleaseConnection(self.id))
            return
        ev = CloseInput.APP_CLOSE_PEER_CLOSED if self.peer_closed else CloseInput.APP_CLOSE
        self.close_step(ev, out)

    def app_abort(self, out: list[Action]) -> bool:
        """An abortive close by the application (``SO_LINGER`` with a linger time of 0).

        What the send buffer still holds is dropped (a TCP reset drops it too),
        an abort CDC tells the peer, whose reads end in ``ECONNRESET``, and the
        application is done with the connection at once.  The connection itself,
        with its RMB, stays until the peer's closing CDC answers (the state an
        ordinary close goes to: PEERCLOSEWAIT1 from ACTIVE), unless the peer has
        closed already, as Linux's ``smc_close_active`` keeps a connection it
        closed with linger time 0.  Until that answer the peer may still be
        writing into our RMB: freeing it at once (DELETE RKEY) made the Linux
        kernel, which clears the rtoken on DELETE RKEY, send its next RDMA WRITE
        with rkey 0, and the access error ended the link and its link group.

        :returns: False if already released or CLOSED (then it is an ordinary close).
        """
        if self.released or self.state is SmcState.CLOSED:
            return False
        self.tx_app = self.tx_sent
        self.urg_tx_end = None
        self.released = True
        first_close_cdc = not self.tx_flags
        self.tx_flags |= _ABORT
        self.send_cdc(out)
        if first_close_cdc:  # as after any first close CDC (close_step)
            self.shut_tcp(SHUT_RDWR, out)
        new = SmcState.CLOSED if self.peer_closed else step(self.state, CloseInput.APP_CLOSE)[1]
        self.state = new  # it was not CLOSED (above)
        if new is SmcState.CLOSED:
            out.append(ReleaseConnection(self.id))
        return True

    def app_shutdown_write(self, out: list[Action]) -> None:
        """``shutdown(SHUT_WR)`` (``smc_close_shutdown_write``)."""
        self.close_step(CloseInput.APP_SHUT_WR, out)

    def link_down(self, reason: str, out: list[Action], peer_gone: bool = False) -> None:
        """The link is gone: the connection is reset (``smc_conn_kill``).

        Except for the peer's stream when its process ended (``peer_gone``: the RNIC
        delivered all it posted) with nothing waiting in its send buffer (its last
        CDC did not say write-blocked; the CDC that fills our RMBE always does): every
        byte its application sent is in our RMBE, and its reader gets them, then EOF,
        as from a TCP peer whose process exits without closing (its kernel sends FIN;
        Linux SMC-R's kernel closes such a socket in order too).  Sends still fail.
        Where bytes may be lost the reader gets ``ECONNRESET``, never a false EOF.
        """
        if self.state is not SmcState.CLOSED:
            self.rx_complete = (peer_gone and not self.peer_blocked_last
                                and not self.rx_flags & _ABORT)  # fmt: skip
            self.reset_reason = reason
            self.close_step(CloseInput.LINK_DOWN, out)
