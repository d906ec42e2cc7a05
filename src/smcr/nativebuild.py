"""Compile smcr's hot path with mypyc: ``python -m smcr.nativebuild [--if-stale]``.

install.sh runs it after ``pip install`` (run-tests.sh through install.sh), so
a clean clone and every edit get a current build; where it cannot build (no C
compiler, no Python headers, mypyc fails) it says why and smcr runs as pure
Python.  The result goes to ``src/smcr/_native/`` with a manifest of the
sources' SHA-256 (see :mod:`smcr.native` for how it is used and why it is never
stale).  mypyc comes with mypy, a pinned test dependency.

What is compiled (:data:`MODULES`): the modules every message goes through: the
sans-IO engine and its connection/link-group state, the CDC and cursor codecs,
the runtime's parts that drive the engine, a connection's data path with the
socket's data calls (:mod:`smcr.stack.conn`), and both software RNICs.  Measured
(README, issue 15) against compiling less; modules that run once per connection or
never on the data path (CLC, CLI, diagnostics, the socket package) stay interpreted.
The socket package could not be compiled anyway: ``weakref.finalize`` needs a
``__weakref__`` slot that mypyc's native classes lack.  What a compiled module must
not do (shadow methods per instance, re-read a narrowed attribute after a call, ...)
is in docs/architecture.md, "The compiled build".
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import importlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smcr import native

#: Sources compiled, relative to the package directory.  One shared library.
MODULES: tuple[str, ...] = (
    "core/config.py",
    "core/events.py",
    "core/close.py",
    "core/handshake.py",
    "core/connection.py",
    "core/linkgroup.py",
    "core/state.py",
    "core/llc.py",
    "core/addlink.py",
    "core/failover.py",
    "core/ports.py",
    "core/rkeys.py",
    "core/clc.py",
    "core/engine.py",
    "wire/cursor.py",
    "wire/cdc.py",
    "stack/counters.py",
    "stack/readiness.py",
    "stack/hostconn.py",
    "stack/bufpool.py",
    "stack/wrslots.py",
    "stack/qps.py",
    "stack/wakeup.py",
    "stack/spin.py",
    "stack/clcwatch.py",
    "stack/executor.py",
    "stack/closing.py",
    "stack/progress.py",
    "stack/runtime.py",
    "stack/conn.py",
    "rdma/base.py",
    "rdma/eventloop.py",
    "rdma/qpstate.py",
    "rdma/shm/cq.py",
    "rdma/shm/device.py",
    "rdma/shm/layout.py",
    "rdma/shm/peer.py",
    "rdma/shm/qp.py",
    "rdma/shm/rendezvous.py",
    "rdma/roce/cq.py",
    "rdma/roce/device.py",
    "rdma/roce/fastpath.py",
    "rdma/roce/netif.py",
    "rdma/roce/qp.py",
    "rdma/roce/requester.py",
    "rdma/roce/responder.py",
)

#: Extension modules written in C, built with the compiled modules (module name -> source,
#: relative to the package directory): the RoCE RNIC's per-packet loops, where even
#: mypyc's code spends most of its time in C-API calls (:mod:`smcr.rdma.roce.fastpath`).
C_EXTENSIONS: dict[str, str] = {"smcr.rdma.roce._loops": "rdma/roce/_loops.c"}

#: mypyc's group name: the shared library is the top-level module ``smcr_native__mypyc``.
GROUP = "smcr_native"


def module_name(rel: str) -> str:
    """``core/engine.py`` -> ``smcr.core.engine``; ``core/__init__.py`` -> ``smcr.core``."""
    parts = ["smcr", *Path(rel).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _module_file(name: str, package_dir: Path) -> str | None:
    """The source of smcr module ``name``, relative to the package directory, if any."""
    parts = name.split(".")[1:]
    for rel in (Path(*parts).with_suffix(".py") if parts else None, Path(*parts, "__init__.py")):
        if rel is not None and (package_dir / rel).is_file():
            return rel.as_posix()
    return None


def import_closure(sources: tuple[str, ...], package_dir: Path = native.PACKAGE_DIR) -> list[str]:
    """The sources plus every smcr module they import, transitively (relative paths).

    The compiled code was checked against these modules' types and may have
    inlined their ``Final`` constants, so an edit to any of them makes the build stale.
    Imports under ``TYPE_CHECKING`` count too (harmless: a few more files hashed).
    """
    todo = list(sources)
    seen: set[str] = set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        mod = module_name(rel)
        package = mod if rel.endswith("__init__.py") else mod.rpartition(".")[0]
        names: set[str] = set()  # (enclosing packages' __init__ run too, but assume nothing)
        for node in ast.walk(ast.parse((package_dir / rel).read_text(), rel)):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                names.add(target)
                names.update(f"{target}.{alias.name}" for alias in node.names)
        for name in names:
            if name == "smcr" or name.startswith("smcr."):
                found = _module_file(name, package_dir)
                if found is not None and found not in seen:
                    todo.append(found)
    return sorted(seen)


@contextlib.contextmanager
def _parallel_c(jobs: int) -> Iterator[None]:
    """Compile an extension's C files side by side: distutils does one after another,
    and mypyc's library is one extension of a C file per module (the build takes
    about half as long on two cores)."""
    # (setuptools' distutils, and the standard library's if something loaded it)
    classes = {mod.CCompiler for name, mod in list(sys.modules.items())
               if name.endswith("distutils.ccompiler") and hasattr(mod, "CCompiler")}  # fmt: skip
    originals = {cls: cls.compile for cls in classes}

    def compile_all(self: Any, sources: list[str], output_dir: str | None = None,
                    macros: Any = None, include_dirs: Any = None, debug: int = 0,
                    extra_preargs: Any = None, extra_postargs: Any = None,
                    depends: Any = None) -> list[str]:  # fmt: skip
        # (CCompiler.compile's own steps, the loop over the files in threads)
        macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj: str) -> None:
            src, ext = build[obj]
            self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, [obj for obj in objects if obj in build]))
        objs: list[str] = objects
        return objs

    for cls in classes:
        cls.compile = compile_all
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.compile = original


def build(out_dir: Path = native.NATIVE_DIR, modules: tuple[str, ...] = MODULES) -> Path:
    """Compile ``modules`` and put them with their manifest in ``out_dir`` (replaced whole).

    The sources are hashed before mypyc reads them: an edit during the build
    leaves a manifest that no longer matches, i.e. the pure path, never a stale one.
    """
    # setuptools first: then distutils, which mypyc.build imports, is setuptools' own
    setuptools = importlib.import_module("setuptools")  # (no type stubs: Any)
    from mypyc.build import mypycify  # noqa: PLC0415 - a build-time (test) dependency

    package_dir = native.PACKAGE_DIR
    src_dir = package_dir.parent
    read = [*import_closure(modules, package_dir), *C_EXTENSIONS.values()]
    sources = {rel: native.source_digest(package_dir / rel) for rel in read}
    work = Path(tempfile.mkdtemp(prefix="smcr-mypyc-"))
    staging = out_dir.parent / f"{out_dir.name}.new"
    shutil.rmtree(staging, ignore_errors=True)
    cwd = os.getcwd()
    try:
        os.chdir(src_dir)  # mypy names the modules from paths under src/
        extensions = mypycify(
            ["--cache-dir", str(work / "mypy-cache"),
             *(f"{package_dir.name}/{rel}" for rel in modules)],
            target_dir=str(work / "c"),
            group_name=GROUP,
            # a C file per module: gcc takes 45 s instead of 75-90 s for one 300k-line
            # file, and the compiled code measured as fast (datapath_bench, 2 runs each)
            multi_file=True,
        )  # fmt: skip
        extensions += [setuptools.Extension(name, [f"{package_dir.name}/{rel}"],
                                            extra_compile_args=["-O2"])
                       for name, rel in C_EXTENSIONS.items()]  # fmt: skip
        dist = setuptools.Distribution({"name": "smcr-native", "ext_modules": extensions})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = str(staging)
        cmd.build_temp = str(work / "obj")
        with _parallel_c(os.cpu_count() or 1):
            dist.run_command("build_ext")
        files = {ext.name: cmd.get_ext_filename(ext.name)
                 for ext in extensions}  # fmt: skip
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    manifest = {
        "format": native.FORMAT,
        "cache_tag": sys.implementation.cache_tag,
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "files": files,
        "sources": sources,
    }
    (staging / native.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    old = out_dir.parent / f"{out_dir.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        out_dir.rename(old)
    staging.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Build (or, with ``--if-stale``, build only if the current build is unusable)."""
    ap = argparse.ArgumentParser(prog="python -m smcr.nativebuild", description=__doc__)
    ap.add_argument("--if-stale", action="store_true",
                    help="do nothing if the build is there and matches the sources")  # fmt: skip
    ap.add_argument("--out", type=Path, default=native.NATIVE_DIR,
                    help="build directory (default: the one smcr uses, src/smcr/_native)")
    args = ap.parse_args(argv)
    if args.if_stale:
        status, _ = native.check(args.out)
        reason = status.reason
        if status.compiled and set(status.modules) != {*map(module_name, MODULES),
                                                       *C_EXTENSIONS}:  # fmt: skip
            reason = "the modules to compile changed"
        elif status.compiled:
            print("smcr.nativebuild: compiled modules are current")
            return 0
        print(f"smcr.nativebuild: {reason}: compiling {len(MODULES)} modules with mypyc")
    start = time.monotonic()
    try:
        build(args.out)
    except (Exception, SystemExit) as exc:  # mypyc exits on type errors; compilers raise
        print(f"smcr.nativebuild: compiling failed ({type(exc).__name__}: {exc}); "
              "smcr runs as pure Python", file=sys.stderr)  # fmt: skip
        return 1
    print(f"smcr.nativebuild: compiled {len(MODULES)} modules in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
