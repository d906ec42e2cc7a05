"""The host's RNIC ports going down and coming back (Linux ``smcr_port_err`` /
``smcr_port_add``, called from ``smc_ib_port_event_work``).

A port that goes down takes its links with it: each fails as a link does
(:meth:`~smcr.core.failover.FailoverLayer.link_failed`: its connections move to
a link over another port, DELETE LINK tells the peer; a group with no such link
ends), and no new link is made over it.  A port usable again is offered to
every link group that could take a link over it: a server starts its ADD LINK
flow, a client asks the server for one (its ADD LINK invitation, v1; REQUEST
ADD LINK, v2), as Linux does for groups that are neither ``SYMMETRIC`` nor
``ASYMMETRIC_PEER`` and, when ``SINGLE``, may hold more than one link.
"""

from __future__ import annotations

from smcr.core.events import Action
from smcr.core.failover import FailoverLayer
from smcr.core.linkgroup import LgrType, Role


class PortLayer(FailoverLayer):
    """:class:`FailoverLayer` with the host's port events (module docstring)."""

    def port_down(self, port: int, reason: str, now: float) -> list[Action]:
        """Our ``port`` (an index into :attr:`LocalIdentity.ports`) is unusable (its net
        device down or without address, the RNIC gone): every link over it fails, and
        no link is added over it until :meth:`port_up`."""
        self.ports_down.add(port)
        out: list[Action] = []
        for link in [x for x in self.links.values() if x.port == port]:
            if self.links.get(link.qpn) is link and not link.lgr.terminated:
                out += self.link_failed(link.qpn, f"port {port} down: {reason}", now)
        return out

    def port_up(self, port: int, now: float) -> list[Action]:
        """Our ``port`` is usable (again): each link group that can use it gets a link
        over it (``smcr_port_add``), with :attr:`Config.add_links`."""
        self.ports_down.discard(port)
        out: list[Action] = []
        if not self.config.add_links:
            return out
        for lgr in list(self.lgrs.values()):
            if (lgr.terminated or lgr.active_link is None
                    or lgr.lgr_type in (LgrType.SYMMETRIC, LgrType.ASYMMETRIC_PEER)
                    or (lgr.lgr_type is LgrType.SINGLE and lgr.max_links <= 1)):  # fmt: skip
                continue
            if lgr.role is Role.SERVER:
                self._srv_add_link(lgr, now, out)
            else:
                self._cli_invite(lgr, now, out)
        return out
