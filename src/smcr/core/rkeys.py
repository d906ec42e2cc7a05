"""The rkeys of our RMBs, as the peer holds them (Linux ``smcr_lgr_reg_rmbs``,
``smc_llc_do_delete_rkey``, ``smcr_buf_unuse``).

A connection in a group that exists already announces its RMB to the peer with
CONFIRM RKEY (every active link's rkey of it), not waited for: the CLC message that
names the RMB goes at once (:meth:`Rkeys.confirm_rkey`).  A released connection's RMB
is either taken back (DELETE RKEY, then :class:`~smcr.core.events.ReuseRmb`) or, when
the peer ended its stream in order on a group of one link, kept announced for the
group's next connection, which then needs no CONFIRM RKEY (:meth:`Rkeys.release`,
:meth:`Rkeys.peer_holds_rmb`).  What the peer holds stays bounded by the group's room
for connections.
"""

from __future__ import annotations

from smcr.core import llc_msgs
from smcr.core.connection import Connection, Rmb
from smcr.core.events import Action, ReuseRmb
from smcr.core.linkgroup import Link, LinkGroup, LinkState
from smcr.core.llc import LinkLayer
from smcr.core.state import EngineState
from smcr.wire.llc import LlcMessage

IDLE_RMBS_MAX = 16
"""RMBs of released connections a link group keeps announced to the peer (no DELETE
RKEY) for its next connections (:meth:`Rkeys.release`)."""
UNCONFIRMED_RKEY = "the peer did not confirm the RMB's rkey (CONFIRM RKEY)"


