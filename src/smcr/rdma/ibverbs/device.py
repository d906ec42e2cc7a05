"""The verbs RNIC: an RDMA device of the kernel (hardware, or Linux Soft-RoCE) through
rdma-core's pyverbs.

Design (the why of each):

* **The device of an address**, as Linux's SMC-R picks an RNIC: the RoCE v2 GID whose net
  device carries the TCP connection's address (:func:`smcr.rdma.ibverbs.sysfs.find_gid`),
  so the GID, the port and the ``sgid_index`` of every address vector come from the
  device's own table.  MAC, prefix and MTU are the net device's, as for the RoCE RNIC
  (:mod:`smcr.rdma.roce.netif`); the path MTU is the port's active one.
* **smcr's buffers are the NIC's memory**: an MR registers the very pages the runtime
  reads and writes (``ibv_reg_mr`` of an anonymous mapping), so the NIC writes a peer's
  data straight into the RMB, and ``recv_into`` copies it out as on the other RNICs.
  Keys and addresses are the device's (``lkey``, ``rkey`` and the virtual address);
  the region's view is over a ctypes array of the mapping, which keeps the mapping alive
  while registered and keeps :meth:`MemoryRegion.discard` from giving pinned pages back
  (the NIC would keep writing into the pages the kernel pinned, not into new ones).
* **No inline data offered** (``max_inline_data`` 0): the runtime then posts every WRITE
  and SEND from registered memory, which every device supports; a QP asked for inline
  room gets what the device grants.
* **One thread of the device** sleeps on its asynchronous event descriptor and on its
  CQs' completion channels.  Events (port down, QP fatal) are queued as the software
  RNICs queue theirs (:meth:`Device.get_async_event`; the runtime's port watcher follows
  the net device, as for the RoCE RNIC); completions that no poller is there to take are
  taken and rung for (:meth:`VerbsCq.from_device <smcr.rdma.ibverbs.cq.VerbsCq.from_device>`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import select
from typing import Any, cast

from smcr.osthreads import NamedThread
from smcr.rdma.base import Device, MemoryRegion, ProtectionDomain, zeroed_memory
from smcr.rdma.completion import CompletionQueue
from smcr.rdma.ibverbs import binding, sysfs
from smcr.rdma.ibverbs.cq import VerbsCq
from smcr.rdma.ibverbs.qp import VerbsQp
from smcr.rdma.roce import netif
from smcr.rdma.verbs import (
    AccessFlag,
    AsyncEvent,
    AsyncEventType,
    DeviceAttr,
    PathMtu,
    PortState,
    QpCap,
    VerbsError,
)

_EVENTS = {int(t): t for t in AsyncEventType}
#: ``ibv_event_type`` values beyond :class:`AsyncEventType` that say a port went or came.
IBV_EVENT_PORT_ACTIVE = 9
IBV_EVENT_PORT_ERR = 10


class VerbsDevice(Device):
    """The RDMA device whose RoCE v2 GID is ``address`` (module docstring).

    :param address: the IP address (default: ``ifname``'s first).
    :param ifname: the net device, if ``address`` is not given.
    :param device: only this RDMA device (default: any that has the GID).
    :raises VerbsError: ENODEV when pyverbs is missing or no device has the address's GID.
    """

    def __init__(self, address: str | None = None, *, ifname: str | None = None,
                 device: str | None = None) -> None:  # fmt: skip
        reason = binding.missing()
        if reason is not None:
            raise VerbsError(errno.ENODEV, reason)
        pv = binding.load()
        info = netif.find(address, ifname)
        entry = sysfs.find_gid(info.address, device=device)
        if entry is None:
            raise VerbsError(errno.ENODEV, f"no RDMA device has a RoCE v2 GID of {info.address}")
        try:
            with binding.opening() as fds:
                self.ctx = pv.device.Context(name=entry.device)
            port = self.ctx.query_port(entry.port)
            dev = self.ctx.query_device()
        except pv.error.PyverbsError as exc:
            raise VerbsError(binding.errno_of(exc), f"open {entry.device}: {exc}") from exc
        active = PathMtu(max(1, min(int(port.active_mtu), 5)))
        attr = DeviceAttr(
            max_qp_wr=min(int(dev.max_qp_wr), 1 << 16), max_sge=int(dev.max_sge),
            max_cqe=int(dev.max_cqe), max_mr=int(dev.max_mr), max_mr_size=int(dev.max_mr_size),
            max_msg_sz=int(port.max_msg_sz), max_qp_rd_atom=int(dev.max_qp_rd_atom),
            active_mtu=active, max_inline_data=0,
        )  # fmt: skip
        super().__init__(entry.device, entry.gid, info.mac, entry.netdev or info.ifname, attr)
        self.info = dataclasses.replace(info, name=entry.device, gid=entry.gid, active_mtu=active)
        self.address = info.address
        self.family = info.family
        self.scope_id = info.scope_id
        self.entry = entry
        self.port_num = entry.port
        self._gid_index = entry.index
        self.qps: dict[int, VerbsQp] = {}
        self._closed = False
        self._async_fd = fds[0] if len(fds) == 1 else -1
        self._stop_r, self._stop_w = os.pipe()
        self._ep = select.epoll()
        self._ep.register(self._stop_r, select.EPOLLIN)
        if self._async_fd >= 0:
            self._ep.register(self._async_fd, select.EPOLLIN)
        self._channels: dict[int, VerbsCq] = {}
        self._worker = NamedThread(target=self._run, name="smcr-verbs", daemon=True)
        self._worker.start()

    def gid_index(self) -> int:
        """The GID table index of the device's RoCE v2 GID now: read again each time (for a
        QP's address vector), as the kernel fills the table anew when the net device comes
        back up; the last one known while the address is gone."""
        self._find_gid()
        return self._gid_index

    def _find_gid(self) -> bool:
        """Whether the port's GID table has the device's RoCE v2 GID now (at the index it
        had, else anywhere: then that index is remembered)."""
        entry = sysfs.gid_entry(self.name, self.port_num, self._gid_index)
        if entry is not None and entry.gid == self.gid and entry.kind == sysfs.ROCE_V2:
            return True
        found = sysfs.find_gid(self.address, device=self.name)
        if found is None or found.port != self.port_num:
            return False
        self._gid_index = found.index
        return True

    def gid_ready(self) -> bool:
        """Whether the port is ACTIVE and its GID table holds the device's RoCE v2 GID again:
        the kernel refills the table some time after the net device comes back up, and a
        QP brought up before then has no source GID (its modify to RTR fails)."""
        return sysfs.port_state(self.name, self.port_num) == "ACTIVE" and self._find_gid()

    # --------------------------------------------------------------- objects

    def alloc_pd(self) -> VerbsPd:
        """A new protection domain of the device (bookkeeping in :meth:`Device.alloc_pd`)."""
        return cast(VerbsPd, super().alloc_pd())

    def _new_pd(self, pd_id: int) -> VerbsPd:
        return VerbsPd(self, pd_id)

    def _new_cq(self, depth: int) -> VerbsCq:
        cq = VerbsCq(self.ctx, min(depth, self.attr.max_cqe))
        self.watch(cq.channel_fd, cq)
        return cq

    def watch(self, fd: int, cq: VerbsCq) -> None:
        """Watch the completion channel ``fd`` of this device's CQ in ``cq`` (module
        docstring; a CQ another device made gets one here for this device's QPs)."""
        if fd not in self._channels:
            self._channels[fd] = cq
            self._ep.register(fd, select.EPOLLIN | select.EPOLLET)

    # ---------------------------------------------------------------- events

    def _run(self) -> None:
        """The device's thread (module docstring): events, and completions nobody polls."""
        while True:
            try:
                ready = self._ep.poll()
            except InterruptedError:
                continue
            except (OSError, ValueError):
                return  # closed
            for fd, _mask in ready:
                if fd == self._stop_r:
                    return
                if fd == self._async_fd:
                    self._read_event()
                    continue
                cq = self._channels.get(fd)
                if cq is not None:
                    cq.from_device()

    def _read_event(self) -> None:
        try:
            event = self.ctx.get_async_event()
        except Exception:  # EAGAIN, or the device went
            return
        kind = int(event.event_type)
        event.ack()
        if kind == IBV_EVENT_PORT_ERR:
            self.port_state = PortState.DOWN
        elif kind == IBV_EVENT_PORT_ACTIVE:
            self.port_state = PortState.ACTIVE
        known = _EVENTS.get(kind)
        if known is not None:
            self.post_async_event(AsyncEvent(known, None, f"{self.name}: event {kind}"))

    def close(self) -> None:
        """Close the device: its thread, QPs, MRs, CQs, PDs, then the context."""
        if self._closed:
            return
        self._closed = True
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        self._worker.join(timeout=2.0)
        self._ep.close()
        os.close(self._stop_r)
        os.close(self._stop_w)
        for qp in list(self.qps.values()):
            qp.destroy()
        self._deregister_all()
        self._close_cqs()
        for pd in self._pds:
            if isinstance(pd, VerbsPd):
                pd.close()
        try:
            self.ctx.close()
        except Exception:
            pass


class VerbsPd(ProtectionDomain):
    """A protection domain of a :class:`VerbsDevice`: the device's PD and its MRs."""

    def __init__(self, device: VerbsDevice, pd_id: int) -> None:
        super().__init__(pd_id)
        self.device = device
        pv = binding.load()
        self._pv = pv
        try:
            self.ibv = pv.pd.PD(device.ctx)
        except pv.error.PyverbsError as exc:
            raise VerbsError(binding.errno_of(exc), f"alloc PD: {exc}") from exc
        self._registered: dict[int, tuple[Any, Any]] = {}
        """lkey -> (the device's MR, the ctypes array over the memory it pins)."""

    def alloc_mr(self, length: int, access: AccessFlag) -> MemoryRegion:
        """Register ``length`` fresh zeroed bytes (:func:`~smcr.rdma.base.zeroed_memory`).

        :raises VerbsError: EINVAL for a bad length; what the device says otherwise.
        """
        if length <= 0 or length > self.device.attr.max_mr_size:
            raise VerbsError(errno.EINVAL, f"MR length {length}")
        return self.reg_mr(zeroed_memory(length), access)

    def reg_mr(self, buffer: bytearray | memoryview, access: AccessFlag) -> MemoryRegion:
        """Register a caller's writable buffer with the device (module docstring).

        :raises VerbsError: EINVAL for a read-only or empty buffer, REMOTE_WRITE without
            LOCAL_WRITE; the device's errno (ENOMEM: pinned memory limit) otherwise.
        """
        if access & AccessFlag.REMOTE_WRITE and not access & AccessFlag.LOCAL_WRITE:
            raise VerbsError(errno.EINVAL, "REMOTE_WRITE needs LOCAL_WRITE")
        view = memoryview(buffer).cast("B")
        if view.readonly or not len(view):
            raise VerbsError(errno.EINVAL, "buffer is read-only or empty")
        array = (ctypes.c_char * len(view)).from_buffer(view)
        addr = ctypes.addressof(array)
        try:
            ibv_mr = self._pv.mr.MR(self.ibv, len(view), int(access), address=addr)
        except self._pv.error.PyverbsError as exc:
            raise VerbsError(binding.errno_of(exc), f"register {len(view)} bytes: {exc}") from exc
        mr = MemoryRegion(self, memoryview(array).cast("B"), addr=addr, key=int(ibv_mr.lkey),
                          access=access, on_dereg=self._dereg)  # fmt: skip
        mr.rkey = int(ibv_mr.rkey)
        self._registered[mr.lkey] = (ibv_mr, array)
        self.mrs[mr.lkey] = mr
        return mr

    def _dereg(self, mr: MemoryRegion) -> None:
        self.mrs.pop(mr.lkey, None)
        held = self._registered.pop(mr.lkey, None)
        if held is not None:
            try:
                held[0].close()
            except Exception:
                pass

    def create_qp(self, send_cq: CompletionQueue, recv_cq: CompletionQueue,
                  cap: QpCap | None = None, *, sq_sig_all: bool = False) -> VerbsQp:  # fmt: skip
        """An RC QP of the device, in RESET, completing into ``send_cq``/``recv_cq``.

        :raises VerbsError: EINVAL for CQs of another kind or capabilities above the
            device's; the device's errno otherwise.
        """
        if not isinstance(send_cq, VerbsCq) or not isinstance(recv_cq, VerbsCq):
            raise VerbsError(errno.EINVAL, "a verbs QP needs the verbs device's CQs")
        cap = cap or QpCap()
        a = self.device.attr
        if (max(cap.max_send_sge, cap.max_recv_sge) > a.max_sge
                or max(cap.max_send_wr, cap.max_recv_wr) > a.max_qp_wr):  # fmt: skip
            raise VerbsError(errno.EINVAL, f"QP capabilities {cap} above the device's")
        ctx = self.device.ctx
        scq, rcq = send_cq.part_for(ctx), recv_cq.part_for(ctx)
        self.device.watch(scq.fd, send_cq)
        self.device.watch(rcq.fd, recv_cq)
        qp = VerbsQp(self, self, send_cq, recv_cq, (scq.ibv, rcq.ibv), cap, sq_sig_all)
        self.device.qps[qp.qp_num] = qp
        return qp

    def dealloc(self) -> None:
        """Free the PD.

        :raises VerbsError: EBUSY while it still has memory regions.
        """
        if self.mrs:
            raise VerbsError(errno.EBUSY, "PD still has memory regions")
        self.close()

    def close(self) -> None:
        """Release the device's PD (its MRs first)."""
        for held in list(self._registered.values()):
            try:
                held[0].close()
            except Exception:
                pass
        self._registered.clear()
        try:
            self.ibv.close()
        except Exception:
            pass
