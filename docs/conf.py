"""Sphinx configuration of smcr's documentation: ``python -m sphinx -W -n -b html docs
docs/_build/html`` (run-tests.sh builds it, doctests too; warnings are errors).

Markdown pages (MyST, as the README and docs/architecture.md), the API reference from
the docstrings (autodoc: reST field lists), and tables the code defines once: every
``SMCR_*`` variable (:mod:`smcr.settings`), the command's exit statuses and its
sub-commands' usage (:mod:`smcr.cli`), through ``docs/_ext/smcr_docs.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import smcr  # noqa: E402

project = "smcr"
author = "The smcr authors"
copyright = "2026, The smcr authors"
release = version = smcr.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "smcr_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options: dict[str, object] = {}

# Nitpicky mode (-n) checks every cross-reference; these name things outside smcr's
# reference (the standard library's, with no intersphinx: the build needs no network).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(socket|ssl|enum|typing|collections\.abc|ipaddress|os|selectors|_socket)\..*"),
    (r"py:.*", r"(int|str|bytes|bytearray|memoryview|float|bool|object|None|type|tuple|list"
               r"|dict|set|frozenset|Any|Buffer|Self|Callable|Iterable|Sequence|Mapping"
               r"|IntEnum|Enum|OSError|ValueError|TimeoutError|Exception|BaseException"
               r"|ConnectionError|ConnectionResetError|BlockingIOError|T|U)"),
    (r"py:.*", r"smcr\.(stack|core|diag|rdma|wire|socket|run|discovery|tools)\..*"),
    (r"py:.*", r"(Address|IpAddress|_Address|FileDescriptorLike|WriteableBuffer"
               r"|ReadableBuffer|_RetAddress|SocketKind|AddressFamily)"),
]

html_theme = "alabaster"
html_title = f"smcr {release}"
html_static_path: list[str] = []