class Rkeys:
    """Our RMBs' rkeys with the peer (module docstring): a part of the engine, over its
    shared state and link layer (whose local flows carry the requests)."""

    def __init__(self, state: EngineState, llc: LinkLayer) -> None:
        self.state = state
        self.llc = llc

    def confirm_rkey(self, lgr: LinkGroup, conn: Connection, rmb: Rmb, now: float,
                     out: list[Action]) -> None:  # fmt: skip
        """CONFIRM RKEY for a connection's RMB in a reused link group (``smcr_lgr_reg_rmbs``),
        not waited for.

        Linux sends its CLC Accept or Confirm only after the response; here the CLC
        message goes at once: on a link group of one link the peer writes with the
        rkey the CLC message itself carries, and the response adds nothing the
        connection needs (a Linux peer runs our rkey flow beside its own, as it
        lets CONFIRM RKEY flows of both sides run at once).  That saves an LLC
        round trip per side on every connection set-up.  A refusal (the peer's
        rkey table full, or no answer) kills the connection: an abort CDC, and
        ``ECONNRESET`` here; where Linux would decline ``ERR_RTOK`` or ``ERR_REGBUF``,
        the CLC message that makes a Decline impossible is out already.  Not once
        the peer has ended its stream in order (:attr:`Connection.peer_finished
        <smcr.core.connection.Connection.peer_finished>`): it needs the rkey no more,
        and its last bytes may still wait in the RMB for the application (a flow
        queued behind other flows and slow data can end after the peer's whole
        stream, and a peer process that then exits leaves it unanswered).
        """
        send_link = lgr.active_link
        if send_link is None:  # the group's end declines or resets the connection itself
            return
        state = self.state

        def build(link: Link) -> LlcMessage:  # the links active when the flow starts
            keys = {x: self.llc.rmb_on(conn, x) for x in lgr.links
                    if x.state is LinkState.LINK_ACTIVE}  # fmt: skip
            return llc_msgs.confirm_rkey(link, keys)

        def done(ok: bool, t: float) -> list[Action]:
            actions: list[Action] = []
            if ok or lgr.terminated or state.conns.get(conn.id) is not conn:
                return actions  # (a group's end resets or declines its connections itself)
            if conn.peer_finished:  # it writes into this RMB no more: what it wrote is read
                return actions  # to EOF, where an abort would throw it away
            if conn.id in state.handshakes:  # a server still waiting for the Confirm: the
                state.unconfirmed.add(conn.id)  # client is past Declines; abort when done
            else:
                self.llc.abort(conn, UNCONFIRMED_RKEY, actions)
                state.touched.add(conn.id)
            return actions

        self.llc.start_flow(lgr, build(send_link), done, now, out, build)

    def peer_holds_rmb(self, link: Link, conn: Connection, now: float,
                       out: list[Action]) -> bool:  # fmt: skip
        """Whether the peer holds the rkey of ``conn``'s RMB already: an RMB of an
        earlier connection of this group, kept announced at its release
        (:meth:`release`), on the group's one link, ``link``, which ``conn`` uses.  Then no
        CONFIRM RKEY is due, as Linux skipped it for a reused RMB before its
        multi-link rework (``rmb_desc->reused``); the CLC message names the RMB
        anyway, and the peer finds its rkey in its table (``smc_rtoken_add``).

        Also keeps what the peers hold bounded: an idle RMB now used in another
        group is taken back from the peer that holds it (DELETE RKEY), and idle
        ones beyond the group's room for connections too, so that the peer's
        table (255 rkeys in Linux) holds no more than the connections it allows.
        """
        lgr, rkey = link.lgr, conn.rmb.rkey
        for other in self.state.lgrs.values():
            if other is not lgr and rkey in other.idle_rmbs:
                self._forget_idle_rmb(other, rkey, now, out)
        if lgr.idle_rmbs.pop(rkey, None) is link and lgr.links == [link]:
            return True
        while lgr.idle_rmbs and len(lgr.conns) + len(lgr.idle_rmbs) > lgr.max_conns:
            self._forget_idle_rmb(lgr, next(iter(lgr.idle_rmbs)), now, out)
        return False

    def _forget_idle_rmb(self, lgr: LinkGroup, rkey: int, now: float,
                         out: list[Action]) -> None:  # fmt: skip
        """Take a kept RMB's rkey back from the peer (DELETE RKEY, not waited for: no
        connection of the group uses the RMB, nothing of the peer's is to come)."""
        del lgr.idle_rmbs[rkey]
        if not lgr.terminated and lgr.active_link is not None:
            request = llc_msgs.delete_rkey(lgr, rkey)
            self.llc.start_flow(lgr, request, lambda ok, t: [], now, out,
                                lambda link: llc_msgs.delete_rkey(lgr, rkey))  # fmt: skip

    def release(self, conn: int, now: float) -> list[Action]:
        """Forget a CLOSED, released connection; keep its RMB announced to the peer for
        the group's next connection, or announce its end (DELETE RKEY).

        Kept (:meth:`_keep_rmb`) when the peer has ended its stream in order: its last
        write came before that CDC on the group's one link (RC ordering), so nothing of
        it can land in the RMB any more, which is reusable at once (:class:`ReuseRmb`)
        and needs no CONFIRM RKEY when the group's next connection gets it again
        (:meth:`peer_holds_rmb`).  That saves two LLC round trips per connection.
        Otherwise DELETE RKEY: :class:`ReuseRmb` follows when the peer has answered
        (or the flow ended otherwise: no answer, the link gone), at once if there is no
        link to ask.
        """
        out: list[Action] = []
        c = self.state.conns.pop(conn, None)
        if c is None:
            return out
        reuse: list[Action] = [ReuseRmb(conn)]
        for lgr in list(self.state.lgrs.values()):
            if lgr.conns.get(c.token) is c:
                del lgr.conns[c.token]
                if not lgr.conns:
                    lgr.idle_since = now
                if self._keep_rmb(lgr, c):
                    lgr.idle_rmbs[c.rmb.rkey] = lgr.links[0]  # (c's link: the group's only)
                    break
                if not lgr.terminated and lgr.active_link is not None:
                    def build(link: Link, lgr: LinkGroup = lgr) -> LlcMessage:
                        # the RMB's rkey on the link the request goes over, as Linux
                        # smc_llc_send_delete_rkey (the peer looks it up on that link)
                        rkey = c.rmb_keys.get(link, (c.rmb.rkey, 0))[0]
                        return llc_msgs.delete_rkey(lgr, rkey)

                    request = build(lgr.active_link)
                    self.llc.start_flow(lgr, request, lambda ok, t: reuse, now, out, build)
                    return out
        out += reuse
        return out

    @staticmethod
    def _keep_rmb(lgr: LinkGroup, c: Connection) -> bool:
        """Whether a released connection's RMB stays announced to the peer (:meth:`release`):
        the peer ended in order (done writing or closed, no abort, no reset), the group
        has one link, the connection's, over port 0 (the RMB's own rkey, not one the
        host registered for another port and drops with the buffers), and the group
        keeps fewer than :data:`IDLE_RMBS_MAX` and within its room for connections."""
        link = lgr.links[0] if len(lgr.links) == 1 else None
        return (not lgr.terminated and link is not None and c.link is link
                and link.state is LinkState.LINK_ACTIVE and link.port == 0
                and c.peer_finished and not c.aborted
                and c.rmb_keys.get(link) == (c.rmb.rkey, c.rmb.vaddr)
                and len(lgr.idle_rmbs) < IDLE_RMBS_MAX
                and len(lgr.conns) + len(lgr.idle_rmbs) < lgr.max_conns)  # fmt: skip
