"""The SMC experimental TCP option: how a SYN says "I speak SMC" (spec §1).

Design
------
SMC capability is signalled in the TCP three-way handshake by an RFC 6994
shared experimental option: kind 254 (``TCPOPT_EXP``), length 6, and the 32-bit
ExID ``0xE2D4C3D9`` (EBCDIC "SMCR").  Linux reserves 8 bytes of option space for
it and pads it with two NOPs, so on the wire it reads ``01 01 FE 06 E2 D4 C3 D9``
(``tcp_output.c`` ``smc_options_write``); :func:`build_smc_option` produces that
form or the bare 6 bytes.

:func:`find_smc_option` answers the one question the receiver asks: did this
segment's options carry the SMC option?  It walks the options exactly as Linux
``tcp_parse_options`` does and applies the test of ``smc_parse_options``:

* EOL (kind 0) ends the walk; NOP (kind 1) is one byte and is skipped;
* every other option needs a length byte: a kind in the last byte (no room for
  the length), a length below 2 ("silly option") or a length that runs past the
  end of the options ("partial option") ends the walk *silently*; whatever was
  found before that point still counts (Linux keeps ``smc_ok`` once set);
* kind 254 is the SMC option when the segment has SYN set, its length is even
  and at least 6, and its first 4 value bytes are the magic.  (Linux first tries
  the TCP Fast Open magic ``0xF989`` on the first 2 value bytes; it cannot match
  a value that starts with ``0xE2D4``, so it does not change the answer.)

Decision on malformed blobs: by default we follow Linux, so a truncated or
malformed options blob never raises; the walk just stops, as the kernel's does,
and a Linux peer and we agree on every input.  ``strict=True`` turns each of
those silent stops (and an options area longer than the 40 bytes a TCP header
can hold) into a :class:`~smcr.wire.errors.WireError`, for tools and tests that
want to know that the blob was bad.  In neither mode does anything other than
``WireError`` escape.

The walk is one Python step per option (at most 40 for a real TCP header); this
is control path, once per SYN, not data path.
"""

from __future__ import annotations

import struct

from smcr.wire.errors import WireError

__all__ = [
    "MAX_TCP_OPTION_SPACE",
    "SMC_OPTION",
    "SMC_OPTION_ALIGNED",
    "TCPOLEN_EXP_SMC_BASE",
    "TCPOLEN_EXP_SMC_BASE_ALIGNED",
    "TCPOPT_EOL",
    "TCPOPT_EXP",
    "TCPOPT_NOP",
    "TCPOPT_SMC_MAGIC",
    "build_smc_option",
    "find_smc_option",
    "tcp_header_options",
]

TCPOPT_EOL = 0
"""End of option list (RFC 9293); Linux stops parsing here."""
TCPOPT_NOP = 1
"""No-operation, one byte, used as padding."""
TCPOPT_EXP = 254
"""RFC 6994 shared experimental option kind, used by SMC (spec §1)."""
TCPOPT_SMC_MAGIC = 0xE2D4C3D9
"""The SMC ExID, EBCDIC "SMCR" (Linux ``include/net/tcp.h``)."""
TCPOLEN_EXP_SMC_BASE = 6
"""Length byte of the SMC option: kind + length + 4-byte ExID."""
TCPOLEN_EXP_SMC_BASE_ALIGNED = 8
"""Option space Linux reserves for it: two NOPs + the 6-byte option."""
TCPOPT_FASTOPEN_MAGIC = 0xF989
"""TCP Fast Open's 16-bit ExID, which shares kind 254 (Linux tries it first)."""
MAX_TCP_OPTION_SPACE = 40
"""A TCP header is at most 60 bytes, 20 of them fixed."""

_SMC_OPTION = struct.Struct(">BBI")
_BE32 = struct.Struct(">I")
_TCP_DATA_OFFSET_BYTE = 12
_TCP_MIN_HEADER = 20

SMC_OPTION: bytes = _SMC_OPTION.pack(TCPOPT_EXP, TCPOLEN_EXP_SMC_BASE, TCPOPT_SMC_MAGIC)
"""The bare 6-byte option ``FE 06 E2 D4 C3 D9``."""
SMC_OPTION_ALIGNED: bytes = bytes((TCPOPT_NOP, TCPOPT_NOP)) + SMC_OPTION
"""Linux's on-wire form ``01 01 FE 06 E2 D4 C3 D9`` (spec §1, §9a)."""


