"""The connection close state machine, as data (Linux ``smc_close.c``, spec §6).

States carry the Linux names (``enum smc_state``) and, as values, the words
``smcss`` prints.  Inputs are ``APP_*`` (the application), ``PEER_*`` (a CDC's
connection state flags) and ``LINK_DOWN``.  Where Linux branches inside a
``case`` (``smc_cdc_rxed_any_close``, ``SOCK_DEAD``), the connection picks the
input variant (``APP_CLOSE_PEER_CLOSED``, ``PEER_CLOSED_RELEASED``...), so each
table entry is one fact: ``(state, input) -> (what to send, next state)``.  A
missing key means "nothing happens", as a ``switch`` without a case.
"""

from __future__ import annotations

import enum
from typing import Final


class SmcState(enum.Enum):
    """Linux ``enum smc_state``; the value is what ``smcss`` prints."""

    # (an identity hash: Enum's own hashes the name in Python, and the engine's tables
    # are keyed by members several times per connection)
    __hash__ = object.__hash__

    INIT = "INIT"
    ACTIVE = "ACTIVE"
    PEERCLOSEWAIT1 = "PEERCLW1"
    PEERCLOSEWAIT2 = "PEERCLW2"
    APPCLOSEWAIT1 = "APPLCLW1"
    APPCLOSEWAIT2 = "APPLCLW2"
    APPFINCLOSEWAIT = "APPLFINCLW"
    PEERFINCLOSEWAIT = "PEERFINCLW"
    PEERABORTWAIT = "PEERABORTW"
    PROCESSABORT = "PROCESSABORT"
    CLOSED = "CLOSED"


class CloseInput(enum.Enum):
    """What drives the close machine."""

    # (an identity hash: Enum's own hashes the name in Python, and the engine's tables
    # are keyed by members several times per connection)
    __hash__ = object.__hash__

    APP_SHUT_WR = enum.auto()
    APP_CLOSE = enum.auto()
    APP_CLOSE_PEER_CLOSED = enum.auto()  # close() after the peer sent closed/abort
    PEER_DONE_WRITING = enum.auto()
    PEER_CLOSED = enum.auto()
    PEER_CLOSED_RELEASED = enum.auto()  # ... while we were already released (SOCK_DEAD)
    PEER_ABORT = enum.auto()
    PEER_ABORT_RELEASED = enum.auto()
    LINK_DOWN = enum.auto()


class Send(enum.Enum):
    """Which connection state flag goes out with the CDC a transition sends."""

    NOTHING = enum.auto()
    DONE_WRITING = enum.auto()  # 0x80
    CLOSE = enum.auto()  # 0x40, or 0x20 when unread data remains (smc_close_final)
    ABORT = enum.auto()  # 0x20


S, In, X = SmcState, CloseInput, Send

