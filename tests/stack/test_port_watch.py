"""The port watcher's pace (:class:`smcr.stack.ports.PortWatcher`): slow while every RoCE
port is up, quick while one is down, so that a port back up is found soon even when the
kernel's message about its carrier comes late (linkwatch holds it up to a second)."""

from __future__ import annotations

import types
from unittest import mock

from smcr.rdma.roce import RoceDevice
from smcr.stack import ports


def watcher_of(*states: tuple[bool, bool]) -> ports.PortWatcher:
    """A watcher (no thread, no socket) of a runtime whose ports are (RoCE?, up?)."""
    res = [types.SimpleNamespace(device=mock.Mock(spec=RoceDevice) if roce else object(),
                                 up=up) for roce, up in states]  # fmt: skip
    w = ports.PortWatcher.__new__(ports.PortWatcher)
    w.stack = types.SimpleNamespace(ports=res)  # type: ignore[assignment]
    return w


def test_ports_are_read_often_only_while_a_roce_port_is_down() -> None:
    assert watcher_of((True, True), (True, True)).recheck_interval() == ports.RECHECK
    assert watcher_of((True, True), (True, False)).recheck_interval() == ports.RECHECK_DOWN
    # a port that is not RoCE (the shm RNIC) is not the watcher's
    assert watcher_of((True, True), (False, False)).recheck_interval() == ports.RECHECK
