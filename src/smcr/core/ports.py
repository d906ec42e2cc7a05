"""The host's RNIC ports going down and coming back (Linux ``smcr_port_err`` /
``smcr_port_add``, called from ``smc_ib_port_event_work``).

A port that goes down takes its links with it: each fails as a link does
(:meth:`~smcr.core.failover.Failover.link_failed`: its connections move to
a link over another port, DELETE LINK tells the peer; a group with no such link
ends), and no new link is made over it.  A port usable again is offered to
every link group that could take a link over it: a server starts its ADD LINK
flow, a client asks the server for one (its ADD LINK invitation, v1; REQUEST
ADD LINK, v2), as Linux does for groups that are neither ``SYMMETRIC`` nor
``ASYMMETRIC_PEER`` and, when ``SINGLE``, may hold more than one link.
"""

from __future__ import annotations

from smcr.core.addlink import AddLinkFlows
from smcr.core.events import Action
from smcr.core.failover import Failover
from smcr.core.linkgroup import LgrType, Role
from smcr.core.state import EngineState


class Ports:
    """The host's port events (module docstring): a part of the engine, over its shared
    state, the ADD LINK part (a port back) and failover (a port down)."""

    def __init__(self, state: EngineState, addlink: AddLinkFlows, failover: Failover) -> None:
        self.state = state
        self.addlink = addlink
        self.failover = failover

    def port_down(self, port: int, reason: str, now: float) -> list[Action]:
        """Our ``port`` (an index into :attr:`LocalIdentity.ports`) is unusable (its net
        device down or without address, the RNIC gone): every link over it fails, and
        no link is added over it until :meth:`port_up`."""
        links = self.state.links
        self.state.ports_down.add(port)
        out: list[Action] = []
        for link in [x for x in links.values() if x.port == port]:
            if links.get(link.qpn) is link and not link.lgr.terminated:
                out += self.failover.link_failed(link.qpn, f"port {port} down: {reason}", now)
        return out

    def port_up(self, port: int, now: float) -> list[Action]:
        """Our ``port`` is usable (again): each link group that can use it gets a link
        over it (``smcr_port_add``), with :attr:`Config.add_links`."""
        self.state.ports_down.discard(port)
        out: list[Action] = []
        if not self.state.config.add_links:
            return out
        for lgr in list(self.state.lgrs.values()):
            if (lgr.terminated or lgr.active_link is None
                    or lgr.lgr_type in (LgrType.SYMMETRIC, LgrType.ASYMMETRIC_PEER)
                    or (lgr.lgr_type is LgrType.SINGLE and lgr.max_links <= 1)):  # fmt: skip
                continue
            if lgr.role is Role.SERVER:
                self.addlink.srv_add_link(lgr, now, out)
            else:
                self.addlink.cli_invite(lgr, now, out)
        return out
