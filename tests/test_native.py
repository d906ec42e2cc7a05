"""The compiled hot path (issue 15): used when built and current, never when stale or
refused, and indistinguishable from the pure-Python path in what it does.

install.sh builds it (``python -m smcr.nativebuild``), so a missing build is a
failure here, not a skip: the suite is meant to run on the compiled modules.
Each case runs a fresh interpreter, since the choice is made once, before the first of
smcr's modules that may be compiled is imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from smcr import native, nativebuild

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
import smcr
from smcr import native
import smcr.socket
names = [n for n in sys.argv[1:]]
mods = []
for n in names:  # (a C extension has no source: it is there only when compiled)
    try:
        mods.append(sys.modules.get(n) or __import__(n, fromlist=["_"]))
    except ImportError:
        mods.append(None)
print(json.dumps({"status": native.status().describe(), "compiled": native.status().compiled,
                  "files": {n: m and m.__file__ for n, m in zip(names, mods)},
                  "native": {n: bool(m) and native.module_is_compiled(m)
                             for n, m in zip(names, mods)},
                  "socket": native.module_is_compiled(smcr.socket)}))
"""

COMPILED = sorted([*map(nativebuild.module_name, nativebuild.MODULES), *nativebuild.C_EXTENSIONS])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SMCR_PURE_PYTHON", "SMCR_NATIVE_DIR", "PYTHONPATH")}  # fmt: skip
    env.update(extra)
    return env


