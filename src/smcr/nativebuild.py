"""Compile smcr's hot path with mypyc: into the wheel, or beside a development checkout.

Two builds of one list (:data:`MODULES`, :data:`C_EXTENSIONS`), by one function
(:func:`compile_into`):

* **The wheel** (``pip install .``, ``python -m build``): ``setup.py``'s
  ``build_ext`` compiles into the wheel's tree, each compiled module beside its
  ``.py`` file, where Python's own import system finds it first.  An installed
  package never changes, so nothing more is needed; where no C compiler works
  (:func:`build_problem`) the wheel is pure Python and says why
  (:mod:`smcr.native`, ``smcr info``).
* **A development checkout** (``python -m smcr.nativebuild [--if-stale]``;
  install.sh runs it after ``pip install -e``): sources change all the time
  there, so the build goes to ``src/smcr/_native/`` with a manifest of the
  sources' SHA-256, and :mod:`smcr.native` uses it only while every source is
  what was compiled.  An editable install builds nothing itself.

What is compiled (:data:`MODULES`): the modules every message goes through: the
sans-IO engine and its connection/link-group state, the CDC and cursor codecs,
the runtime's parts that drive the engine, a connection's data path with the
socket's data calls (:mod:`smcr.stack.conn`), and both software RNICs.  Measured
(README, issue 15) against compiling less; and the CLC codec, which every connection's
set-up runs (a server that sets up connections for several clients at once spent a fifth
of its handshake thread there, interpreted), and the socket's side of the handshake
(:mod:`smcr.socket.handshake`, functions only: some 30k instructions of a server's
connection set-up, 16k of a client's).  Modules that run once per connection
otherwise or never on the data path (the decline codes, CLI, diagnostics, the rest of
the socket package) stay interpreted.
The socket package's classes could not be compiled anyway: ``weakref.finalize`` needs a
``__weakref__`` slot that mypyc's native classes lack.  What a compiled module must
not do (shadow methods per instance, re-read a narrowed attribute after a call, ...)
is in docs/architecture.md, "The compiled build".

This module imports nothing of smcr at its top: ``setup.py`` loads it by path,
before smcr (or its dependencies) can be imported.  mypyc comes with mypy, a
build requirement and a pinned test dependency.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import importlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
"""The package's sources (``src/smcr`` in a checkout)."""

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
    "core/negotiation.py",
    "core/clc.py",
    "core/engine.py",
    "wire/cursor.py",
    "wire/cdc.py",
    "wire/validate.py",
    "wire/clc_header.py",
    "wire/clc_proposal.py",
    "wire/clc.py",
    "stack/counters.py",
    "stack/readiness.py",
    "stack/hostconn.py",
    "stack/inplace.py",
    "stack/bufpool.py",
    "stack/wrslots.py",
    "stack/qps.py",
    "stack/wakeup.py",
    "stack/spin.py",
    "stack/clcwatch.py",
    "stack/trim.py",
    "stack/executor.py",
    "stack/closing.py",
    "stack/progress.py",
    "stack/runtime.py",
    "stack/conn.py",
    "socket/handshake.py",
    "locks.py",
    "bound.py",
    "rdma/verbs.py",
    "rdma/completion.py",
    "rdma/base.py",
    "rdma/eventloop.py",
    "rdma/qpstate.py",
    "rdma/shm/cq.py",
    "rdma/shm/device.py",
    "rdma/shm/layout.py",
    "rdma/shm/words.py",
    "rdma/shm/peer.py",
    "rdma/shm/send.py",
    "rdma/shm/receive.py",
    "rdma/shm/ops.py",
    "rdma/doorbell.py",
    "rdma/shm/qp.py",
    "rdma/shm/rendezvous.py",
    "rdma/stores.py",
    "rdma/bells.py",
    "rdma/roce/cq.py",
    "rdma/roce/device.py",
    "rdma/roce/fastpath.py",
    "rdma/roce/netif.py",
    "rdma/roce/qp.py",
    "rdma/roce/requester.py",
    "rdma/roce/responder.py",
    "rdma/ibverbs/binding.py",
    "rdma/ibverbs/sysfs.py",
    "rdma/ibverbs/cq.py",
    "rdma/ibverbs/qp.py",
    "rdma/ibverbs/device.py",
)

