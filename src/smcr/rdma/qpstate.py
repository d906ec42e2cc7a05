"""The RC QP state machine as data: legal transitions and their attribute masks.

Design: the table is the kernel's ``qp_state_table`` (``ib_modify_qp_is_ok``) for
RC, as digested in ``shared/spec/rocev2.md`` §7.2, kept as a module constant in
the h11 manner so a test can walk every (state, state) pair against it.  A
provider calls :func:`check_modify` before it touches anything, which gives every
provider the same refusals (EINVAL, like ``ibv_modify_qp``) for free.
"""

from __future__ import annotations

import errno

from smcr.rdma.verbs import (
    GID_LEN,
    PSN_MASK,
    QPN_MASK,
    AccessFlag,
    AhAttr,
    PathMtu,
    QpAttr,
    QpAttrMask,
    QpState,
    VerbsError,
)

M = QpAttrMask

#: (current, next) -> (required mask bits, optional mask bits), spec §7.2.
#: Any state may go to RESET or ERR with STATE alone (added by :func:`transition_masks`).
TRANSITIONS: dict[tuple[QpState, QpState], tuple[QpAttrMask, QpAttrMask]] = {
    (QpState.RESET, QpState.RESET): (M.STATE, M(0)),
    (QpState.RESET, QpState.INIT): (
        M.STATE | M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS,
        M(0),
    ),
    (QpState.INIT, QpState.INIT): (
        M.STATE,
        M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS,
    ),
    (QpState.INIT, QpState.RTR): (
        M.STATE
        | M.AV
        | M.PATH_MTU
        | M.DEST_QPN
        | M.RQ_PSN
        | M.MAX_DEST_RD_ATOMIC
        | M.MIN_RNR_TIMER,
        M.ALT_PATH | M.ACCESS_FLAGS | M.PKEY_INDEX,
    ),
    (QpState.RTR, QpState.RTS): (
        M.STATE | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY | M.SQ_PSN | M.MAX_QP_RD_ATOMIC,
        M.CUR_STATE | M.ALT_PATH | M.ACCESS_FLAGS | M.MIN_RNR_TIMER | M.PATH_MIG_STATE,
    ),
    (QpState.RTS, QpState.RTS): (
        M.STATE,
        M.CUR_STATE | M.ACCESS_FLAGS | M.ALT_PATH | M.PATH_MIG_STATE | M.MIN_RNR_TIMER,
    ),
}


def rc_bring_up(
    *,
    dgid: bytes,
    dest_qp_num: int,
    rq_psn: int,
    sq_psn: int,
    access: AccessFlag,
    path_mtu: PathMtu = PathMtu.MTU_1024,
    timeout: int = 15,
    retry_cnt: int = 7,
    rnr_retry: int = 7,
    min_rnr_timer: int = 5,
    max_rd_atomic: int = 1,
    hop_limit: int = 1,
    dmac: bytes = bytes(6),
) -> list[tuple[QpAttr, QpAttrMask]]:
    """The three modifies RESET->INIT->RTR->RTS with exactly the masks of §7.2.

    ``hop_limit`` and ``dmac`` go into the address vector: 1 and the peer's MAC on one
    subnet; Linux SMC-Rv2 gives 64 and the next hop's MAC for a peer behind a router
    (``smc_ib_modify_qp_rtr``).

    Defaults are the Linux SMC-R ones (smc-r.md §8: timeout 15, retry 7, rnr
    retry 7 = infinite, min_rnr_timer 5, one outstanding READ each way), so the
    core and the tests bring a QP up the way Linux does; pyverbs' ``to_rts``
    plays the same role.
    """
    return [
        (QpAttr(qp_state=QpState.INIT, qp_access_flags=access),
         M.STATE | M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS),
        (QpAttr(qp_state=QpState.RTR, ah_attr=AhAttr(dgid=dgid, hop_limit=hop_limit, dmac=dmac),
                path_mtu=path_mtu,
                dest_qp_num=dest_qp_num, rq_psn=rq_psn, max_dest_rd_atomic=max_rd_atomic,
                min_rnr_timer=min_rnr_timer),
         M.STATE | M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN | M.MAX_DEST_RD_ATOMIC
         | M.MIN_RNR_TIMER),
        (QpAttr(qp_state=QpState.RTS, timeout=timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry,
                sq_psn=sq_psn, max_rd_atomic=max_rd_atomic),
         M.STATE | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY | M.SQ_PSN | M.MAX_QP_RD_ATOMIC),
    ]  # fmt: skip


