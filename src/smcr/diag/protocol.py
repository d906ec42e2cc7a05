"""The diag wire format: one length-prefixed JSON request, one length-prefixed JSON answer.

A frame is a 4-byte big-endian length then that many bytes of UTF-8 JSON (an
object).  Why so plain: the tools and the endpoint are both smcr, JSON is what
``--json`` prints anyway, and a length prefix lets each side refuse an
oversized frame before reading it (:data:`MAX_REQUEST`, :data:`MAX_ANSWER`).

Requests: ``{"op": OP}`` with OP one of :data:`OPS`.  Answers:
``{"ok": true, "v": VERSION, "pid": ..., ...}`` or ``{"ok": false, "error": TEXT}``.
``{"op": "trace", "snap": N}`` is answered, then followed by frames of records
(:mod:`smcr.diag.trace`) until the tool shuts its end of the socket; the last
frame is ``{"end": true, ...}``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

VERSION = 1
MAX_REQUEST = 4096
"""Largest request the endpoint reads; a longer length closes the connection unread."""
MAX_ANSWER = 16 << 20
"""Largest answer a tool reads (a process with many thousands of connections fits)."""
OPS = ("ping", "snapshot", "counters", "trace")
_LEN = struct.Struct(">I")
HEADER = _LEN.size


class ProtocolError(ValueError):
    """A frame that is not one: bad length, not UTF-8 JSON, not an object."""


def encode(message: dict[str, Any]) -> bytes:
    """One frame."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return _LEN.pack(len(body)) + body


def frame_length(header: bytes, limit: int) -> int:
    """The body length a header announces.

    :raises ProtocolError: above ``limit``.
    """
    (length,) = _LEN.unpack(header)
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes (limit {limit})")
    return int(length)


def decode(body: bytes) -> dict[str, Any]:
    """A frame's body as a JSON object.

    :raises ProtocolError: not UTF-8 JSON or not an object.
    """
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ProtocolError("not a JSON object")
    return value
