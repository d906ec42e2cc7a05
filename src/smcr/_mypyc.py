"""``mypyc_attr``, the marks the compiled build (smcr.nativebuild) reads, without
making mypy a dependency: smcr also runs as pure Python where mypy is not installed
(the mark then does nothing, as it does for mypyc at run time)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy: the mark is only for the compiler

    def mypyc_attr(*_attrs: str, **_kwattrs: object) -> Callable[[_T], _T]:
        """A no-op stand-in for :func:`mypy_extensions.mypyc_attr`."""

        def mark(cls: _T) -> _T:
            return cls

        return mark


__all__ = ["mypyc_attr"]