def transition_masks(cur: QpState, new: QpState) -> tuple[QpAttrMask, QpAttrMask] | None:
    """The (required, optional) masks of ``cur -> new``, or ``None`` if it is illegal.

    SQD and SQE are not offered (SMC-R never drains a send queue), so transitions
    into them are illegal here even though IB defines them.
    """
    if new in (QpState.RESET, QpState.ERR):
        return (M.STATE, M(0))
    return TRANSITIONS.get((cur, new))


def check_modify(cur: QpState, attr: QpAttr, mask: QpAttrMask, max_mtu: PathMtu) -> QpState:
    """Validate a modify request the way ``ib_modify_qp_is_ok`` and rxe do.

    :param cur: the QP's current state.
    :param attr: the requested attributes.
    :param mask: which fields of ``attr`` the caller sets.
    :param max_mtu: the device's active MTU; a larger path MTU is refused.
    :returns: the state the QP will be in.
    :raises VerbsError: EINVAL for an illegal transition, a missing or extra
        mask bit, or an out-of-range value.
    """
    new = attr.qp_state if mask & M.STATE else cur
    if mask & M.CUR_STATE and attr.cur_qp_state != cur:
        raise VerbsError(errno.EINVAL, f"cur_qp_state {attr.cur_qp_state.name} is not {cur.name}")
    masks = transition_masks(cur, new)
    if masks is None:
        raise VerbsError(errno.EINVAL, f"illegal QP transition {cur.name} -> {new.name}")
    required, optional = masks
    if missing := required & ~mask:
        raise VerbsError(errno.EINVAL, f"{cur.name}->{new.name} needs {missing!r}")
    if extra := mask & ~(required | optional):
        raise VerbsError(errno.EINVAL, f"{cur.name}->{new.name} does not take {extra!r}")
    _check_values(attr, mask, max_mtu)
    return new


def _check_values(attr: QpAttr, mask: QpAttrMask, max_mtu: PathMtu) -> None:
    """Range checks of the attributes a mask sets (widths from spec §7.3)."""
    limits: tuple[tuple[QpAttrMask, str, int, int], ...] = (
        (M.TIMEOUT, "timeout", attr.timeout, 31),
        (M.RETRY_CNT, "retry_cnt", attr.retry_cnt, 7),
        (M.RNR_RETRY, "rnr_retry", attr.rnr_retry, 7),
        (M.MIN_RNR_TIMER, "min_rnr_timer", attr.min_rnr_timer, 31),
        (M.DEST_QPN, "dest_qp_num", attr.dest_qp_num, QPN_MASK),
        (M.RQ_PSN, "rq_psn", attr.rq_psn, PSN_MASK),
        (M.SQ_PSN, "sq_psn", attr.sq_psn, PSN_MASK),
        (M.MAX_QP_RD_ATOMIC, "max_rd_atomic", attr.max_rd_atomic, 128),
        (M.MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic", attr.max_dest_rd_atomic, 128),
        (M.PKEY_INDEX, "pkey_index", attr.pkey_index, 0),
    )
    for bit, name, value, top in limits:
        if mask & bit and not 0 <= value <= top:
            raise VerbsError(errno.EINVAL, f"{name}={value} outside 0..{top}")
    if mask & M.PORT and attr.port_num != 1:
        raise VerbsError(errno.EINVAL, f"port_num={attr.port_num}: the device has port 1 only")
    if mask & M.PATH_MTU and attr.path_mtu > max_mtu:
        raise VerbsError(errno.EINVAL, f"path_mtu {attr.path_mtu.name} above {max_mtu.name}")
    if mask & M.AV:
        if len(attr.ah_attr.dgid) != GID_LEN:
            raise VerbsError(errno.EINVAL, "a GID has 16 bytes")
        if not attr.ah_attr.is_global:
            raise VerbsError(errno.EINVAL, "RoCE address vectors must be global (GRH)")
