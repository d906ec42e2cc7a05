"""``smcr bench --load/--cpus`` (smcr.tools.load): competitors that compute for the run and
are gone after it; CPU lists as taskset takes them."""

from __future__ import annotations

import os
import time

import pytest

from smcr.tools import load


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_competitors_compute_for_the_run_and_are_gone_after_it() -> None:
    with load.competitors(2) as pids:
        assert len(pids) == 2
        time.sleep(0.5)
        assert all(_cpu_ticks(pid) > 0 for pid in pids)  # busy, not asleep
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")  # killed and reaped


def test_cpu_lists_as_taskset_takes_them() -> None:
    mine = sorted(os.sched_getaffinity(0))
    assert load.parse_cpus(str(mine[0])) == {mine[0]}
    assert load.parse_cpus(",".join(map(str, mine))) == set(mine)
    assert load.parse_cpus(f"{mine[0]}-{mine[-1]}") == set(range(mine[0], mine[-1] + 1))
    for bad in ("", "x", "1-", "-1", f"{max(mine) + 1}", "0,,1"):
        with pytest.raises(ValueError, match="--cpus"):
            load.parse_cpus(bad)


def test_pinned_runs_this_process_on_the_cpus_and_restores_it() -> None:
    before = os.sched_getaffinity(0)
    one = {min(before)}
    with load.pinned(one):
        assert os.sched_getaffinity(0) == one
    assert os.sched_getaffinity(0) == before
