"""The verbs RNIC: the kernel's RDMA devices (hardware RNICs, Linux Soft-RoCE) under
smcr's verbs model, through rdma-core's pyverbs (:mod:`smcr.rdma.ibverbs.device`).

Importing this package imports no pyverbs: a host without it says why
(:func:`~smcr.rdma.ibverbs.binding.missing`) and uses the other RNICs.
"""

from smcr.rdma.ibverbs.binding import missing
from smcr.rdma.ibverbs.sysfs import GidEntry, device_names, find_gid, gid_entries

__all__ = ["GidEntry", "device_names", "find_gid", "gid_entries", "missing"]