#: Extension modules written in C, built with the compiled modules (module name -> source,
#: relative to the package directory): the RoCE RNIC's per-packet loops, where even
#: mypyc's code spends most of its time in C-API calls (:mod:`smcr.rdma.roce.fastpath`).
C_EXTENSIONS: dict[str, str] = {"smcr.rdma.roce._loops": "rdma/roce/_loops.c",
                                 "smcr.rdma.shm._place": "rdma/shm/_place.c",
                                 "smcr.stack._lane": "stack/_lane.c",
                                 "smcr.rdma._doorbell": "rdma/_doorbell.c",
                                 "smcr._locks": "_locks.c",
                                 "smcr.stack._epolls": "stack/_epolls.c"}
#: Headers the C extensions include (relative to the package directory): hashed with the
#: sources, so that an edit makes the build stale.
C_HEADERS: tuple[str, ...] = ("_locks.h",)
#: Of :data:`C_EXTENSIONS`, those that read and write the compiled modules' objects in place
#: (:mod:`smcr.stack.lane`): compiled against the header mypyc generates for this build
#: (its classes' structs) and its runtime's headers.
ON_MYPYC_HEADER = frozenset({"smcr.rdma.shm._place", "smcr.stack._lane"})

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


def import_closure(sources: tuple[str, ...], package_dir: Path = PACKAGE_DIR) -> list[str]:
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


def build_problem() -> str:
    """Why this machine cannot build the compiled modules ("" if it can): a C file that
    includes ``Python.h`` is compiled with the compiler setuptools would use (``CC``),
    and mypyc must be importable.  ``SMCR_PURE_PYTHON`` set at build time asks for a
    pure-Python build."""
    if os.environ.get("SMCR_PURE_PYTHON", "") not in ("", "0"):
        return "SMCR_PURE_PYTHON was set when it was built"
    importlib.import_module("setuptools")  # first: distutils is then setuptools' own
    ccompiler = importlib.import_module("distutils.ccompiler")
    du_sysconfig = importlib.import_module("distutils.sysconfig")
    try:
        importlib.import_module("mypyc.build")
    except ImportError as exc:
        return f"mypyc is not installed ({exc})"
    with tempfile.TemporaryDirectory(prefix="smcr-cc-") as tmp:
        probe = Path(tmp, "probe.c")
        probe.write_text("#include <Python.h>\n"
                         "int smcr_probe(void) { return Py_IsInitialized(); }\n")
        compiler = ccompiler.new_compiler()
        du_sysconfig.customize_compiler(compiler)
        try:
            compiler.compile([str(probe)], output_dir=tmp,
                             include_dirs=[sysconfig.get_path("include")])  # fmt: skip
        except Exception:  # (CompileError, DistutilsExecError, OSError: all say no)
            cc = (getattr(compiler, "compiler_so", None) or ["cc"])[0]
            return f"no working C compiler ({cc!r} cannot compile a C file that includes Python.h)"
    return ""


def _parallel_build_ext(jobs: int) -> type:
    """setuptools' ``build_ext``, compiling an extension's C files side by side: distutils
    does one after another, and mypyc's library is one extension of a C file per module
    (the build takes about half as long on two cores).  Public API only: each file is a
    ``compile`` call of its own, the objects are linked as the extension's extra objects."""
    build_ext: Any = importlib.import_module("setuptools.command.build_ext").build_ext

    class ParallelBuildExt(build_ext):  # type: ignore[misc]
        def build_extension(self, ext: Any) -> None:
            if jobs > 1 and len(ext.sources) > 1:
                ext = copy.copy(ext)
                objects = self._compile_side_by_side(ext)
                ext.depends = [*ext.sources, *ext.depends]
                ext.extra_objects = [*objects, *ext.extra_objects]
                ext.sources = []
            super().build_extension(ext)

        def _compile_side_by_side(self, ext: Any) -> list[str]:
            for obj in self.compiler.object_filenames(ext.sources, output_dir=self.build_temp):
                Path(obj).parent.mkdir(parents=True, exist_ok=True)
            macros = [*ext.define_macros, *((name,) for name in ext.undef_macros)]

            def one(source: str) -> list[str]:
                done: list[str] = self.compiler.compile(
                    [source], output_dir=self.build_temp, macros=macros,
                    include_dirs=ext.include_dirs, debug=self.debug,
                    extra_postargs=ext.extra_compile_args or [], depends=ext.depends)  # fmt: skip
                return done

            with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
                return [obj for objs in pool.map(one, ext.sources) for obj in objs]

    return ParallelBuildExt


