"""A benchmark's server in a process of its own that says ``ready PORT`` on its standard
output once it listens (a port it let the kernel pick: one picked by the benchmark could be
taken), for the scripts beside this one that spawn such a server."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator


@contextlib.contextmanager
def server_port(cmd: list[str], env: dict[str, str], wait: float) -> Iterator[int]:
    """Start ``cmd`` and give its port to the block (the client's run); after the block,
    wait up to ``wait`` seconds for the server to end (it ends when its client is done).
    A server still running then, or after the block failed, is killed.

    :raises RuntimeError: the server did not say ``ready PORT``.
    """
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        said = server.stdout.readline().split()
        if len(said) != 2 or said[0] != "ready":
            raise RuntimeError("the server did not start")
        yield int(said[1])
        server.wait(timeout=wait)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
