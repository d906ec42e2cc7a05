"""The verbs RNIC: the kernel's RDMA devices (hardware RNICs, Linux Soft-RoCE) under
smcr's verbs model, through rdma-core's pyverbs (:mod:`smcr.rdma.ibverbs.device`).

Importing this package imports no pyverbs: a host without it says why
(:func:`~smcr.rdma.ibverbs.binding.missing`) and uses the other RNICs.
"""

from smcr.rdma.ibverbs.binding import missing
from smcr.rdma.ibverbs.sysfs import GidEntry, device_names, find_gid, gid_entries


def unusable() -> str | None:
    """Why no verbs RNIC can be opened on this host, in one line, or None: no RDMA device
    in the kernel, or no pyverbs to reach one."""
    if not device_names():
        return "no RDMA device (/sys/class/infiniband is empty or absent)"
    return missing()


__all__ = ["GidEntry", "device_names", "find_gid", "gid_entries", "missing", "unusable"]
