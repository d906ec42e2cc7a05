"""Build smcr with setuptools: its metadata is in pyproject.toml, this file adds the compiled
data path to the wheel.

Where a C compiler with Python's headers works (``smcr.nativebuild.build_problem``),
``build_ext`` compiles the modules of ``smcr.nativebuild.MODULES`` with mypyc and
the C extensions of ``C_EXTENSIONS`` into the wheel, beside the ``.py`` files
(one function, ``nativebuild.compile_into``, also builds a development checkout);
the wheel is then specific to this Python and platform.  Where none works the
wheel is pure Python (``py3-none-any``) and the build says why, once.  Either
way ``build_py`` writes ``smcr/_build.json`` (``smcr.native.BUILD_INFO``): what
``smcr info`` reports.  An editable install (``pip install -e``) compiles nothing:
``python -m smcr.nativebuild`` builds a checkout (install.sh runs it).

The mypy that compiles is a build requirement (pyproject.toml), pinned as the
test extra pins it: the generated C is what the tests ran.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

PACKAGE = Path(__file__).resolve().parent / "src" / "smcr"


def _load(name: str) -> ModuleType:
    """``src/smcr/<name>.py`` as a module of its own: smcr itself (and its dependencies)
    cannot be imported while it is being built."""
    spec = importlib.util.spec_from_file_location(f"_smcr_build_{name}", PACKAGE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


nativebuild: Any = _load("nativebuild")
native: Any = _load("native")
PROBLEM: str = nativebuild.build_problem()
"""Why this wheel is pure Python ("" when it is compiled)."""


class BuildPy(build_py):
    """``build_py``, and ``smcr/_build.json`` saying how the wheel was built."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        if PROBLEM:
            print(f"smcr: building pure Python (smcr runs about 2-4x slower): {PROBLEM}",
                  file=sys.stderr)  # fmt: skip
        names = [*map(nativebuild.module_name, nativebuild.MODULES), *nativebuild.C_EXTENSIONS]
        target = Path(self.build_lib) / "smcr" / native.BUILD_INFO
        target.write_text(native.build_info(PROBLEM, names))


class BuildCompiled(build_ext):
    """``build_ext`` through ``nativebuild.compile_into``: mypyc's modules and the C
    extensions, with the C files of one extension compiled side by side."""

    def run(self) -> None:
        if getattr(self, "editable_mode", False) or self.inplace:
            print("smcr: editable install: compile with python -m smcr.nativebuild "
                  "(install.sh does)", file=sys.stderr)  # fmt: skip
            return
        nativebuild.compile_into(Path(self.build_lib), Path(self.build_temp), PACKAGE)


setup(
    # Declared for what setuptools derives from it (a platform wheel, the C source in the
    # sdist); BuildCompiled builds these and mypyc's modules.  None without a compiler.
    ext_modules=[] if PROBLEM else [Extension(name, [f"src/smcr/{rel}"],
                                              depends=[f"src/smcr/{h}"
                                                       for h in nativebuild.C_HEADERS])
                                    for name, rel in nativebuild.C_EXTENSIONS.items()],
    cmdclass={"build_py": BuildPy, "build_ext": BuildCompiled},
)
