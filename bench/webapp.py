"""The application :mod:`web_servers` serves: one WSGI and one ASGI callable that answer
every request with the same body, which the client checks byte for byte.

The body's size comes from ``WEBAPP_BODY`` (bytes; default 64 KiB) and its bytes from
:func:`body`, so that a client made in another process knows what to expect.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any


def body(size: int) -> bytes:
    """The body of ``size`` bytes: a pattern with a period that no power of two divides,
    so that a block copied to the wrong place does not read as right."""
    pattern = bytes((i * 7 + 3) & 0xFF for i in range(251))
    return (pattern * (size // len(pattern) + 1))[:size]


BODY = body(int(os.environ.get("WEBAPP_BODY", "65536")))
HEADERS = [("Content-Type", "application/octet-stream"), ("Content-Length", str(len(BODY)))]


def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The WSGI application (gunicorn)."""
    start_response("200 OK", HEADERS)
    return [BODY]


async def asgi(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
               send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:  # fmt: skip
    """The ASGI application (uvicorn), with the lifespan protocol answered."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    raw = [(k.lower().encode(), v.encode()) for k, v in HEADERS]
    await send({"type": "http.response.start", "status": 200, "headers": raw})
    await send({"type": "http.response.body", "body": BODY})
