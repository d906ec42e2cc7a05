"""The one error type of the wire layer.

Every decoder in :mod:`smcr.wire` raises :class:`WireError` and nothing else
for bad input (the fuzz tests hold it to that).  Where Linux ``net/smc`` would
answer the same fault with a CLC Decline, the error carries that
:class:`~smcr.wire.decline.DeclineCode`, so the layers above can decline with
the code Linux would use, without a second table of their own.
"""

from __future__ import annotations

from smcr.wire.decline import DeclineCode


class WireError(ValueError):
    """Bytes that are not a valid message of the kind asked for.

    :param reason: what is wrong, in words, naming the field and offset.
    :param code: the Linux decline/diagnosis code for this fault, where Linux
        answers it with a Decline (for example ``DeclineCode.MODEUNSUPP`` for
        an SMC-D Accept to an SMC-R client); ``None`` where Linux drops the
        message, ends the link, or (for a malformed CLC message, which
        ``smc_clc_wait_msg`` turns into ``-EPROTO``) aborts without a Decline.
    """

    def __init__(self, reason: str, code: DeclineCode | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code

    def __str__(self) -> str:
        if self.code is None:
            return self.reason
        return f"{self.reason} [{self.code.name} 0x{self.code.value:08x}]"