def compile_into(build_lib: Path, work: Path, package_dir: Path = PACKAGE_DIR,
                 modules: tuple[str, ...] = MODULES) -> dict[str, str]:  # fmt: skip
    """Compile ``modules`` with mypyc, and :data:`C_EXTENSIONS`, into ``build_lib`` as a
    wheel lays them out (``smcr/core/engine.<tag>.so`` beside where its ``.py`` goes,
    mypyc's shared library at the top); ``work`` holds the generated C and the objects.

    :returns: each built file, relative to ``build_lib``, by module name.
    :raises SystemExit: mypyc's way to report type errors.
    """
    setuptools: Any = importlib.import_module("setuptools")  # (no type stubs)
    from mypyc.build import include_dir, mypycify  # noqa: PLC0415 - a build-time dependency

    jobs = os.cpu_count() or 1
    build_lib, work = build_lib.resolve(), work.resolve()  # (we change directory)
    cwd = os.getcwd()
    try:
        os.chdir(package_dir.parent)  # mypy names the modules from paths under src/
        extensions = mypycify(
            ["--cache-dir", str(work / "mypy-cache"),
             *(f"{package_dir.name}/{rel}" for rel in modules)],
            target_dir=str(work / "c"),
            group_name=GROUP,
            # a C file per module: gcc takes 45 s instead of 75-90 s for one 300k-line
            # file, and the compiled code measured as fast (datapath_bench, 2 runs each)
            multi_file=True,
        )  # fmt: skip
        headers = [str(work / "c"), include_dir()]
        extensions += [setuptools.Extension(name, [f"{package_dir.name}/{rel}"],
                                            include_dirs=headers if name in ON_MYPYC_HEADER
                                            else [], extra_compile_args=["-O2"],
                                            depends=[f"{package_dir.name}/{h}"
                                                     for h in C_HEADERS])
                       for name, rel in C_EXTENSIONS.items()]  # fmt: skip
        dist = setuptools.Distribution({"name": "smcr-native", "ext_modules": extensions,
                                        "cmdclass": {"build_ext": _parallel_build_ext(jobs)}})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = str(build_lib)
        cmd.build_temp = str(work / "obj")
        dist.run_command("build_ext")
        return {ext.name: cmd.get_ext_filename(ext.name) for ext in extensions}
    finally:
        os.chdir(cwd)


def build(out_dir: Path | None = None, modules: tuple[str, ...] = MODULES) -> Path:
    """Compile ``modules`` and put them with their manifest in ``out_dir`` (replaced whole;
    default: :data:`smcr.native.NATIVE_DIR`): the development checkout's build.

    The sources are hashed before mypyc reads them: an edit during the build
    leaves a manifest that no longer matches, i.e. the pure path, never a stale one.
    """
    from smcr import native  # noqa: PLC0415 - not at the top: setup.py loads us by path

    out_dir = out_dir or native.NATIVE_DIR
    read = [*import_closure(modules, PACKAGE_DIR), *C_EXTENSIONS.values(), *C_HEADERS]
    sources = {rel: native.source_digest(PACKAGE_DIR / rel) for rel in read}
    work = Path(tempfile.mkdtemp(prefix="smcr-mypyc-"))
    staging = out_dir.parent / f"{out_dir.name}.new"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        files = compile_into(staging, work, PACKAGE_DIR, modules)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
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
    from smcr import native  # noqa: PLC0415 - not at the top: setup.py loads us by path

    ap = argparse.ArgumentParser(prog="python -m smcr.nativebuild", description=__doc__)
    ap.add_argument("--if-stale", action="store_true",
                    help="do nothing if the build is there and matches the sources")  # fmt: skip
    ap.add_argument("--out", type=Path, default=native.NATIVE_DIR,
                    help="build directory (default: the one smcr uses, src/smcr/_native)")
    args = ap.parse_args(argv)
    if native.installed_build() is not None:
        print("smcr.nativebuild: smcr is installed from a wheel, whose compiled modules come "
              f"with it ({native.status().describe()}); this command builds a development "
              "checkout", file=sys.stderr)  # fmt: skip
        return 1
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
    problem = build_problem()
    if problem:
        print(f"smcr.nativebuild: not compiled: {problem}; smcr runs as pure Python",
              file=sys.stderr)  # fmt: skip
        return 1
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
