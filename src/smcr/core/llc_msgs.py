"""The LLC messages a link group sends, v1 or v2 as the group is (Linux ``smc_llc.c``).

Why a module: Linux builds every LLC message through ``smc_llc_init_msg_hdr``,
which writes the v2 header (type ``0x20 | t``, 16-bit length) when the link
group is SMC-Rv2 (``lgr->smc_version``) and the v1 header otherwise; the
bodies are the same.  The engine asks here for the message it wants and gets
the class of its group's version, so no flow needs to know the version.

Responses: Linux echoes some requests with only the response flag added
(TEST LINK, DELETE LINK: the header stays the peer's) and rebuilds others
(CONFIRM RKEY, DELETE RKEY, ADD LINK reject, REQUEST ADD LINK response: the
header is rewritten in the group's version); the wire codecs' ``response`` /
``reject`` methods do each the way Linux does, so the handlers call those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from smcr.core.config import Config, LocalIdentity, Port
from smcr.core.connection import Connection
from smcr.core.linkgroup import Link, LinkGroup, LinkState
from smcr.wire.llc import (
    LLC_FLAG_NO_RMBE_EYEC,
    LLC_FLAG_RESP,
    AddLink,
    AddLinkCont,
    AddLinkV2,
    AddLinkV2Ext,
    ConfirmLink,
    ConfirmLinkV2,
    ConfirmRkey,
    ConfirmRkeyV2,
    DeleteLink,
    DeleteLinkV2,
    DeleteRkey,
    DeleteRkeyV2,
    LlcMessage,
    RkeyPair,
    Rtoken,
    TestLink,
    TestLinkV2,
)

_RELEASE_1 = 1


def confirm_link(link: Link, identity: LocalIdentity, config: Config,
                 response: bool = False) -> ConfirmLink:  # fmt: skip
    """CONFIRM LINK request or response on ``link`` (``smc_llc_send_confirm_link``).

    Max links is ``SMC_LINKS_ADD_LNK_MAX`` (:attr:`Config.max_links`); a v2 group
    whose peer speaks v2.1 carries the negotiated max conns and max links instead.
    """
    lgr, port = link.lgr, identity.ports[link.port]
    fields = {
        "flags": LLC_FLAG_NO_RMBE_EYEC | (LLC_FLAG_RESP if response else 0),
        "sender_mac": port.mac, "sender_gid": port.gid, "sender_qp_num": link.qpn,
        "link_num": link.link_id,
        "link_uid": ((lgr.lgr_id + link.link_id) & 0xFFFFFFFF).to_bytes(4, "big"),
        "max_links": config.max_links,
    }  # fmt: skip
    if lgr.version < 2:
        return ConfirmLink(**fields)  # type: ignore[arg-type]
    if lgr.terms is not None and lgr.peer_release >= _RELEASE_1:
        fields |= {"max_links": lgr.terms.max_links, "max_conns": lgr.terms.max_conns}
    return ConfirmLinkV2(**fields)  # type: ignore[arg-type]


def confirm_rkey(send_link: Link, keys: Mapping[Link, tuple[int, int]]) -> ConfirmRkey:
    """CONFIRM RKEY for a new RMB (``smc_llc_send_confirm_rkey``): its rkey on the link
    the message goes over first, then one rtoken per other active link of the group."""
    lgr = send_link.lgr
    cls = ConfirmRkeyV2 if lgr.version >= 2 else ConfirmRkey
    rkey, vaddr = keys[send_link]
    others = tuple(Rtoken(link_id=link.link_id, rmb_key=keys[link][0], rmb_vaddr=keys[link][1])
                   for link in lgr.links
                   if link is not send_link and link.state is LinkState.LINK_ACTIVE
                   and link in keys)  # fmt: skip
    return cls(rmb_key=rkey, rmb_vaddr=vaddr, other_rtokens=others)


def delete_rkey(lgr: LinkGroup, rkey: int) -> LlcMessage:
    """DELETE RKEY for a released RMB (``smc_llc_send_delete_rkey``: one rkey)."""
    if lgr.version >= 2:
        return DeleteRkeyV2.request((rkey,))
    return DeleteRkey(rkeys=(rkey,))


def test_link(lgr: LinkGroup) -> TestLink:
    """TEST LINK request (``smc_llc_send_test_link``)."""
    return TestLinkV2() if lgr.version >= 2 else TestLink()


def delete_link(lgr: LinkGroup, flags: int, reason: int, link_num: int = 0) -> DeleteLink:
    """DELETE LINK request (``smc_llc_send_delete_link``)."""
    cls = DeleteLinkV2 if lgr.version >= 2 else DeleteLink
    return cls(flags=flags, link_num=link_num, reason=reason)


RKEYS_PER_CONT_MSG = 2
"""``SMC_LLC_RKEYS_PER_CONT_MSG``: rkey pairs per ADD LINK CONTINUATION."""


def add_link(new: Link, identity: LocalIdentity, response: bool = False,
             via: Link | None = None, conns: Sequence[Connection] = ()) -> AddLink | AddLinkV2:
    """ADD LINK request or response for the new link (``smc_llc_send_add_link``): the
    new link's port MAC and GID, its QP, id and initial PSN; the MTU is our own in a
    request, min(ours, the peer's) in a response (``new.mtu`` is that then).

    In a v2 group the message carries the extension (``smc_llc_fill_ext_v2``): direct
    unless the group's peer is behind a router (``!lgr->uses_gateway``), the new link's
    GID, and per RMB of ``conns`` its rkey on ``via`` (the link the message goes over),
    its rkey and vaddr on ``new``.
    """
    port = identity.ports[new.port]
    fields = {"flags": LLC_FLAG_RESP if response else 0, "sender_mac": port.mac,
              "sender_gid": port.gid, "sender_qp_num": new.qpn, "link_num": new.link_id,
              "qp_mtu": new.mtu, "initial_psn": new.psn}  # fmt: skip
    if new.lgr.version < 2:
        return AddLink(**fields)  # type: ignore[arg-type]
    assert via is not None
    pairs = tuple(RkeyPair(rmb_key=c.rmb_keys[via][0], rmb_key_new=c.rmb_keys[new][0],
                           rmb_vaddr_new=c.rmb_keys[new][1]) for c in conns)  # fmt: skip
    ext = AddLinkV2Ext(direct=not new.lgr.uses_gateway, client_target_gid=port.gid, rkeys=pairs)
    return AddLinkV2(ext=ext, **fields)  # type: ignore[arg-type]


def add_link_local(lgr: LinkGroup) -> AddLink | AddLinkV2:
    """The empty ADD LINK that stands for a flow of ours (Linux ``smc_llc_add_link_local``
    enqueues one to start the server's ADD LINK flow); never sent."""
    cls = AddLinkV2 if lgr.version >= 2 else AddLink
    return cls(sender_mac=bytes(6), sender_gid=bytes(16))


def add_link_invitation(port: Port) -> AddLink:
    """A client's ADD LINK "invitation" (``smc_llc_add_link_local``): a request carrying
    only the MAC and GID of the port it gained; QPN, link number, MTU and PSN are 0."""
    return AddLink(flags=0, sender_mac=port.mac, sender_gid=port.gid, sender_qp_num=0,
                   link_num=0, qp_mtu=0, initial_psn=0)  # fmt: skip


def add_link_cont(link: Link, new: Link, to_send: list[Connection],
                  response: bool) -> AddLinkCont:  # fmt: skip
    """One ADD LINK CONTINUATION (``smc_llc_add_link_cont``): the count of rkeys this side
    still sends including these, then up to two (rkey on ``link``, rkey and vaddr on
    ``new``), taken off the front of ``to_send``; the client's carries flag 0x80."""
    count = len(to_send)
    pairs = []
    for conn in to_send[:RKEYS_PER_CONT_MSG]:
        rkey_new, vaddr_new = conn.rmb_keys[new]
        pairs.append(RkeyPair(rmb_key=conn.rmb_keys[link][0], rmb_key_new=rkey_new,
                              rmb_vaddr_new=vaddr_new))  # fmt: skip
    del to_send[:RKEYS_PER_CONT_MSG]
    return AddLinkCont(flags=LLC_FLAG_RESP if response else 0, link_num=new.link_id,
                       num_rkeys=count, rkeys=tuple(pairs))  # fmt: skip
