"""Which smcr runs: the compiled hot path (mypyc and C) or the pure-Python one.

Two kinds of smcr, told apart by :data:`BUILD_INFO`:

* **An installed package** (a wheel, built by ``setup.py``) has the file: it
  says whether the wheel was compiled, and if not why (no C compiler where it
  was built).  Compiled modules sit beside their ``.py`` files and Python's own
  import system picks them first; an installed package does not change, so
  nothing is checked but that each is there.  ``SMCR_PURE_PYTHON=1`` puts a
  finder first on ``sys.meta_path`` that serves those modules from their
  ``.py`` files instead (:class:`_SourceFinder`).
* **A development checkout** has none.  ``python -m smcr.nativebuild``
  (install.sh runs it) compiles a chosen list of modules into
  ``src/smcr/_native/`` (git-ignored), beside a manifest: the SHA-256 of every
  source the build read (the compiled modules and every smcr module they import,
  whose types and constants the C code assumes).  :func:`install` puts a finder
  first on ``sys.meta_path`` that serves those modules from the compiled files,
  but only if every recorded source is still byte-for-byte what was compiled,
  the files are there and built for this interpreter.  Otherwise nothing is
  installed and every module is the ``.py`` file: all or none, since mypyc's
  modules share one library and call each other natively.  So an edited source
  is never shadowed by a stale build (the editable install's ``.py`` files win
  until the next build), and ``SMCR_PURE_PYTHON=1`` forces the pure path.
  ``SMCR_NATIVE_DIR`` names another build of the same sources (``nativebuild
  --out``: to compare builds side by side).  The compiled files live apart from
  the sources on purpose: an extension module beside its ``.py`` file would be
  picked by Python's own finder ahead of the source, stale or not, and could not
  be turned off.

``smcr/__init__.py`` (interpreted, always) has :func:`install` run before any
other module of smcr's but a few light ones is imported (``smcr._NativeFirst``).
This module imports nothing of smcr: ``setup.py`` loads it by path to write
:data:`BUILD_INFO`.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
NATIVE_DIR = PACKAGE_DIR / "_native"
MANIFEST = "manifest.json"
FORMAT = 1
BUILD_INFO = "_build.json"
"""In an installed package: how its wheel was built (``{"compiled": bool, "reason": str,
"modules": [name, ...]}``, :func:`build_info`); a development checkout has none."""


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


_UNDECIDED = Status(False, "smcr.native.install() not called")
_status = _UNDECIDED


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


def build_info(problem: str, modules: Sequence[str]) -> str:
    """The text of :data:`BUILD_INFO` for a wheel: compiled ``modules``, or pure Python
    because of ``problem`` (when it is not "")."""
    info = {"compiled": not problem, "reason": problem or "compiled when the wheel was built",
            "modules": sorted(modules) if not problem else []}  # fmt: skip
    return json.dumps(info, indent=1) + "\n"


def installed_build(package_dir: Path = PACKAGE_DIR) -> dict[str, Any] | None:
    """:data:`BUILD_INFO` of an installed package; None in a development checkout."""
    try:
        info = json.loads((package_dir / BUILD_INFO).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"compiled": False, "reason": f"unreadable {BUILD_INFO}: {exc}", "modules": []}
    if not isinstance(info, dict) or not isinstance(info.get("modules"), list):
        return {"compiled": False, "reason": f"unreadable {BUILD_INFO}", "modules": []}
    return info


def _compiled_file(name: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The extension module file of smcr module ``name`` beside the sources, if any."""
    base = package_dir.joinpath(*name.split(".")[1:])
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = base.with_name(base.name + suffix)
        if path.is_file():
            return path
    return None


def _use_installed(info: dict[str, Any], pure: bool) -> Status:
    """The decision for an installed package (module docstring)."""
    if not info.get("compiled"):
        return Status(False, f"installed without compiled modules: {info.get('reason')}")
    modules = tuple(sorted(str(m) for m in info["modules"]))
    missing = [name for name in modules if _compiled_file(name) is None]
    already = [name for name in modules if name in sys.modules]
    if pure or missing or already:
        sys.meta_path.insert(0, _SourceFinder(modules))
        if pure:
            return Status(False, "SMCR_PURE_PYTHON is set")
        if missing:
            return Status(False, f"incomplete install: {missing[0]} has no compiled file")
        return Status(False, f"{already[0]} was imported before smcr.native")
    return Status(True, "installed compiled", modules)


class _SourceFinder:
    """Serves an installed package's compiled modules from their ``.py`` files; a module
    that has none (a C extension) is not there, as in a pure-Python install.  (A finder of
    ``sys.meta_path`` by its ``find_spec``: ``importlib.abc`` costs milliseconds to import,
    in every smcr process.)"""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        source = PACKAGE_DIR.joinpath(*fullname.split(".")[1:]).with_suffix(".py")
        if not source.is_file():
            raise ModuleNotFoundError(f"{fullname}: pure Python ({_status.reason})",
                                      name=fullname)  # fmt: skip
        return importlib.util.spec_from_file_location(fullname, source)


class _NativeFinder:
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

    Must run before any compiled module is imported (``smcr/__init__.py`` has it run
    before the first of smcr's modules but a few light ones), so that a process never
    mixes the two.
    """
    global _status  # noqa: PLW0603 - one decision per process
    if any(isinstance(f, _NativeFinder | _SourceFinder) for f in sys.meta_path):
        return _status
    pure = os.environ.get("SMCR_PURE_PYTHON", "") not in ("", "0")
    installed = installed_build()
    if installed is not None:
        _status = _use_installed(installed, pure)
        return _status
    if pure:
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
    """What this process uses (decided before the first module that may be compiled is
    imported, or now)."""
    if _status is _UNDECIDED:
        install()
    return _status


def module_is_compiled(module: ModuleType) -> bool:
    """True if ``module`` was loaded from a compiled file (an extension module)."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)
