"""What the ``smcr`` command's arguments allow: argparse ``type=`` functions.

Each refuses a bad value with :class:`argparse.ArgumentTypeError` naming the value
and what is allowed; :class:`Parser` prints that as one line on standard error
and exits with status 2, never a traceback from deep inside a sub-command
(``--sizes 0`` was a ZeroDivisionError, ``-p 99999`` an OverflowError).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from smcr.settings import buffer_size


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (argparse prints its usage first),
    from the sub-command's parser when there is one (``smcr disable now``: ``smcr
    disable: unrecognized arguments: now``)."""

    commands: Mapping[str, argparse.ArgumentParser] | None = None
    """The sub-commands' parsers, by name (set by whoever adds them)."""

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:  # fmt: skip
        """As argparse's, but extra arguments are the sub-command's error."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            owner = (self.commands or {}).get(getattr(parsed, "command", None) or "", self)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: MESSAGE`` and a pointer to ``-h`` on one line; exit 2."""
        self.exit(2, f"{self.prog}: {message} (see {self.prog} -h)\n")


def _refuse(text: str, allowed: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{text!r} is not allowed: expected {allowed}")


def count(low: int, high: int | None = None, what: str = "") -> Callable[[str], int]:
    """A whole number from ``low`` (to ``high``); ``what`` names its unit for the error."""
    allowed = (f"a whole number from {low} to {high}" if high is not None
               else f"a whole number >= {low}") + (f" ({what})" if what else "")  # fmt: skip

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise _refuse(text, allowed) from None
        if value < low or (high is not None and value > high):
            raise _refuse(text, allowed)
        return value

    parse.__name__ = "count"
    return parse


def seconds(positive: bool = True) -> Callable[[str], float]:
    """A number of seconds, above 0 (or from 0 with ``positive=False``)."""
    allowed = "seconds > 0" if positive else "seconds >= 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _refuse(text, allowed) from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise _refuse(text, allowed)
        return value

    parse.__name__ = "seconds"
    return parse


port = count(0, 65535, "a TCP port; 0: any free one")


def sizes(text: str) -> list[int]:
    """Comma-separated message sizes in bytes, each from 1 byte to 1 GiB."""
    allowed = "sizes in bytes from 1 to 1073741824, separated by commas (e.g. 1024,65536)"
    try:
        values = [int(part, 10) for part in text.split(",")]
    except ValueError:
        raise _refuse(text, allowed) from None
    if not values or not all(1 <= v <= 1 << 30 for v in values):
        raise _refuse(text, allowed)
    return values


def buffer(text: str) -> str:
    """A buffer size as ``smc_run`` takes it (``64k``, ``1m``), checked, kept as text."""
    try:
        buffer_size(text)
    except ValueError:
        raise _refuse(text, "a size from 16k to 1024m (k, m suffixes)") from None
    return text


def cpus(text: str) -> set[int]:
    """A CPU list as ``taskset -c`` takes it, of CPUs this process may run on."""
    from smcr.tools.load import parse_cpus  # noqa: PLC0415

    try:
        return parse_cpus(text)
    except ValueError:
        allowed = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        raise _refuse(text, f"CPUs of this host ({allowed}) as taskset -c takes them: "
                      "0 or 0,1 or 0-3") from None


def directory(text: str) -> str:
    """An existing directory."""
    if not os.path.isdir(text):
        raise _refuse(text, "an existing directory")
    return text


def fail(command: str, message: str, status: int = 2) -> int:
    """Print ``smcr COMMAND: MESSAGE`` on standard error; return ``status``."""
    print(f"smcr {command}: {message}", file=sys.stderr)
    return status


__all__ = ["Parser", "buffer", "count", "cpus", "directory", "fail", "port", "seconds", "sizes"]
