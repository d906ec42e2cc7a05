"""smcr top's tables against what a lying process may say (its strings are not markup)."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from smcr.tools import linkgroup, top


def test_strings_from_other_processes_are_shown_as_they_are() -> None:
    """A command name ``[/x]`` (rich: a closing tag that matches nothing) and a
    ``[link=...]`` one: shown as written, the view neither fails nor writes an OSC 8
    escape sequence to the terminal."""
    procs = [{"pid": 7, "command": "[/x]", "netns": 1},
             {"pid": 8, "command": "[link=http://example.invalid]x[/link]", "netns": 1,
              "error": "[bold]"}]  # fmt: skip
    conns = [{"pid": 7, "state": "[/state]", "local": "[i]", "peer": "-", "mode": "SMCR"}]
    groups = [{"pid": 7, "links": 1, "role": "[/]", "type": "SINGLE", "device": "[u]"}]
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=300).print(top.view(conns, groups, procs))
    shown = out.getvalue()
    assert "\x1b]8" not in shown
    for text in ("[/x]", "[link=http://example.invalid]x[/link]", "[bold]", "[/state]",
                 "[i]", "[/]", "[u]"):  # fmt: skip
        assert text in shown


def test_without_a_terminal_nothing_is_cut(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``smcr top -n 1 | ...``: the tables take the width of their cells (rich's default
    without a terminal is 80 columns, which cut the addresses)."""
    peer = "[fd00:1234:5678:9abc:def0:1234:5678:9abc]:65535 " + "x" * 60
    conns = [{"pid": 7, "state": "ACTIVE", "local": "[fd00::1]:5000", "peer": peer,
              "mode": "SMCR"}]  # fmt: skip
    monkeypatch.setattr(top, "sample", lambda: (conns, [], [{"pid": 7, "command": "srv"}]))
    assert top.run(argparse.Namespace(json=False, iterations=1, interval=0.01)) == 0
    shown = capsys.readouterr().out
    assert peer in shown
    assert max(map(len, shown.splitlines())) < 300  # (as wide as the cells, not 10 000)


def test_linkgroup_show_details_add_the_links() -> None:
    """``linkgroup show``: ``-d`` adds the group's links, ``-dd`` their GIDs (``-dd``
    printed what ``show`` prints)."""
    links = [{"state": "ACTIVE", "device": "roce_eth0", "gid": "::ffff:10.0.0.1",
              "peer_gid": "::ffff:10.0.0.2"},
             {"state": "ACTIVATING", "device": "roce_eth1", "gid": "::ffff:10.1.0.1",
              "peer_gid": "::ffff:10.1.0.2"}]  # fmt: skip
    groups = [{"lgr_id": 0x100, "role": "SERV", "type": "SYM", "links": links, "pid": 9,
               "command": "srv"}]  # fmt: skip
    plain, one, two = (linkgroup.table(groups, False, d).splitlines() for d in (0, 1, 2))
    assert plain != one != two
    assert "#Links" not in plain[0] and "Local-GIDs" not in one[0]
    assert "2" in one[1].split() and "ACTIVE,ACTIVATING" in one[1]
    assert "roce_eth0,roce_eth1" in one[1]
    assert "::ffff:10.0.0.1,::ffff:10.1.0.1" in two[1]
    assert "::ffff:10.0.0.2,::ffff:10.1.0.2" in two[1]
