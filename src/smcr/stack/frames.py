"""Errors that keep no views of a caller's buffer."""

from __future__ import annotations

import traceback


def release_frames(exc: BaseException) -> None:
    """Clear the variables of the finished frames that ``exc``'s traceback (and those of the
    exceptions it was raised during) keep, as a call into C leaves none: a program that
    keeps the error (an event loop closing a stream with it) must not keep the views of
    its buffer our frames held, which would forbid resizing a ``bytearray`` (``BufferError``)
    for as long (compiled frames hold none; a frame still running is left as it is)."""
    seen: BaseException | None = exc
    for _ in range(8):  # (a context chain is short; a cycle must not loop)
        if seen is None:
            return
        traceback.clear_frames(seen.__traceback__)
        seen = seen.__context__


__all__ = ["release_frames"]
