"""smcr top's tables against what a lying process may say (its strings are not markup)."""

from __future__ import annotations

import io

from rich.console import Console

from smcr.tools import top


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
