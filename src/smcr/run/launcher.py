"""``smcr run [-r SIZE] [-t SIZE] [-d] [--] COMMAND [ARGS...]``: start COMMAND with smcr
installed in every Python interpreter below it (see :mod:`smcr.run`)."""

from __future__ import annotations

import os
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
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"smcr run: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 126
