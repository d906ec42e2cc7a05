"""Counters that outlive their process, and the baseline of ``smcr stats reset``.

Design (the why of each):

* **A process leaves its counters behind** when it exits (``atexit``):
  ``exited/<pid>-<token>.json`` in its own private directory
  (:mod:`smcr.diag.paths`), written 0600 under a temporary name and renamed, so
  a reader sees a whole file or none.  ``smcr stats`` adds them to the running
  processes' counters: host totals include processes that have gone, those
  that SIGTERM, SIGHUP or SIGINT ended too (:func:`smcr.exits.on_exit`).
  A process killed by SIGKILL leaves nothing (nothing runs in it any more): its
  counts leave the totals.
* **Folding**: the tools add the exited files into ``exited/total.json`` and
  remove them, under an exclusive ``flock`` of ``exited/.lock`` (two tools at a
  time fold once), so the directory does not grow with every process.
* **The baseline** of ``smcr stats reset`` is ``baseline.json`` in the same
  private directory: only its owner writes it (smc-tools kept its cache in a
  predictable file under /tmp, a local denial of service).
* **Nothing read is trusted**: files are size-limited, parsed as JSON, and
  only non-negative integers (and lists of them, and reason lists) are taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from pathlib import Path
from typing import Any

from smcr.diag import paths

MAX_FILE = 1 << 20
TOTAL = "total.json"


def write_private(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically, 0600, via a fresh name beside it."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object from ``path`` (no symlinks), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as src:
            raw = src.read(MAX_FILE + 1)
    except OSError:
        return None
    if len(raw) > MAX_FILE:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def persist_exit(directory: Path, counters: dict[str, Any], pid: int) -> Path | None:
    """Leave a process's final counters in ``directory/exited`` (at exit)."""
    try:
        exited = directory / paths.EXITED
        with contextlib.suppress(FileExistsError):
            exited.mkdir(mode=0o700)
        path = exited / f"{pid}-{secrets.token_hex(4)}.json"
        write_private(path, {"pid": pid, "counters": counters})
        return path
    except OSError:
        return None


def fold_exited(directory: Path) -> dict[str, Any]:
    """The summed counters of every exited process of ``directory``.

    Where we may write there (its owner), the single files are folded into
    ``total.json`` first, under the lock; otherwise (root reading a user's
    directory) they are only read.
    """
    exited = directory / paths.EXITED
    if not exited.is_dir():
        return {}
    if os.access(exited, os.W_OK) and exited.stat().st_uid == os.getuid():
        try:
            lock = os.open(exited / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            lock = -1
        if lock >= 0:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                total = _counters_of(read_json(exited / TOTAL))
                files = [p for p in exited.glob("*.json") if p.name != TOTAL]
                for path in files:
                    total = add(total, _counters_of(read_json(path)))
                if files:
                    write_private(exited / TOTAL, {"counters": total})
                    for path in files:
                        with contextlib.suppress(OSError):
                            path.unlink()
                return total
            finally:
                os.close(lock)
    total = {}
    for path in exited.glob("*.json"):
        total = add(total, _counters_of(read_json(path)))
    return total


def _counters_of(doc: dict[str, Any] | None) -> dict[str, Any]:
    value = (doc or {}).get("counters")
    return clean(value) if isinstance(value, dict) else {}


def _nat(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def clean(raw: dict[str, Any]) -> dict[str, Any]:
    """Keep only well-formed fields: non-negative ints, lists of them, reason lists."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or len(key) > 64:
            continue
        if key in ("clnt_fback", "srv_fback") and isinstance(value, list):
            out[key] = [{"local": _nat(r.get("local")) & 0xFFFFFFFF,
                         "peer": _nat(r.get("peer")) & 0xFFFFFFFF, "count": _nat(r.get("count"))}
                        for r in value[:256] if isinstance(r, dict)]  # fmt: skip
        elif isinstance(value, list):
            out[key] = [_nat(v) for v in value[:16]]
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = _nat(value)
    return out


def add(a: dict[str, Any], b: dict[str, Any], sign: int = 1) -> dict[str, Any]:
    """``a + sign * b`` field by field (reasons merged by code pair); counts stay >= 0."""
    out = dict(a)
    for key, value in b.items():
        mine = out.get(key)
        if key in ("clnt_fback", "srv_fback"):
            merged: dict[tuple[int, int], int] = {}
            for r in (mine or []):
                merged[(r["local"], r["peer"])] = r["count"]
            for r in value:
                pair = (r["local"], r["peer"])
                merged[pair] = max(0, merged.get(pair, 0) + sign * r["count"])
            out[key] = [{"local": lo, "peer": pe, "count": n}
                        for (lo, pe), n in sorted(merged.items()) if n]  # fmt: skip
        elif isinstance(value, list):
            base = list(mine) if isinstance(mine, list) else []
            base += [0] * (len(value) - len(base))
            out[key] = [max(0, x + sign * y) for x, y in zip(base, value + [0] * len(base),
                                                              strict=False)]  # fmt: skip
        else:
            out[key] = max(0, (mine if isinstance(mine, int) else 0) + sign * value)
    return out


def load_baseline(directory: Path) -> dict[str, Any]:
    """The counters at the last ``reset`` (empty: never reset)."""
    return _counters_of(read_json(directory / paths.BASELINE))


def save_baseline(directory: Path, counters: dict[str, Any]) -> None:
    """Make ``counters`` the new zero (``smcr stats reset``)."""
    write_private(directory / paths.BASELINE, {"counters": counters})
