"""The suite brings its own configuration: the host's smcr set-up does not reach the tests.

A host where smcr is configured (``smcr ueid add``, ``smcr pnet add``, a peers
file, ``SMCR_*`` variables in the shell) must pass the same tests as a fresh
one: a UEID in ``/etc/smcr/ueid`` made every runtime offer SMC-Rv2, and a test
that expects v1's CONFIRM LINK saw v2's.  So before anything is imported or
started, every ``SMCR_*`` variable that configures smcr is taken out of the
environment and the configuration files point at empty files of the session
(``SMCR_UEID_FILE``, ``SMCR_PNET_FILE``, ``SMCR_PEERS_FILE``); peer processes
inherit that.  A test that wants a configuration sets its own (``monkeypatch``
or the environment it gives a process), as before.

Left alone: what selects the code under test (``SMCR_PURE_PYTHON``,
``SMCR_NATIVE_DIR``) and where the shared test data is (``SMCR_SHARED``, the
interop variables).  Discovery stays a host-wide choice that
``tests/discovery_on.py`` makes for the session.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from smcr import settings

KEPT = frozenset({settings.PURE_PYTHON.name, settings.NATIVE_DIR.name})
"""Variables of :data:`smcr.settings.VARIABLES` that the run keeps: which code is tested."""

FILES = (settings.UEID_FILE, settings.PNET_FILE, settings.PEERS_FILE)
"""The host's configuration files, each replaced by an empty file of the session."""


def isolate(environ: dict[str, str] | os._Environ[str], directory: Path) -> list[str]:
    """Take the host's smcr configuration out of ``environ``; empty files in ``directory``
    stand for its configuration files.  Returns the names of the variables removed."""
    removed = [var.name for var in settings.VARIABLES
               if var.name in environ and var.name not in KEPT]  # fmt: skip
    for name in removed:
        del environ[name]
    for var in FILES:
        path = directory / var.name.lower()
        path.write_text("")
        environ[var.name] = str(path)
    return removed


def pytest_configure(config: pytest.Config) -> None:
    """Before any test module is imported (some read the environment at import)."""
    directory = Path(tempfile.mkdtemp(prefix="smcr-tests-config-"))
    config.add_cleanup(lambda: _remove(directory))
    isolate(os.environ, directory)


@pytest.fixture(autouse=True)
def _configuration_stays_empty() -> Iterator[None]:
    """A test that wrote the session's configuration (through the default path) does not
    leave it to the next one."""
    yield
    for var in FILES:
        path = Path(os.environ.get(var.name, ""))
        if path.is_file() and path.stat().st_size:
            path.write_text("")


def _remove(directory: Path) -> None:
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