def build_smc_option(aligned: bool = True) -> bytes:
    """Return the SMC TCP option bytes to put into a SYN or SYN-ACK.

    Mirrors Linux ``smc_options_write``, which always writes the NOP-padded,
    4-byte aligned form (spec §1).

    :param aligned: ``True`` (default) for Linux's 8-byte form
        ``01 01 FE 06 E2 D4 C3 D9``; ``False`` for the bare 6-byte option.
    :returns: the option bytes.
    """
    return SMC_OPTION_ALIGNED if aligned else SMC_OPTION


def _stop(found: bool, strict: bool, reason: str) -> bool:
    """End the walk at a malformed option.

    Linux ``tcp_parse_options`` returns silently and keeps what it found so
    far; in strict mode the fault is raised instead, found or not.
    """
    if strict:
        raise WireError(reason)
    return found


def find_smc_option(
    options: bytes | bytearray | memoryview,
    *,
    syn: bool = True,
    strict: bool = False,
) -> bool:
    """Say whether a TCP options area carries the SMC option (spec §1).

    Walks the options like Linux ``tcp_input.c`` ``tcp_parse_options`` and tests
    kind 254 like ``smc_parse_options``: SYN set, length even and >= 6, first 4
    value bytes equal to :data:`TCPOPT_SMC_MAGIC`.  See the module comment for
    the walking rules and for what happens on a malformed blob.

    :param options: the bytes after the 20-byte fixed TCP header, up to the
        data offset (see :func:`tcp_header_options`).
    :param syn: whether the segment has SYN set; Linux looks for the option only
        on SYN and SYN-ACK segments, so with ``False`` the answer is ``False``.
    :param strict: raise :class:`WireError` where Linux would stop the walk
        silently (kind without room for a length byte, length < 2, length past
        the end) and on an options area longer than 40 bytes.
    :returns: ``True`` if a valid SMC option was seen before the walk ended.
    :raises WireError: only with ``strict=True``, for a malformed options area.
    """
    view = memoryview(options).cast("B")
    end = len(view)
    if strict and end > MAX_TCP_OPTION_SPACE:
        raise WireError(f"TCP options area is {end} bytes, more than {MAX_TCP_OPTION_SPACE}")
    found = False
    pos = 0
    while pos < end:
        kind = view[pos]
        if kind == TCPOPT_EOL:
            break
        if kind == TCPOPT_NOP:
            pos += 1
            continue
        if end - pos < 2:
            return _stop(found, strict, f"TCP option kind {kind} at {pos} has no length")
        opsize = view[pos + 1]
        if opsize < 2:
            return _stop(found, strict, f"TCP option kind {kind} at {pos}: length {opsize}")
        if opsize > end - pos:
            return _stop(
                found, strict, f"TCP option kind {kind} at {pos}: length {opsize} past end ({end})"
            )
        if (
            kind == TCPOPT_EXP
            and syn
            and opsize % 2 == 0
            and opsize >= TCPOLEN_EXP_SMC_BASE
            and _BE32.unpack_from(view, pos + 2)[0] == TCPOPT_SMC_MAGIC
        ):
            found = True
        pos += opsize
    return found


def tcp_header_options(tcp_header: bytes | bytearray | memoryview) -> memoryview:
    """Return the options area of a raw TCP header (bytes 20 .. data offset * 4).

    :param tcp_header: a TCP header (and possibly its payload), starting at the
        source port.
    :returns: a memoryview of the options bytes (empty if there are none).
    :raises WireError: if the header is shorter than 20 bytes, its data offset is
        below 5, or the header is shorter than the data offset says.
    """
    view = memoryview(tcp_header).cast("B")
    if len(view) < _TCP_MIN_HEADER:
        raise WireError(f"TCP header is {len(view)} bytes, fewer than {_TCP_MIN_HEADER}")
    header_len = (view[_TCP_DATA_OFFSET_BYTE] >> 4) * 4
    if header_len < _TCP_MIN_HEADER:
        raise WireError(f"TCP data offset {header_len // 4} is below 5")
    if header_len > len(view):
        raise WireError(f"TCP data offset says {header_len} bytes, only {len(view)} present")
    return view[_TCP_MIN_HEADER:header_len]
