"""CLC Decline / peer diagnosis codes, as Linux ``net/smc/smc_clc.h`` defines them.

The code travels in a CLC Decline (bytes 16-19) and is what ``smcss`` prints as
the fallback reason (``<local>/<remote>``).  Values are those of current Linux
(spec digest §2.6); old Linux 4.14 used some other values, which
:func:`describe` still names so that a capture from an old peer decodes.
"""

from __future__ import annotations

import enum


class DeclineCode(enum.IntEnum):
    """A Linux SMC decline/diagnosis code (``SMC_CLC_DECL_*``)."""

    description: str

    def __new__(cls, value: int, description: str) -> DeclineCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    MEM = 0x01010000, "insufficient memory resources"
    TIMEOUT_CL = 0x02010000, "timeout waiting for CONFIRM LINK"
    TIMEOUT_AL = 0x02020000, "timeout waiting for ADD LINK"
    CNFERR = 0x03000000, "configuration error"
    PEERNOSMC = 0x03010000, "peer did not indicate SMC"
    IPSEC = 0x03020000, "IPsec usage"
    NOSMCDEV = 0x03030000, "no SMC device found (R or D)"
    NOSMCDDEV = 0x03030001, "no SMC-D device found"
    NOSMCRDEV = 0x03030002, "no SMC-R device found"
    NOISM2SUPP = 0x03030003, "hardware has no ISMv2 support"
    NOV2EXT = 0x03030004, "peer sent no CLC v2 extension"
    NOV2DEXT = 0x03030005, "peer sent no CLC SMC-Dv2 extension"
    NOSEID = 0x03030006, "peer sent no SEID"
    NOSMCD2DEV = 0x03030007, "no SMC-Dv2 device found"
    NOUEID = 0x03030008, "peer sent no (matching) UEID"
    RELEASEERR = 0x03030009, "release version negotiation failed"
    MAXCONNERR = 0x0303000A, "max connections negotiation failed"
    MAXLINKERR = 0x0303000B, "max links negotiation failed"
    MODEUNSUPP = 0x03040000, "smc modes do not match (R or D)"
    RMBE_EC = 0x03050000, "peer has eyecatcher in RMBE"
    OPTUNSUPP = 0x03060000, "fastopen sockopt not supported"
    DIFFPREFIX = 0x03070000, "IP prefix / subnet mismatch"
    GETVLANERR = 0x03080000, "err to get vlan id of ip device"
    ISMVLANERR = 0x03090000, "err to reg vlan id on ism dev"
    NOACTLINK = 0x030A0000, "no active smc-r link in lgr"
    NOSRVLINK = 0x030B0000, "SMC-R link from srv not found"
    VERSMISMAT = 0x030C0000, "SMC version mismatch"
    MAX_DMB = 0x030D0000, "SMC-D DMB limit exceeded"
    NOROUTE = 0x030E0000, "SMC-Rv2 conn. no route to peer"
    NOINDIRECT = 0x030F0000, "SMC-Rv2 conn. indirect mismatch"
    SYNCERR = 0x04000000, "synchronization error"
    PEERDECL = 0x05000000, "peer declined during handshake"
    INTERR = 0x09990000, "internal error"
    ERR_RTOK = 0x09990001, "rtoken handling failed"
    ERR_RDYLNK = 0x09990002, "ib ready link failed"
    ERR_REGBUF = 0x09990003, "reg rdma buffer failed"


#: Codes that Linux 4.14 used with other values (spec digest §2.6,
#: [DISCREPANCY]); decoders accept them, encoders never send them.
LEGACY_DECLINE_CODES: dict[int, str] = {
    0x02000000: "timeout (Linux 4.14)",
    0x02040000: "timeout waiting for TCP (Linux 4.14)",
    0x03030000: "IPsec usage (Linux 4.14; now NOSMCDEV)",
    0x06000000: "reply to a decline (Linux 4.14)",
    0x07000000: "sending problem (Linux 4.14)",
    0x99990000: "internal error (Linux 4.14)",
}


def describe(code: int) -> str:
    """Name and describe any 32-bit diagnosis code, known or not.

    The form is what ``smcr ss`` and the decline log print:
    ``"0x03010000 PEERNOSMC: peer did not indicate SMC"``.
    """
    known = lookup(code)
    if known is not None:
        return f"0x{code:08x} {known.name}: {known.description}"
    legacy = LEGACY_DECLINE_CODES.get(code)
    if legacy is not None:
        return f"0x{code:08x} {legacy}"
    return f"0x{code:08x} unknown"


def lookup(code: int) -> DeclineCode | None:
    """The :class:`DeclineCode` with this value, or ``None`` for an unknown code."""
    return _BY_VALUE.get(code)


_BY_VALUE: dict[int, DeclineCode] = {member.value: member for member in DeclineCode}
