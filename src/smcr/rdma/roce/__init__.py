"""The RoCEv2 RNIC: RC verbs between hosts over real RoCEv2 packets (UDP port 4791).

A user-space counterpart of Linux Soft-RoCE (rxe), wire-compatible with it
(``shared/spec/rocev2.md``).  Open one with :class:`RoceDevice` (one per
interface address; :func:`list_devices` lists them); everything else comes
from it through the provider-independent API of :mod:`smcr.rdma`, exactly as
with the shm RNIC.  Module map: ``netif`` (interfaces, the RNIC list),
``device`` (device, PD, MRs, sockets, progress thread), ``qp`` (the QP: the
protocol bound to its flow sockets), ``requester`` and ``responder`` (the RC
protocol, sans-IO), ``fastpath`` (lean header packing and ICRC).
"""

from smcr.rdma.roce.device import RoceDevice, RocePd
from smcr.rdma.roce.netif import RnicInfo, list_devices
from smcr.rdma.roce.qp import RoceQp

__all__ = ["RnicInfo", "RoceDevice", "RocePd", "RoceQp", "list_devices"]