TRANSITIONS: Final[dict[tuple[SmcState, CloseInput], tuple[Send, SmcState]]] = {
    # smc_close_shutdown_write
    (S.ACTIVE, In.APP_SHUT_WR): (X.DONE_WRITING, S.PEERCLOSEWAIT1),
    (S.APPCLOSEWAIT1, In.APP_SHUT_WR): (X.DONE_WRITING, S.APPCLOSEWAIT2),
    # smc_close_active
    (S.INIT, In.APP_CLOSE): (X.NOTHING, S.CLOSED),
    (S.ACTIVE, In.APP_CLOSE): (X.CLOSE, S.PEERCLOSEWAIT1),
    (S.APPCLOSEWAIT1, In.APP_CLOSE): (X.CLOSE, S.PEERFINCLOSEWAIT),
    (S.APPCLOSEWAIT2, In.APP_CLOSE): (X.CLOSE, S.PEERFINCLOSEWAIT),
    (S.APPCLOSEWAIT1, In.APP_CLOSE_PEER_CLOSED): (X.CLOSE, S.CLOSED),
    (S.APPCLOSEWAIT2, In.APP_CLOSE_PEER_CLOSED): (X.CLOSE, S.CLOSED),
    (S.PEERCLOSEWAIT1, In.APP_CLOSE): (X.CLOSE, S.PEERCLOSEWAIT1),
    (S.PEERCLOSEWAIT2, In.APP_CLOSE): (X.CLOSE, S.PEERCLOSEWAIT2),
    (S.APPFINCLOSEWAIT, In.APP_CLOSE_PEER_CLOSED): (X.CLOSE, S.CLOSED),
    (S.PROCESSABORT, In.APP_CLOSE_PEER_CLOSED): (X.ABORT, S.CLOSED),
    (S.PEERABORTWAIT, In.APP_CLOSE): (X.NOTHING, S.CLOSED),
    # smc_close_passive_work
    (S.INIT, In.PEER_DONE_WRITING): (X.NOTHING, S.APPCLOSEWAIT1),
    (S.INIT, In.PEER_CLOSED): (X.NOTHING, S.APPCLOSEWAIT1),
    (S.ACTIVE, In.PEER_DONE_WRITING): (X.NOTHING, S.APPCLOSEWAIT1),
    (S.ACTIVE, In.PEER_CLOSED): (X.NOTHING, S.APPCLOSEWAIT1),
    (S.PEERCLOSEWAIT1, In.PEER_DONE_WRITING): (X.NOTHING, S.PEERCLOSEWAIT2),
    (S.PEERCLOSEWAIT1, In.PEER_CLOSED): (X.NOTHING, S.APPFINCLOSEWAIT),
    (S.PEERCLOSEWAIT1, In.PEER_CLOSED_RELEASED): (X.NOTHING, S.CLOSED),
    (S.PEERCLOSEWAIT2, In.PEER_CLOSED): (X.NOTHING, S.APPFINCLOSEWAIT),
    (S.PEERCLOSEWAIT2, In.PEER_CLOSED_RELEASED): (X.NOTHING, S.CLOSED),
    (S.PEERFINCLOSEWAIT, In.PEER_CLOSED): (X.NOTHING, S.CLOSED),
    (S.PEERFINCLOSEWAIT, In.PEER_CLOSED_RELEASED): (X.NOTHING, S.CLOSED),
    # smc_close_passive_abort_received
    (S.INIT, In.PEER_ABORT): (X.NOTHING, S.PROCESSABORT),
    (S.ACTIVE, In.PEER_ABORT): (X.NOTHING, S.PROCESSABORT),
    (S.APPCLOSEWAIT1, In.PEER_ABORT): (X.NOTHING, S.PROCESSABORT),
    (S.APPCLOSEWAIT2, In.PEER_ABORT): (X.NOTHING, S.CLOSED),
    (S.APPFINCLOSEWAIT, In.PEER_ABORT): (X.NOTHING, S.CLOSED),
    (S.PEERCLOSEWAIT1, In.PEER_ABORT): (X.NOTHING, S.PROCESSABORT),
    (S.PEERCLOSEWAIT2, In.PEER_ABORT): (X.NOTHING, S.PROCESSABORT),
    (S.PEERCLOSEWAIT1, In.PEER_ABORT_RELEASED): (X.NOTHING, S.CLOSED),
    (S.PEERCLOSEWAIT2, In.PEER_ABORT_RELEASED): (X.NOTHING, S.CLOSED),
    (S.PEERFINCLOSEWAIT, In.PEER_ABORT): (X.NOTHING, S.CLOSED),
    (S.PEERFINCLOSEWAIT, In.PEER_ABORT_RELEASED): (X.NOTHING, S.CLOSED),
    (S.PEERABORTWAIT, In.PEER_ABORT): (X.NOTHING, S.CLOSED),
    (S.PEERABORTWAIT, In.PEER_ABORT_RELEASED): (X.NOTHING, S.CLOSED),
}
# A link that dies takes every connection on it to CLOSED (smc_conn_kill) with
# nothing sent: there is no link left to send on.
for _state in SmcState:
    if _state is not SmcState.CLOSED:
        TRANSITIONS[(_state, CloseInput.LINK_DOWN)] = (Send.NOTHING, SmcState.CLOSED)


def step(state: SmcState, event: CloseInput) -> tuple[Send, SmcState]:
    """One transition; an event with no entry changes nothing and sends nothing."""
    return TRANSITIONS.get((state, event), (Send.NOTHING, state))
