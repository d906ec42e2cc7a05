"""What a process tells about itself in its diag snapshot (smcr.diag.snapshot)."""

from __future__ import annotations

import gc
import os
import warnings

from smcr.diag.snapshot import process_info


def test_process_info_closes_what_it_opens() -> None:
    """It reads /proc/self/comm; an unclosed file warns (ResourceWarning), which a test
    suite run under ``smcr run`` then reports (tornado's does, as an error)."""
    gc.collect()  # what earlier tests left unclosed warns now, not below
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        info = process_info()
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)
            and "/proc/self/comm" in str(w.message)] == []  # fmt: skip
    with open("/proc/self/comm") as f:
        assert info["comm"] == f.read().strip()
    assert info["pid"] == os.getpid()