def _probe(**extra: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", PROBE, *COMPILED], env=_env(**extra),
                         cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_the_built_modules_are_what_is_imported() -> None:
    built, _ = native.check()
    assert built.compiled, f"no usable build ({built.reason}): install.sh builds it"
    got = _probe()
    assert got["compiled"], got["status"]
    assert got["status"] == f"compiled (mypyc and C, {len(COMPILED)} modules)"
    assert all(got["native"].values()), got["files"]
    assert all(Path(f).is_relative_to(native.NATIVE_DIR) for f in got["files"].values())
    assert not got["socket"]  # socket.py stays interpreted (weakref.finalize)


def test_smcr_pure_python_forces_the_sources() -> None:
    got = _probe(SMCR_PURE_PYTHON="1")
    assert got["status"] == "pure Python (SMCR_PURE_PYTHON is set)"
    assert not any(got["native"].values())
    assert _sources_only(got["files"])


def _sources_only(files: dict[str, str | None]) -> bool:
    """Every module imported from its ``.py`` file; the C extensions, which have none, not
    at all (the Python loops of :mod:`smcr.rdma.roce.fastpath` run instead)."""
    return all(f is None if n in nativebuild.C_EXTENSIONS else (f or "").endswith(".py")
               for n, f in files.items())  # fmt: skip


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package with its build: what an edit does, without editing ours."""
    built, _ = native.check()
    assert built.compiled, f"no usable build ({built.reason}): install.sh builds it"
    where = tmp_path_factory.mktemp("src")
    shutil.copytree(native.PACKAGE_DIR, where / "smcr",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return where


@pytest.mark.parametrize(("edited", "stale"), [
    (None, False),
    ("core/engine.py", True),  # a compiled module
    ("rdma/roce/_loops.c", True),  # the C extension's source
    ("wire/decline.py", True),  # interpreted, but imported by compiled ones (types, constants)
    ("cli.py", False),  # nothing compiled depends on it
])  # fmt: skip
def test_an_edited_source_is_never_shadowed(copy: Path, edited: str | None, stale: bool) -> None:
    source = copy / "smcr" / edited if edited else None
    before = source.read_bytes() if source else b""
    if source:
        source.write_bytes(before + b"\n# edited after the build\n")
    try:
        got = _probe(PYTHONPATH=str(copy))
    finally:
        if source:
            source.write_bytes(before)
    assert all(Path(f).is_relative_to(copy) for f in got["files"].values() if f)
    if stale:
        assert got["status"] == f"pure Python (stale: {edited} changed since the build)"
        assert not any(got["native"].values())
        assert _sources_only(got["files"])
    else:
        assert got["compiled"], got["status"]
        assert all(got["native"].values())


def _workload(**extra: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "tests.native_workload"], env=_env(**extra),
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_compiled_and_pure_python_do_the_same() -> None:
    """Handshakes, fallbacks, timeouts and data both ways (tests/native_workload.py)."""
    compiled = _workload()
    pure = _workload(SMCR_PURE_PYTHON="1")
    assert compiled["compiled"] == [True, True, True], compiled["native"]
    assert pure["compiled"] == [False, False, False], pure["native"]
    assert compiled["stack"].pop("server").startswith("compiled")
    assert pure["stack"].pop("server").startswith("pure Python")
    for run in (compiled, pure):
        del run["compiled"], run["native"]
    assert compiled == pure
    assert all(all(conn["echoed"]) for conn in pure["stack"].values())


def test_smcr_info_says_which_code_runs() -> None:
    def code(**extra: str) -> str:
        out = subprocess.run([sys.executable, "-m", "smcr", "info", "--json"], env=_env(**extra),
                             cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
        said: str = json.loads(out.stdout)["code"]
        return said

    assert code() == f"compiled (mypyc and C, {len(COMPILED)} modules)"
    assert code(SMCR_PURE_PYTHON="1") == "pure Python (SMCR_PURE_PYTHON is set)"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package laid out as a compiled wheel installs it: each compiled module beside its
    ``.py`` file, mypyc's library at the top, ``_build.json`` saying so (from our build,
    without building a wheel: tests/packaging does that)."""
    built, files = native.check()
    assert built.compiled, f"no usable build ({built.reason}): install.sh builds it"
    where = tmp_path_factory.mktemp("site")
    shutil.copytree(native.PACKAGE_DIR, where / "smcr",
                    ignore=shutil.ignore_patterns("__pycache__", "_native*"))  # fmt: skip
    for path in files.values():
        target = where / path.relative_to(native.NATIVE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    (where / "smcr" / native.BUILD_INFO).write_text(native.build_info("", COMPILED))
    return where


def test_an_installed_wheel_imports_its_compiled_modules_normally(installed: Path) -> None:
    got = _probe(PYTHONPATH=str(installed))
    assert got["status"] == f"compiled (mypyc and C, {len(COMPILED)} modules)"
    assert all(got["native"].values()), got["files"]
    assert all(Path(f).parent.is_relative_to(installed / "smcr") for f in got["files"].values())
    with_pure = _probe(PYTHONPATH=str(installed), SMCR_PURE_PYTHON="1")
    assert with_pure["status"] == "pure Python (SMCR_PURE_PYTHON is set)"
    assert not any(with_pure["native"].values())
    assert _sources_only(with_pure["files"])


def test_an_installed_wheel_missing_a_compiled_module_runs_pure(installed: Path) -> None:
    (victim,) = (installed / "smcr" / "core").glob("engine.*.so")
    kept = victim.read_bytes()
    victim.unlink()
    try:
        got = _probe(PYTHONPATH=str(installed))
    finally:
        victim.write_bytes(kept)
    assert got["status"] == ("pure Python (incomplete install: smcr.core.engine has no compiled "
                             "file)")
    assert not any(got["native"].values())
    assert _sources_only(got["files"])


def test_a_pure_wheel_says_why(tmp_path: Path) -> None:
    shutil.copytree(native.PACKAGE_DIR, tmp_path / "smcr",
                    ignore=shutil.ignore_patterns("__pycache__", "_native*"))  # fmt: skip
    why = "no working C compiler ('/bin/false' cannot compile a C file that includes Python.h)"
    (tmp_path / "smcr" / native.BUILD_INFO).write_text(native.build_info(why, COMPILED))
    got = _probe(PYTHONPATH=str(tmp_path))
    assert got["status"] == f"pure Python (installed without compiled modules: {why})"
    assert _sources_only(got["files"])
    res = subprocess.run([sys.executable, "-m", "smcr.nativebuild"],
                         env=_env(PYTHONPATH=str(tmp_path)), cwd=tmp_path, capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert res.returncode == 1
    assert "smcr is installed from a wheel" in res.stderr  # (it would write into the install)


LAZY_PROBE = """
import json, sys
import smcr, smcr.run
before = sorted(m for m in sys.modules if m.startswith(("smcr.", "smcr_native")))
names = sorted(set(smcr.__all__) - set(dir(smcr)))  # not imported yet (PEP 562)
socket_class = smcr.SMCSocket.__module__
import smcr.core.engine
from smcr import native
print(json.dumps({"before": before, "lazy_names": names, "socket_class": socket_class,
                  "status": native.status().describe(),
                  "engine": native.module_is_compiled(sys.modules["smcr.core.engine"])}))
"""


def test_import_smcr_leaves_the_choice_of_build_to_the_first_module_of_smcr() -> None:
    """``import smcr`` (and ``smcr run``'s start, which imports smcr.run) imports nothing
    else of smcr's; its names load on first use; the build is chosen before the first
    module that may be compiled, which is then the compiled one."""
    out = subprocess.run([sys.executable, "-c", LAZY_PROBE], cwd=ROOT, capture_output=True,
                         text=True, check=True)  # fmt: skip
    got = json.loads(out.stdout)
    assert got["before"] == ["smcr.run", "smcr.run.patches"]
    assert got["lazy_names"] == ["DeclineCode", "SMCSocket", "SmcInfo", "WireError",
                                 "create_connection", "create_server"]  # fmt: skip
    assert got["socket_class"] == "smcr.socket"
    assert got["status"] == native.status().describe()
    assert got["engine"] is native.status().compiled
