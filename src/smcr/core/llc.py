"""The link layer of the engine: what arrives on links, LLC flows, a link group's end.

The part of :class:`~smcr.core.engine.Engine` that Linux has in ``smc_wr.c``,
``smc_cdc.c``, ``smc_llc.c`` and the link functions of ``smc_core.c``: it handles what
arrives on a link (``smc_wr_rx_demultiplex``: byte 0 0xFE is a CDC, anything else
LLC, dispatched by the engine's LLC table), answers the LLC requests that need no
flow of their own (CONFIRM RKEY, DELETE RKEY, TEST LINK), runs the local LLC flows
(one at a time per link group, ``smc_llc_flow_start``), the TEST LINK keepalive, and
the end of a link group; and it holds what the other parts do with links: make one,
move connections to one (``smc_switch_conns``), clear one (``smcr_link_clear``).

It calls no other part: the handlers of ADD LINK (:mod:`smcr.core.addlink`), DELETE
LINK (:mod:`smcr.core.failover`) and CONFIRM LINK (:mod:`smcr.core.clc`) come in
through the table the engine gives it (:attr:`LinkLayer.table`), as Linux's
``smc_wr_rx_register_handler``; a handshake its group's end takes down falls back
here, without the handshake part (a Decline, :meth:`EngineState.fall_back
<smcr.core.state.EngineState.fall_back>`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from smcr.core import llc_msgs
from smcr.core.close import SmcState
from smcr.core.connection import Connection, PeerFaultError
from smcr.core.events import (
    Action,
    ConnectionReset,
    DestroyQp,
    LinkGroupTerminated,
    LinkRemoved,
    LlcDropped,
    PostSend,
)
from smcr.core.handshake import HsState, decline_clc
from smcr.core.linkgroup import LgrType, Link, LinkGroup, LinkState, LocalFlow
from smcr.core.state import EngineState
from smcr.wire.cdc import (
    CDC,
    CDC_CONN_STATE_FLAGS,
    CDC_CONS_COUNT,
    CDC_CONS_WRAP,
    CDC_MSG_TYPE,
    CDC_PROD_COUNT,
    CDC_PROD_FLAGS,
    CDC_PROD_WRAP,
    CDC_SEQNO,
    CDC_TOKEN,
    ConnectionStateFlags,
    ProducerFlags,
)
from smcr.wire.decline import DeclineCode
from smcr.wire.errors import WireError
from smcr.wire.llc import (
    LLC_FLAG_DEL_LINK_ALL,
    LLC_FLAG_DEL_LINK_ORDERLY,
    LLC_FLAG_RKEY_NEG,
    ConfirmRkey,
    DeleteLinkReason,
    DeleteRkey,
    DeleteRkeyV2,
    LlcMessage,
    LlcType,
    TestLink,
    decode_llc,
)

_CDC_SIZE: Final = CDC.size
_CDC_UNPACK: Final = CDC.unpack_from
# producer flags that ask for something (all but write-blocked): such a CDC is never coalesced
_CDC_EVENT_PFLAGS: Final = 0xF8 & ~int(ProducerFlags.WRITE_BLOCKED)


CLC_WAIT_TIME_SHORT: Final = 1.0
"""How long a first-contact client whose link died waits for the server's Decline (Linux's
name; the engine's ``DECLINE_WAIT_SHORT`` after an unanswered CONFIRM LINK)."""

LATE_LINKS: Final = 64
"""Cleared links remembered for their late CDCs (:meth:`LinkLayer._receive_late`)."""


class LlcViolationError(Exception):
    """The peer broke the LLC protocol: terminate the link group (reason 0x00040000)."""


LlcHandler = Callable[[Link, LlcMessage, float, list[Action]], None]
LlcRoute = tuple[LlcHandler, frozenset[LinkState]]
"""An LLC table entry: the handler, and the states of the link a message came in on in
which it is handled; in any other the message is dropped (:meth:`LinkLayer._dispatch`)."""

ANY_LINK_STATE: Final = frozenset(LinkState)
"""The states of an LLC table entry whose handler takes a message on any link."""


