"""Which smcr runs: the compiled hot path (mypyc) or the pure-Python one.

``python -m smcr.nativebuild`` (install.sh runs it) compiles a chosen list of
modules with mypyc into ``src/smcr/_native/`` (git-ignored), beside a
manifest: the SHA-256 of every source the build read (the compiled modules and
every smcr module they import, whose types and constants the C code assumes).
``smcr/__init__.py`` (interpreted, always) calls :func:`install` before
anything else of smcr is imported; it puts a finder first on ``sys.meta_path``
that serves those modules from the compiled files, but only if every recorded
source is still byte-for-byte what was compiled, the files are there and built
for this interpreter.  Otherwise nothing is installed and every module is the
``.py`` file: all or none, since mypyc's modules share one library and call
each other natively.  So an edited source is never shadowed by a stale build
(the editable install's ``.py`` files win until the next build), and
``SMCR_PURE_PYTHON=1`` forces the pure path.  ``SMCR_NATIVE_DIR`` names another
build of the same sources (``nativebuild --out``: to compare builds side by side).

The compiled files live apart from the sources on purpose: an extension module
beside its ``.py`` file would be picked by Python's own finder ahead of the
source, stale or not, and could not be turned off.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PACKAGE_DIR = Path(__file__).resolve().parent
NATIVE_DIR = PACKAGE_DIR / "_native"
MANIFEST = "manifest.json"
FORMAT = 1


@dataclass(frozen=True)
class Status:
    """What :func:`install` decided: ``compiled`` and why (``reason``, a short phrase)."""

    compiled: bool
    reason: str
    modules: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for people: ``compiled (mypyc and C, 32 modules)`` or ``pure Python
        (why)``."""
        if self.compiled:
            return f"compiled (mypyc and C, {len(self.modules)} modules)"
        return f"pure Python ({self.reason})"


_status = Status(False, "smcr.native.install() not called")


def source_digest(path: Path) -> str:
    """SHA-256 of a source file, as recorded in the manifest."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check(native_dir: Path = NATIVE_DIR) -> tuple[Status, dict[str, Path]]:
    """Whether the build in ``native_dir`` may be used, and its files by module name.

    Reads the manifest, hashes every source it lists (a few hundred KB: about a
    millisecond) and checks that each compiled file exists for this interpreter.
    """
    try:
        manifest = json.loads((native_dir / MANIFEST).read_text())
    except FileNotFoundError:
        return Status(False, "not built: python -m smcr.nativebuild"), {}
    except (OSError, ValueError) as exc:
        return Status(False, f"unreadable build manifest: {exc}"), {}
    if manifest.get("format") != FORMAT:
        return Status(False, "build from another smcr version: rebuild"), {}
    if manifest.get("cache_tag") != sys.implementation.cache_tag or manifest.get(
        "ext_suffix"
    ) not in importlib.machinery.EXTENSION_SUFFIXES:
        return Status(False, "built for another Python: rebuild"), {}
    for rel, digest in manifest["sources"].items():
        try:
            if source_digest(PACKAGE_DIR / rel) != digest:
                return Status(False, f"stale: {rel} changed since the build"), {}
        except OSError:
            return Status(False, f"stale: {rel} is gone"), {}
    files = {name: native_dir / rel for name, rel in manifest["files"].items()}
    for path in files.values():
        if not path.is_file():
            return Status(False, f"incomplete build: {path.name} missing"), {}
    modules = tuple(sorted(name for name in files if name.startswith("smcr.")))
    return Status(True, "built and current", modules), files


class _NativeFinder(importlib.abc.MetaPathFinder):
    """Serves the compiled modules (and mypyc's shared library) from their files."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        where = self.files.get(fullname)
        if where is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(where))
        return importlib.util.spec_from_file_location(fullname, where, loader=loader)


def install() -> Status:
    """Use the compiled modules if they are current and not refused; idempotent.

    Must run before any compiled module is imported (``smcr/__init__.py`` calls it
    first), so that a process never mixes the two.
    """
    global _status  # noqa: PLW0603 - one decision per process
    if any(isinstance(f, _NativeFinder) for f in sys.meta_path):
        return _status
    if os.environ.get("SMCR_PURE_PYTHON", "") not in ("", "0"):
        _status = Status(False, "SMCR_PURE_PYTHON is set")
        return _status
    status, files = check(Path(os.environ.get("SMCR_NATIVE_DIR") or NATIVE_DIR))
    if status.compiled:
        already = [name for name in files if name in sys.modules]
        if already:  # imported before us (should not happen): keep the process pure
            status = Status(False, f"{already[0]} was imported before smcr.native")
        else:
            sys.meta_path.insert(0, _NativeFinder(files))
    _status = status
    return _status


def status() -> Status:
    """What this process uses (as decided at ``import smcr``)."""
    return _status


def module_is_compiled(module: ModuleType) -> bool:
    """True if ``module`` was loaded from a compiled file (an extension module)."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)
