"""The link group's table of peer RMBs (``smc_rtoken_*``) and its index by (link, rkey)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from smcr.core.linkgroup import Link, LinkGroup, Role, Rtoken

_OPS = st.lists(st.tuples(st.sampled_from(["add", "set", "delete", "forget"]),
                          st.integers(0, 2), st.integers(1, 6), st.integers(0, 3)),
                max_size=60)  # fmt: skip


def _model_find(rts: list[Rtoken], link: Link, rkey: int) -> Rtoken | None:
    """The walk the index stands for: the first RMB whose key on ``link`` is ``rkey``."""
    for rt in rts:
        got = rt.get(link)
        if got is not None and got[0] == rkey:
            return rt
    return None


@given(_OPS)
def test_the_index_finds_what_a_walk_of_the_table_finds(
        ops: list[tuple[str, int, int, int]]) -> None:  # fmt: skip
    """Any sequence of adds, keys set on other links, deletes and links gone: every
    (link, rkey) finds by the index the RMB a walk of the table finds, and the index
    holds nothing else."""
    lgr = LinkGroup(lgr_id=1, role=Role.SERVER, peer_id=bytes(8))
    links = [Link(qpn=100 + i, psn=0, lgr=lgr, link_id=i + 1) for i in range(3)]
    for op, li, rkey, pick in ops:
        link = links[li]
        if op == "add":
            lgr.rtoken_add(link, rkey, rkey * 0x1000)
        elif op == "set" and lgr.peer_rtokens:  # (a new key on a link, as CONFIRM RKEY)
            rt = lgr.peer_rtokens[pick % len(lgr.peer_rtokens)]
            if _model_find(lgr.peer_rtokens, link, rkey) in (None, rt):
                lgr.rtoken_set(rt, link, rkey, rkey * 0x2000)
        elif op == "delete":
            known = _model_find(lgr.peer_rtokens, link, rkey) is not None
            assert lgr.rtoken_delete(link, rkey) is known
        elif op == "forget":
            lgr.rtokens_forget_link(link)
        for x in links:
            for k in range(1, 7):
                assert lgr.rtoken_find(x, k) is _model_find(lgr.peer_rtokens, x, k), (x, k)
        assert all(rt in lgr.peer_rtokens and rt.get(x, (None,))[0] == k
                   for (x, k), rt in lgr.rtoken_index.items())  # fmt: skip


def test_a_deleted_rmb_is_found_by_none_of_its_keys() -> None:
    lgr = LinkGroup(lgr_id=1, role=Role.CLIENT, peer_id=bytes(8))
    a, b = (Link(qpn=7 + i, psn=0, lgr=lgr, link_id=i + 1) for i in range(2))
    rt = lgr.rtoken_add(a, 0x11, 0x1000)
    lgr.rtoken_set(rt, b, 0x22, 0x2000)
    assert lgr.rtoken_add(a, 0x11, 0x9999) is rt  # (known: the one already there)
    assert lgr.rtoken_find(b, 0x22) is rt and lgr.rtoken_find(b, 0x11) is None
    assert lgr.rtoken_delete(b, 0x22)
    assert lgr.rtoken_find(a, 0x11) is None and not lgr.rtoken_index and not lgr.peer_rtokens
    assert not lgr.rtoken_delete(a, 0x11)
