"""What a process tells about itself in its diag snapshot (smcr.diag.snapshot)."""

from __future__ import annotations

import gc
import os
import warnings

from smcr.diag.snapshot import process_info


def test_process_info_closes_what_it_opens() -> None:
    """It reads /proc/self/comm; an unclosed file warns (ResourceWarning), which a test
    suite run under ``smcr run`` then reports (tornado's does, as an error)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        info = process_info()
        gc.collect()
    assert [w for w in seen if issubclass(w.category, ResourceWarning)] == []
    with open("/proc/self/comm") as f:
        assert info["comm"] == f.read().strip()
    assert info["pid"] == os.getpid()
