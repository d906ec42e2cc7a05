"""smcr as Python users get it (issue 28): the wheel and the sdist built from a clean copy,
each installed into a fresh virtual environment.

* The wheel of a machine with a C compiler is compiled (every module of
  ``nativebuild.MODULES`` and the C extensions beside their sources), its
  sdist has every source (the C file included) and the license in SPDX form.
* Installed into a fresh venv it runs the compiled code (``smcr info``, the
  modules' files) and ``smcr demo`` works; with the dependencies at the floors
  of their ranges too.
* The sdist installed where no C compiler works (``CC=/bin/false``) is pure
  Python and says so once during the build, and ``smcr info`` says why.

Slow (a mypyc build, three venvs: about two minutes); CI runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from smcr import native, nativebuild

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COMPILED = sorted([*map(nativebuild.module_name, nativebuild.MODULES), *nativebuild.C_EXTENSIONS])
FLOORS = {"rich": "13.7.0", "zlib-ng": "0.5.1"}
"""The lowest versions of the runtime dependencies' ranges (pyproject.toml), tested here."""
PURE_SAID = "smcr: building pure Python"


def _run(*cmd: str | Path, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:  # fmt: skip
    res = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)  # fmt: skip
    assert res.returncode == 0, f"{cmd}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _clean_copy(into: Path) -> Path:
    """What a clone of this checkout would have (tracked and new files, nothing ignored:
    no build, no venv, no caches)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.split(b"\0")  # fmt: skip
    for raw in filter(None, listed):
        rel = raw.decode()
        if (ROOT / rel).is_file():
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, into / rel)
    return into


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The wheel and sdist ``python -m build`` makes of a clean copy, and its output."""
    copy = _clean_copy(tmp_path_factory.mktemp("clone"))
    out = tmp_path_factory.mktemp("dist")
    res = _run(sys.executable, "-m", "build", "--outdir", out, copy)
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist, "log": res.stdout + res.stderr}


def _venv(where: Path, *install: str | Path, env: dict[str, str] | None = None) -> Path:
    """A fresh virtual environment with ``install`` (pip arguments) in it; its bin/."""
    _run(sys.executable, "-m", "venv", where)
    _run(where / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
         *install, env=env)
    return where / "bin"


def _outside_env() -> dict[str, str]:
    """This environment without what points Python at the checkout."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "SMCR_PURE_PYTHON", "SMCR_NATIVE_DIR")}  # fmt: skip


PROBE = """
import json, smcr
from smcr import native
import smcr.rdma.roce.fastpath as fastpath
names = [*native.status().modules]
print(json.dumps({"status": native.status().describe(), "modules": names,
                  "files": {n: __import__(n, fromlist=["_"]).__file__ for n in names},
                  "c_loops": fastpath.LOOPS is not None, "smcr": smcr.__file__}))
"""


def _probe(bin_dir: Path) -> dict[str, Any]:
    res = _run(bin_dir / "python", "-c", PROBE, env=_outside_env())
    got: dict[str, Any] = json.loads(res.stdout)
    return got


def test_the_wheel_is_compiled_and_the_sdist_complete(dist: dict[str, Any]) -> None:
    wheel, sdist = dist["wheel"], dist["sdist"]
    assert wheel.name.startswith("smcr-0.1.0-cp3") and "-none-any" not in wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    for module in COMPILED:
        stem = "/".join(module.split("."))
        assert any(n.startswith(f"{stem}.cpython-") and n.endswith(".so") for n in names), module
    assert any(n.startswith(f"{nativebuild.GROUP}__mypyc.") for n in names)
    info = json.loads(zipfile.ZipFile(wheel).read(f"smcr/{native.BUILD_INFO}"))
    assert info == {"compiled": True, "reason": "compiled when the wheel was built",
                    "modules": COMPILED}  # fmt: skip
    assert not [n for n in names if n.endswith(".c") or n.startswith("smcr/_native")]
    assert "smcr-0.1.0.dist-info/licenses/LICENSE" in names
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
        pkg_info = tar.extractfile("smcr-0.1.0/PKG-INFO")
        assert pkg_info is not None
        assert "License-Expression: MIT" in pkg_info.read().decode()
    tracked = subprocess.run(["git", "ls-files", "src"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    assert set(tracked) <= members  # every source, src/smcr/rdma/roce/_loops.c included
    assert {"LICENSE", "setup.py", "pyproject.toml", "README.md"} <= members
    assert "license" not in " ".join(line for line in dist["log"].lower().splitlines()
                                     if "deprecat" in line)  # (the old table form warned)


def test_the_installed_wheel_runs_compiled_and_the_demo_works(
    dist: dict[str, Any], tmp_path: Path,
) -> None:
    bin_dir = _venv(tmp_path / "venv", dist["wheel"])
    got = _probe(bin_dir)
    assert got["status"] == f"compiled (mypyc and C, {len(COMPILED)} modules)"
    assert got["modules"] == COMPILED
    assert all(f.endswith(".so") for f in got["files"].values()), got["files"]
    assert got["c_loops"] and got["smcr"].startswith(str(tmp_path / "venv"))
    info = json.loads(_run(bin_dir / "smcr", "info", "--json", env=_outside_env()).stdout)
    assert info["code"] == got["status"]
    demo = _run(bin_dir / "smcr", "demo", env=_outside_env(), timeout=120)
    assert "SHA-256" in demo.stdout and "True" in demo.stdout


def test_the_dependencies_floors(dist: dict[str, Any], tmp_path: Path) -> None:
    """The ranges' lowest versions run: rich's tables, zlib-ng's CRC in the C loops."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        name, floor = dep.split(">=")[0], dep.split(">=")[1].split(",")[0]
        assert FLOORS[name] == floor, dep
    bin_dir = _venv(tmp_path / "venv", dist["wheel"],
                    *(f"{name}=={version}" for name, version in FLOORS.items()))  # fmt: skip
    got = _probe(bin_dir)
    assert got["c_loops"], "the C loops found no zng_crc32 in the oldest zlib-ng"
    _run(bin_dir / "smcr", "demo", env=_outside_env(), timeout=120)


def test_the_sdist_without_a_compiler_is_pure_python_and_says_so(
    dist: dict[str, Any], tmp_path: Path,
) -> None:
    env = {**_outside_env(), "CC": "/bin/false"}
    _run(sys.executable, "-m", "venv", tmp_path / "venv")
    bin_dir = tmp_path / "venv" / "bin"
    res = _run(bin_dir / "python", "-m", "pip", "install", "-v", "--disable-pip-version-check",
               "--no-cache-dir", dist["sdist"], env=env)  # fmt: skip  (no cached wheel)
    said = [line.strip() for line in (res.stdout + res.stderr).splitlines() if PURE_SAID in line]
    assert len(said) == 1, said
    why = "no working C compiler ('/bin/false' cannot compile a C file that includes Python.h)"
    assert said[0] == f"{PURE_SAID} (smcr runs about 2-4x slower): {why}"
    got = _probe(bin_dir)
    assert got["status"] == f"pure Python (installed without compiled modules: {why})"
    assert not got["c_loops"]
    _run(bin_dir / "smcr", "demo", env=_outside_env(), timeout=120)