class LinkLayer:
    """What happens on links (module docstring), over the engine's shared state."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.table: dict[tuple[int, bool], LlcRoute] = {}
        """The LLC table, ``(msg_type, response) -> (handler, allowed link states)`` (Linux
        ``smc_llc_rx_handlers``): the engine's (:meth:`Engine._llc_table
        <smcr.core.engine.Engine._llc_table>`)."""

    # ========================================================= what arrives

    def receive_wr(self, qpn: int, data: memoryview, now: float) -> list[Action]:
        """A SEND arrived on a link: a CDC (byte 0 0xFE) or an LLC message."""
        out: list[Action] = []
        link = self._heard(qpn, now)
        if link is not None:
            self._receive_one(link, data, now, out)
        elif qpn in self.state.late_links:
            self._receive_late(qpn, [data], out)
        return out

    def _receive_late(self, qpn: int, datas: list[memoryview], out: list[Action]) -> None:
        """SENDs that were delivered on a link before it was cleared, taken from the CQ after
        (Linux drains a link's CQ before it clears it, ``smc_wr_drain_cq``): its CDCs still
        count, found by token in the group (``smc_cdc_rx_handler``), as the peer saw them
        complete; its LLC messages are dropped with the link."""
        link = self.state.late_links[qpn]
        if link.lgr.terminated:
            del self.state.late_links[qpn]
            return
        for data in datas:
            if data and data[0] == CDC_MSG_TYPE:
                self._receive_cdc(link, data, out)

    def _heard(self, qpn: int, now: float) -> Link | None:
        """The link a message came in on, marked alive (no TEST LINK due); None if unknown."""
        link = self.state.links.get(qpn)
        if link is not None:
            link.last_rx = now
            link.test_deadline = None
        return link

    def receive_wrs(self, qpn: int, datas: list[memoryview], now: float) -> list[Action]:
        """SENDs that arrived on a link together, in order: :meth:`receive_wr` for each,
        except that CDCs are coalesced.

        Of the CDCs of one connection that carry nothing but cursors (no flag
        but write-blocked), only the last before the next other message is
        applied: every CDC carries both cursors, cursors only move forward and
        RC delivers in order, so the last says all that the earlier ones said.
        Linux applies each; the outcome is the same, the work per CDC much less
        when a busy receiver finds many waiting.  Skipped CDCs are still checked
        (length, token, cursors inside the rings): a malformed one is handled
        at its place, as :meth:`receive_wr` would.
        """
        if len(datas) == 1:
            return self.receive_wr(qpn, datas[0], now)
        out: list[Action] = []
        link = self._heard(qpn, now)
        if link is None:
            if qpn in self.state.late_links:
                self._receive_late(qpn, datas, out)
            return out
        conns = link.lgr.conns
        deferred: dict[int, memoryview] = {}  # token -> its latest cursor-only CDC
        for data in datas:
            if len(data) == _CDC_SIZE and data[0] == CDC_MSG_TYPE and data[1] == _CDC_SIZE:
                f = _CDC_UNPACK(data)
                token = f[CDC_TOKEN]
                conn = conns.get(token)
                if (conn is not None and not f[CDC_PROD_FLAGS] & _CDC_EVENT_PFLAGS
                        and not f[CDC_CONN_STATE_FLAGS] & 0xE0  # (no close: never coalesced)
                        and f[CDC_PROD_COUNT] < conn.rmb.size
                        and f[CDC_CONS_COUNT] < (conn.peer_rmb_size or 1)):  # fmt: skip
                    deferred[token] = data
                    continue
            for earlier in deferred.values():
                self._receive_cdc(link, earlier, out)
            deferred.clear()
            self._receive_one(link, data, now, out)
        for earlier in deferred.values():
            self._receive_cdc(link, earlier, out)
        return out

    def take_cdc(self, qpn: int, area: memoryview, off: int, n: int, now: float,
                 out: list[Action]) -> bool:  # fmt: skip
        """A SEND of ``n`` bytes at ``off`` in ``area`` (an RNIC's receive area, read in
        place), taken if it is a well-formed CDC for a known connection of a live link, as
        :meth:`receive_wr` would take it; anything else (an LLC message, a malformed CDC,
        a cleared link's) is left for :meth:`receive_wr`, which reports it.

        :returns: whether it was taken.
        """
        if n != _CDC_SIZE or area[off] != CDC_MSG_TYPE or area[off + 1] != _CDC_SIZE:
            return False
        link = self.state.links.get(qpn)
        if link is None:
            return False
        f = _CDC_UNPACK(area, off)
        conn = link.lgr.conns.get(f[CDC_TOKEN])
        if conn is None:
            return False
        link.last_rx = now
        link.test_deadline = None
        self._apply_cdc(conn, f, out)
        return True

    def _receive_one(self, link: Link, data: memoryview, now: float, out: list[Action]) -> None:
        if data and data[0] == CDC_MSG_TYPE:
            self._receive_cdc(link, data, out)
            return
        qpn = link.qpn
        try:
            msg = decode_llc(data)
        except WireError as exc:
            self.drop(qpn, f"undecodable LLC message: {exc}")
            return
        self._dispatch(link, msg, now, out)

    def _dispatch(self, link: Link, msg: LlcMessage, now: float, out: list[Action]) -> None:
        """Hand an LLC message to its handler (the table's, by type and response flag, as
        Linux ``smc_llc_rx_handler`` splits responses from requests) if the link it came
        on is in a state the handler takes; else it is dropped.  A handler that finds the
        peer broke the protocol ends the group (DELETE LINK ALL, protocol violation)."""
        response = msg.is_response
        route = self.table.get((msg.TYPE, response))
        try:
            if route is None:
                raise LlcViolationError(f"LLC type 0x{msg.TYPE:02x} not handled")
            handler, states = route
            if link.state not in states:
                kind = "response" if response else "request"
                self.drop(link.qpn, f"LLC {LlcType(msg.TYPE).name} {kind} on a link in "
                                    f"state {link.state.name}")  # fmt: skip
                return
            handler(link, msg, now, out)
        except LlcViolationError as exc:
            self.delete_all(link.lgr, DeleteLinkReason.PROT_VIOL, str(exc), out)

    def delay(self, link: Link, msg: LlcMessage) -> bool:
        """An ADD LINK or DELETE LINK request while a local flow runs (Linux
        ``smc_llc_flow_start`` -> ``smc_llc_flow_parallel``): one of another kind waits
        for the flow's end (one such request; more are dropped), one of the same kind is
        dropped.  Whether it was held back."""
        lgr = link.lgr
        flow = lgr.flow
        if flow is None:
            return False
        if (flow.request.TYPE & 0x0F) != (msg.TYPE & 0x0F) and lgr.delayed is None:
            lgr.delayed = (link, msg)
        else:
            self.drop(link.qpn, "LLC request parallel to a running flow of ours")
        return True

    def _receive_cdc(self, link: Link, data: memoryview, out: list[Action]) -> None:
        if len(data) != _CDC_SIZE or data[1] != _CDC_SIZE:  # smc_cdc_rx_handler drops it
            self.drop(link.qpn, f"bad CDC: {len(data)} bytes, length byte {data[1:2].hex()}")
            return
        f = _CDC_UNPACK(data)
        conn = link.lgr.conns.get(f[CDC_TOKEN])
        if conn is None:
            self.drop(link.qpn, f"CDC for unknown token {f[CDC_TOKEN]}")
            return
        self._apply_cdc(conn, f, out)

    def _apply_cdc(self, conn: Connection, f: tuple[int, ...], out: list[Action]) -> None:
        """A CDC's fields (``f``, as :data:`~smcr.wire.cdc.CDC` unpacks them) taken by its
        connection, which is touched; a peer's fault aborts it (``smc_cdc_msg_recv``)."""
        self.state.touched.add(conn.id)
        try:
            conn.receive_cdc_fields(f[CDC_SEQNO], f[CDC_PROD_WRAP], f[CDC_PROD_COUNT],
                                    f[CDC_CONS_WRAP], f[CDC_CONS_COUNT],
                                    f[CDC_PROD_FLAGS] & 0xF8, f[CDC_CONN_STATE_FLAGS] & 0xE0,
                                    out)  # fmt: skip
        except PeerFaultError as exc:
            self.abort(conn, f"peer fault: {exc}", out)

    def abort(self, conn: Connection, reason: str, out: list[Action]) -> None:
        """Abort one connection: abort CDC, then CLOSED (``smc_conn_kill``)."""
        if conn.state is not SmcState.CLOSED:
            conn.tx_flags |= int(ConnectionStateFlags.PEER_CONNECTION_ABORT)
            conn.flush(out, force_cdc=True)
            conn.link_down(reason, out)
        self.state.events.append(ConnectionReset(conn=conn.id, reason=reason))

    def drop(self, qpn: int, reason: str) -> None:
        """Drop an LLC or CDC message: counted and reported (STYLE §4)."""
        self.state.dropped += 1
        self.state.events.append(LlcDropped(qpn=qpn, reason=reason))

    def post_llc(self, link: Link, msg: LlcMessage, out: list[Action]) -> None:
        """SEND an LLC message on ``link``."""
        out.append(PostSend(link.qpn, msg.encode(), link.next_wr_id()))

    # -- LLC handlers (``smc_llc_event_handler``, ``smc_llc_rx_response``) ------

    def receive_confirm_rkey(self, link: Link, msg: LlcMessage, now: float,
                             out: list[Action]) -> None:  # fmt: skip
        """The peer's CONFIRM RKEY (``smc_llc_rmt_conf_rkey``): its RMB's rkeys, the first
        for the link it came on, the others named by link id; answered at once."""
        assert isinstance(msg, ConfirmRkey)
        lgr = link.lgr
        named = [(x, other) for other in msg.other_rtokens
                 if (x := lgr.link_by_id(other.link_id)) is not None]  # fmt: skip
        rt = lgr.rtoken_find(link, msg.rmb_key)
        for x, other in named if rt is None else ():
            # a peer of ours sends its CLC message without waiting for this flow's end
            # (Rkeys.confirm_rkey): for a connection on another link than the one
            # this came on, the CLC message may have brought the RMB first, by its rkey
            # on that link; Linux's peer never does (its CLC message comes after)
            rt = lgr.rtoken_find(x, other.rmb_key)
            if rt is not None:
                break
        if rt is None:
            rt = lgr.rtoken_add(link, msg.rmb_key, msg.rmb_vaddr)
        lgr.rtoken_set(rt, link, msg.rmb_key, msg.rmb_vaddr)
        for x, other in named:
            lgr.rtoken_set(rt, x, other.rmb_key, other.rmb_vaddr)
        self.post_llc(link, msg.response(), out)

    def receive_confirm_rkey_response(self, link: Link, msg: LlcMessage, now: float,
                                      out: list[Action]) -> None:  # fmt: skip
        """The answer to our CONFIRM RKEY flow: the peer took the rkeys unless negative."""
        assert isinstance(msg, ConfirmRkey)
        self.flow_response(link.lgr, msg, not msg.flags & LLC_FLAG_RKEY_NEG, now, out)

    def receive_delete_rkey(self, link: Link, msg: LlcMessage, now: float,
                            out: list[Action]) -> None:  # fmt: skip
        """The peer's DELETE RKEY (``smc_llc_rmt_delete_rkey``): its RMBs forgotten,
        answered at once."""
        assert isinstance(msg, DeleteRkey | DeleteRkeyV2)
        mask = invalid = 0
        for i, rkey in enumerate(msg.rkeys):
            if not link.lgr.rtoken_delete(link, rkey):
                mask |= 0x80 >> i
                invalid += 1
        # v1: a mask of the unknown ones; v2: their number, the list zeroed
        response = msg.response(invalid) if isinstance(msg, DeleteRkeyV2) else msg.response(mask)
        self.post_llc(link, response, out)

    def receive_delete_rkey_response(self, link: Link, msg: LlcMessage, now: float,
                                     out: list[Action]) -> None:  # fmt: skip
        """The answer to our DELETE RKEY flow."""
        assert isinstance(msg, DeleteRkey | DeleteRkeyV2)
        self.flow_response(link.lgr, msg, True, now, out)

    def receive_test_link(self, link: Link, msg: LlcMessage, now: float,
                          out: list[Action]) -> None:  # fmt: skip
        """The peer's TEST LINK, answered."""
        assert isinstance(msg, TestLink)
        self.post_llc(link, msg.response(), out)

    def ignore(self, link: Link, msg: LlcMessage, now: float, out: list[Action]) -> None:
        """A message that asks nothing: a TEST LINK response (anything received marks
        the link alive), a CONFIRM RKEY CONTINUATION (Linux never sends it and ignores
        it)."""

    # -- local flows ------------------------------------------------------------

    def start_flow(self, lgr: LinkGroup, request: LlcMessage,
                   on_done: Callable[[bool, float], list[Action]], now: float,
                   out: list[Action],
                   build: Callable[[Link], LlcMessage] | None = None,
                   first: bool = False) -> None:  # fmt: skip
        """Queue a local LLC flow; it starts when the group's previous flow ended (and, as
        Linux ``smc_llc_flow_start``, not while the peer's ADD LINK is being answered);
        ``first``: before the others queued."""
        flow = LocalFlow(request, on_done, build=build)
        if first:
            lgr.flow_queue.appendleft(flow)
        else:
            lgr.flow_queue.append(flow)
        self.next_flow(lgr, now, out)

    def next_flow(self, lgr: LinkGroup, now: float, out: list[Action]) -> None:
        """Start the next local flow, if none runs; a request held back while one ran
        (:meth:`delay`) is handled first, as Linux's ``smc_llc_flow_stop`` hands the
        delayed event to the event worker before waking waiting flows."""
        while True:
            if (lgr.delayed is not None and lgr.flow is None and lgr.remote_add is None
                    and not lgr.terminated):  # fmt: skip
                held, msg = lgr.delayed
                lgr.delayed = None
                if held in lgr.links and held.state is LinkState.LINK_ACTIVE:
                    self._dispatch(held, msg, now, out)
                continue
            link = lgr.active_link
            if (lgr.flow is not None or not lgr.flow_queue or link is None
                    or lgr.remote_add is not None or lgr.terminated):  # fmt: skip
                return
            flow = lgr.flow = lgr.flow_queue.popleft()
            if flow.start is not None:
                request = flow.start(link, now, out)
                if request is None:  # nothing to do once its turn came
                    lgr.flow = None
                    continue
                flow.request = request
            if flow.build is not None:
                flow.request = flow.build(link)
            flow.deadline = now + self.state.config.llc_wait
            flow.started = now
            self.post_llc(link, flow.request, out)
            return

    def wait_on(self, lgr: LinkGroup, flow: LocalFlow, now: float) -> bool:
        """Whether a local flow whose wait ran out waits on (its deadline moved, by
        :meth:`wait_more`).  ADD LINK's steps that wait for the client's answers over the
        link the offer went on (its response, the rkey exchange: one round trip per two
        RMBs, each answer behind that link's data) wait on while that link delivers; its
        CONFIRM LINK, over the new link, does not, nor an ADD LINK not yet under way.
        Why: after a failover the one link left carries every connection's bytes, and
        with a few hundred RMBs a 2 s step timed out now and then; the offer then failed,
        and with no port event to come the group stayed at one link."""
        add = flow.add_link
        if flow.started is None or (flow.adds_link and add is None):
            return False
        if add is not None:
            if add.step not in ("response", "cont") or add.link.state is not LinkState.LINK_ACTIVE:
                return False
            links = [add.link]
        else:
            links = [x for x in lgr.links if x.state is LinkState.LINK_ACTIVE]
        deadline = self.wait_more(flow.started, links, now)
        if deadline is None:
            return False
        flow.deadline = deadline
        return True

    def wait_more(self, started: float, links: list[Link], now: float) -> float | None:
        """The new end of an LLC wait (started at ``started``) that ran out, or None to give
        up: ``llc_wait`` after the last sign that ``links`` deliver (a message heard, a
        send of ours completed, the QP's PSNs moved), ``llc_wait_heard`` after the start
        at the latest.

        Linux's ``smc_llc_wait`` and TEST LINK give up after ``SMC_LLC_WAIT_TIME``
        whatever the link does.  Under heavy loss a request queued behind the data of
        busy connections, and the response behind the peer's, take longer than that to
        get through the RC retransmissions (go-back-N, a retransmit timeout per lost
        NAK) while both QPs keep delivering; giving up then resets connections for loss
        alone.  A link that stopped delivering is still given up on ``llc_wait`` after
        its last sign of life.  The wire is unchanged.
        """
        alive = max((max(x.last_rx, x.last_delivered) for x in links), default=None)
        if alive is None:
            return None
        cfg = self.state.config
        deadline = min(max(alive, started) + cfg.llc_wait, started + cfg.llc_wait_heard)
        return deadline if deadline > now else None

    def flow_response(self, lgr: LinkGroup, msg: LlcMessage, ok: bool, now: float,
                      out: list[Action]) -> None:  # fmt: skip
        """The peer's answer to the group's running local flow (``ok``: a positive one);
        the next flow starts.  One that fits no flow is dropped."""
        flow = lgr.flow
        if flow is None or flow.request.TYPE != msg.TYPE:
            self.drop(lgr.links[0].qpn if lgr.links else 0, "LLC response fits no flow")
            return
        lgr.flow = None
        self.finish_flow(flow, ok, now, out)
        self.next_flow(lgr, now, out)

    def finish_flow(self, flow: LocalFlow, ok: bool, now: float, out: list[Action]) -> None:
        """A local flow ended (answered, or not): what its owner does then."""
        out.extend(flow.on_done(ok, now))

    # ============================================== verbs completions, keepalive

    def send_completed(self, qpn: int, wr_id: int, now: float) -> None:
        """A signaled send completed without error: CDCs up to it free send-buffer space
        (``smc_cdc_tx_handler``); the link delivers (:meth:`wait_on`)."""
        link = self.state.links.get(qpn)
        if link is not None:
            link.last_delivered = now
        pending = self.state.cdc_pending.get(qpn)
        touched = self.state.touched
        while pending and pending[0][0] <= wr_id:
            _, conn, tx_sent = pending.popleft()
            conn.cdc_completed(tx_sent)
            touched.add(conn.id)

    def probe_link(self, conn_id: int, now: float) -> list[Action]:
        """Test a connection's link at once (TEST LINK), not after the idle time.

        The host calls it when the connection's TCP socket ends while SMC-R runs:
        over a user-space RNIC a killed peer process leaves nothing but its
        kernel's TCP FIN or RST, and its link would look alive until the
        keepalive (30 s).  An answer changes nothing (a peer's orderly close also
        ends its TCP); silence for ``llc_wait``, or the QP's retry exceeded, ends
        the link group as for any dead link.
        """
        out: list[Action] = []
        conn = self.state.conns.get(conn_id)
        link = self.state.links.get(conn.qpn) if conn is not None else None
        if link is None or link.state is not LinkState.LINK_ACTIVE or link.lgr.terminated:
            return out
        if link.test_deadline is None:
            self.post_llc(link, llc_msgs.test_link(link.lgr), out)
            link.test_sent = now
            link.test_deadline = now + self.state.config.llc_wait
        return out

    def keepalive(self, link: Link, now: float, out: list[Action]) -> bool:
        """``smc_llc_testlink_work``: TEST LINK after idle time.  Whether the link is down
        (its TEST LINK unanswered, ``smcr_link_down_cond_sched``): the caller fails it."""
        period = self.state.config.testlink_time
        if period <= 0 or link.state is not LinkState.LINK_ACTIVE:
            return False
        if link.test_deadline is not None:
            if now < link.test_deadline:
                return False
            more = self.wait_more(link.test_sent, [link], now)  # a slow link is not down
            if more is None:
                return True
            link.test_deadline = more
            return False
        if now >= link.last_rx + period:
            self.post_llc(link, llc_msgs.test_link(link.lgr), out)
            link.test_sent = now
            link.test_deadline = now + self.state.config.llc_wait
        return False

    # ==================================================== a link group's end

    def delete_all(self, lgr: LinkGroup, reason: int, text: str, out: list[Action]) -> None:
        """End a link group and tell the peer: DELETE LINK ALL, orderly, with ``reason``."""
        link = lgr.active_link
        if link is not None:
            flags = LLC_FLAG_DEL_LINK_ALL | LLC_FLAG_DEL_LINK_ORDERLY
            self.post_llc(link, llc_msgs.delete_link(lgr, flags, reason), out)
        self.terminate(lgr, text, out)

    def terminate(self, lgr: LinkGroup, reason: str, out: list[Action],
                  decline: DeclineCode = DeclineCode.NOACTLINK,
                  now: float | None = None, peer_gone: bool = False) -> None:  # fmt: skip
        """End a link group: every connection is reset, every QP destroyed
        (``smc_lgr_terminate``); handshakes under way on it decline with ``decline``.

        Except a first-contact client waiting for CONFIRM LINK whose link went down
        (``now`` given): as Linux ``smcr_clnt_conf_first_link`` it waits
        ``CLC_WAIT_TIME_SHORT`` for the server's Decline first (the server's failure
        is the likely cause of the link's end; a Decline of ours crossing it would
        reach the fallen-back server's application as data), then declines
        ``TIMEOUT_CL`` (``DECLINE_WAIT``).
        """
        if lgr.terminated:
            return
        lgr.terminated = True
        lgr.remote_add = None
        for conn in list(lgr.conns.values()):
            hs = self.state.handshakes.get(conn.id)
            if hs is not None and hs.state not in (HsState.DONE, HsState.FALLBACK):
                continue  # declined below: its TCP carries on as the fallback, not reset
            self.state.touched.add(conn.id)
            if conn.state is not SmcState.CLOSED:
                conn.link_down(reason, out, peer_gone)
                self.state.events.append(ConnectionReset(conn=conn.id, reason=reason))
        for hs in list(self.state.handshakes.values()):
            if hs.lgr is lgr and hs.state not in (HsState.DONE, HsState.FALLBACK):
                if hs.first_contact:
                    hs.lgr = None  # do not recurse
                if (now is not None and decline is DeclineCode.NOACTLINK and hs.client
                        and hs.state is HsState.CONFIRM_LINK_WAIT):  # fmt: skip
                    hs.state = HsState.DECLINE_WAIT
                    hs.deadline = now + CLC_WAIT_TIME_SHORT
                    continue
                # (a first contact is off its group already: no second end of it)
                out.append(decline_clc(hs, decline, self.state.identity.peer_id))
                self.state.fall_back(hs, int(decline), 0)
        if lgr.flow is not None:
            self.finish_flow(lgr.flow, False, 0.0, out)
            lgr.flow = None
        while lgr.flow_queue:
            self.finish_flow(lgr.flow_queue.popleft(), False, 0.0, out)
        for link in lgr.links:
            link.state = LinkState.LINK_INACTIVE
            self.state.links.pop(link.qpn, None)
            self.state.cdc_pending.pop(link.qpn, None)
            out.append(DestroyQp(link.qpn, **link.names))
        self.state.lgrs.pop(lgr.lgr_id, None)
        self.state.events.append(LinkGroupTerminated(lgr_id=lgr.lgr_id, reason=reason))

    # ================================================================ links

    def new_link(self, lgr: LinkGroup, port: int, link_id: int) -> Link:
        """A link of ``lgr`` over our ``port``: its QP made (RESET) by the host, not yet up."""
        qpn, psn = self.state.provider.new_qp(port)
        link = Link(qpn, psn, lgr, link_id=link_id, port=port)
        lgr.links.append(link)
        self.state.links[qpn] = link
        self.state.cdc_pending[qpn] = deque()
        return link

    def rmb_on(self, conn: Connection, link: Link) -> tuple[int, int]:
        """Our RMB's (rkey, vaddr) for ``link``: the host's registration on the link's
        port (:meth:`Provider.register_rmb`), the RMB's own on port 0."""
        keys = conn.rmb_keys.get(link)
        if keys is None:
            keys = conn.port_keys.get(link.port)
            if keys is None:
                keys = ((conn.rmb.rkey, conn.rmb.vaddr) if link.port == 0
                        else self.state.provider.register_rmb(conn.id, link.port))  # fmt: skip
                conn.port_keys[link.port] = keys
            conn.rmb_keys[link] = keys
        return keys

    def use_link(self, conn: Connection, link: Link) -> None:
        """Make ``link`` the connection's (Linux ``conn->lnk = link``): its QP, WR ids,
        CDC completion queue and the peer RMB's rkey on it, read by the data path."""
        conn.link = link
        conn.qpn = link.qpn
        conn.wr_ids = link.wr_ids
        conn.cdc_pending = self.state.cdc_pending[link.qpn]
        rkey, vaddr = conn.peer_rtoken[link]
        conn.peer_rkey, conn.peer_vaddr = rkey, vaddr + conn.peer_rmbe_offset
        self.rmb_on(conn, link)

    def clear_link(self, link: Link, out: list[Action]) -> None:
        """Forget a link (``smcr_link_clear``): its QP destroyed, its rkeys dropped from
        the connections and the peer RMBs."""
        state = self.state
        lgr = link.lgr
        link.state = LinkState.LINK_INACTIVE
        if link in lgr.links:
            lgr.links.remove(link)
        if state.links.pop(link.qpn, None) is not None and not lgr.terminated:
            state.late_links[link.qpn] = link
            while len(state.late_links) > LATE_LINKS:
                del state.late_links[next(iter(state.late_links))]
        state.cdc_pending.pop(link.qpn, None)
        for conn in lgr.conns.values():
            conn.rmb_keys.pop(link, None)
        lgr.rtokens_forget_link(link)
        out.append(DestroyQp(link.qpn, **link.names))

    def link_gone(self, link: Link, out: list[Action], reason: str = "") -> None:
        """``smcr_link_clear`` of a link that was up, and the group's new type."""
        lgr = link.lgr
        self.clear_link(link, out)
        if sum(1 for x in lgr.links if x.state is LinkState.LINK_ACTIVE) == 1:
            lgr.lgr_type = LgrType.SINGLE
        self.state.events.append(LinkRemoved(lgr_id=lgr.lgr_id, link_id=link.link_id,
                                             port=link.port, reason=reason))  # fmt: skip

    def other_active(self, link: Link, dev_err: bool = False) -> Link | None:
        """Another active link of the group; with ``dev_err`` not one over the same port
        (``smc_switch_conns``' ``is_dev_err``)."""
        for other in link.lgr.links:
            if (other is not link and other.state is LinkState.LINK_ACTIVE
                    and not (dev_err and other.port == link.port)):  # fmt: skip
                return other
        return None

    def switch_conns(self, from_link: Link, out: list[Action],
                     dev_err: bool = False) -> Link | None:  # fmt: skip
        """``smc_switch_conns``: move every connection of ``from_link`` to another active
        link of its group; that link, or None if there is none."""
        to = self.other_active(from_link, dev_err)
        if to is None:
            return None
        old = self.state.cdc_pending.get(from_link.qpn, ())
        for conn in list(from_link.lgr.conns.values()):
            if conn.link is not from_link:
                continue
            # CDCs complete in order and each one sent counted one sequence number: the
            # last completed one is the current one less those still pending
            unfinished = sum(1 for entry in old if entry[1] is conn)
            seq_fin = (conn.seq - unfinished) & 0xFFFF
            self.state.touched.add(conn.id)
            if to not in conn.peer_rtoken:  # the peer never gave this RMB's rkey for it
                reason = "failover: no rkey of the peer's RMB on the other link"
                conn.link_down(reason, out)
                self.state.events.append(ConnectionReset(conn=conn.id, reason=reason))
                continue
            self.use_link(conn, to)
            conn.switch_cursor(seq_fin, out)
        return to
