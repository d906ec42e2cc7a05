"""``smcr run [-r SIZE] [-t SIZE] [-d] [--] COMMAND [ARGS...]``: start COMMAND with smcr
installed in every Python interpreter below it (see :mod:`smcr.run`)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping

from smcr.run import BOOT_DIR, parse_size


def environment(base: Mapping[str, str], rmb: str | None = None, sndbuf: str | None = None,
                debug: bool = False) -> dict[str, str]:  # fmt: skip
    """The environment COMMAND gets: ``base`` with the boot directory and smcr's own
    location at the front of ``PYTHONPATH`` and the ``smcr run`` settings.

    :raises ValueError: for a buffer size that :func:`smcr.run.parse_size` refuses.
    """
    env = dict(base)
    # (the directory that holds the smcr package: this file is smcr/run/launcher.py)
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = [BOOT_DIR, package_parent]
    parts += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in parts]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["SMCR_RUN"] = "1"
    for name, value in (("SMC_RCVBUF", rmb), ("SMC_SNDBUF", sndbuf)):
        if value is not None:
            env[name] = str(parse_size(value))
    if debug:
        env["SMCR_RUN_DEBUG"] = "1"
    return env


def run(command: list[str], rmb: str | None = None, sndbuf: str | None = None,
        debug: bool = False) -> int:  # fmt: skip
    """Replace this process with COMMAND; returns only on an error, its exit status."""
    if not command:
        print("smcr run: no command given", file=sys.stderr)
        return 2
    try:
        env = environment(os.environ, rmb, sndbuf, debug)
    except ValueError as exc:
        print(f"smcr run: {exc}", file=sys.stderr)
        return 2
    if shutil.which(command[0], path=env.get("PATH")) is None and os.sep not in command[0]:
        print(f"smcr run: {command[0]}: command not found", file=sys.stderr)
        return 127
    if debug:
        print(f"smcr run: PYTHONPATH={env['PYTHONPATH']}", file=sys.stderr)
        kind = program_kind(shutil.which(command[0], path=env.get("PATH")) or command[0])
        if kind != "python":
            print(f"smcr run: {command[0]} is not a Python program ({kind}): its own "
                  "connections stay TCP; Python programs it starts use smcr",
                  file=sys.stderr)  # fmt: skip
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"smcr run: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 126


_PYTHON = re.compile(r"python[0-9.]*$")


def program_kind(path: str) -> str:
    """What ``path`` runs: ``python`` (a Python interpreter, or a script whose ``#!`` line
    names one), else a short description for ``smcr run -d`` (``an ELF binary``, ``a
    script for /bin/sh``, ``unknown``): smcr reaches only Python interpreters."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return "unknown"
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
        if not words:
            return "unknown"
        names = [os.path.basename(w) for w in words[:2]]  # (#!/usr/bin/env python3)
        if any(_PYTHON.match(n) for n in names):
            return "python"
        return f"a script for {words[0]}"
    if head.startswith(b"\x7fELF"):
        real = os.path.basename(os.path.realpath(path))
        if _PYTHON.match(real) or _PYTHON.match(os.path.basename(path)):
            return "python"
        return "an ELF binary"
    return "unknown"
