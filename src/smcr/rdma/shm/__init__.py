"""The shm RNIC: RDMA verbs between processes of one host over shared memory.

Open a device with :class:`ShmDevice`; everything else comes from it, through
the provider-independent API of :mod:`smcr.rdma`.  Module map: ``device``
(device, PD, MRs, rendezvous server), ``qp`` (the RC QP), ``layout`` (shared
memory formats), ``rendezvous`` (unix-socket directory and control messages),
``peer`` (a requester's connection to, and mappings of, its responder),
``cq`` (the completion queue whose arming requesters see: doorbells only for a sleeper).
Its progress thread is :mod:`smcr.rdma.eventloop`'s, as the RoCE RNIC's.
"""

from smcr.rdma.shm.device import ShmDevice, ShmPd
from smcr.rdma.shm.qp import ShmQp

__all__ = ["ShmDevice", "ShmPd", "ShmQp"]
