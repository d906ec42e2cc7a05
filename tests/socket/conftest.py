"""Spawned peer processes for the socket tests, with bounded waits."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterator
from typing import Any

import pytest

CTX = mp.get_context("spawn")


class Peer:
    """A peer process and its control pipe."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self.ctl, child = CTX.Pipe()
        self.proc = CTX.Process(target=target, args=(child, *args), daemon=True)
        self.proc.start()

    def recv(self, timeout: float = 20.0) -> Any:
        assert self.ctl.poll(timeout), "peer process did not answer in time"
        return self.ctl.recv()

    def stop(self) -> None:
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


@pytest.fixture
def peer() -> Iterator[Callable[..., Peer]]:
    made: list[Peer] = []

    def start(target: Callable[..., None], *args: Any) -> Peer:
        p = Peer(target, *args)
        made.append(p)
        return p

    yield start
    for p in made:
        p.stop()
