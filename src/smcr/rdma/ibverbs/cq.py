"""The completion queue of the verbs RNIC: the device's CQ, harvested by whoever polls.

Design (the why of each):

* **smcr's queue in front of the device's.**  The runtime polls, arms and sleeps on
  :class:`~smcr.rdma.completion.CompletionQueue` as with every RNIC; here a progress hook
  (:meth:`CompletionQueue.add_progress`) takes what the device's CQ holds
  (``ibv_poll_cq``) and queues it, in the thread that polls: no thread between the NIC
  and the thread that wants the completion.
* **The descriptor covers the completion channel.**  :meth:`VerbsCq.fileno` is an epoll
  descriptor holding smcr's doorbell and the CQ's completion channel, so a thread asleep
  on it (``select``, asyncio, :meth:`wait`) wakes when the NIC completes work.  The
  device CQ is kept armed (``ibv_req_notify_cq``) by the hook: it reads the channel's
  event, acknowledges it, arms again and only then polls, so a completion that comes
  after the poll raises the next event (the verbs rule that no completion is missed).
  Nobody polling costs no CPU: the runtime's progress thread sleeps on the descriptor.
* **Heard while nobody polls.**  The device's thread sleeps on every CQ's channel too
  (edge-triggered: once per event) and harvests when no thread is asleep on
  :meth:`VerbsCq.fileno` to do it (:meth:`VerbsCq.from_device`), pushing with a ring:
  what the CQ was armed for hears it, as the RoCE RNIC's progress thread rings it for its
  packets.  Above all the runtime's progress thread while it stands by on the standby
  descriptor, which only such a ring wakes (an event loop's connection: its application
  waits in ``select`` on the readiness descriptor, not here).
* **One queue over several devices.**  The runtime has one CQ for the links of all its
  RNICs, and a device's QP can only complete into a CQ of the same device: the first
  QP of another device gives the queue a device CQ there too (:meth:`VerbsCq.part_for`),
  with its own channel in the same epoll; the hook harvests them all.
* **One harvester at a time** (a lock): the event read, the arming and the poll must not
  interleave between two threads, or an event could be acknowledged twice.  The
  channel descriptor is non-blocking (:func:`smcr.rdma.ibverbs.binding.opening`), so a
  hook that finds no event moves on.
* **Failed completions name their queue** (:meth:`VerbsCq.attach`): verbs leaves the
  opcode of a failed completion undefined, and the runtime tells a receive from a send
  by it, so the QP that posted the work says which it was.
"""

from __future__ import annotations

import select
import socket
import threading
from typing import Any, Final, Protocol

from smcr.rdma.completion import ARM_PROGRESS, ARM_SLEEPER, EpollCq
from smcr.rdma.ibverbs import binding
from smcr.rdma.verbs import VerbsError, WcFlag, WcOpcode, WcStatus, WorkCompletion

#: Completions taken from the device's CQ per ``ibv_poll_cq``.
BATCH: Final = 32
IBV_WC_WITH_IMM: Final = 2
_OPCODES: Final = {int(op): op for op in WcOpcode}
_STATUSES: Final = {int(s): s for s in WcStatus}


class PostingQp(Protocol):
    """What a CQ asks of a QP whose work completes there (:meth:`VerbsCq.attach`)."""

    def failed(self, wr_id: int) -> WcOpcode:
        """Work ``wr_id`` completed with an error (the QP is in ERR): which queue it was on."""


class DeviceCq:
    """A device's CQ with its completion channel (and that channel's descriptor)."""

    def __init__(self, context: Any, depth: int) -> None:
        pv = binding.load()
        self.context = context
        try:
            with binding.opening() as fds:
                self.channel = pv.cq.CompChannel(context)
            if len(fds) != 1:
                raise VerbsError(5, f"the completion channel's descriptor not found ({fds})")
            self.fd = fds[0]
            self.ibv = pv.cq.CQ(context, depth, None, self.channel, 0)
            self.ibv.req_notify()
        except pv.error.PyverbsError as exc:
            raise VerbsError(binding.errno_of(exc), f"create CQ: {exc}") from exc

    def take_event(self) -> bool:
        """Read the channel's event, acknowledge it, arm again; False when none was there."""
        try:
            self.channel.get_cq_event(self.ibv)
        except Exception:  # EAGAIN: another look took it; or closed
            return False
        self.ibv.ack_events(1)
        self.ibv.req_notify()
        return True

    def close(self) -> None:
        """Destroy the CQ, then its channel (the device's close does it too)."""
        for obj in (self.ibv, self.channel):
            try:
                obj.close()
            except Exception:  # closing the device closes them too
                pass


class VerbsCq(EpollCq):
    """A :class:`CompletionQueue` fed by device CQs (module docstring).

    :param context: the pyverbs ``Context`` of the device that makes it.
    :param depth: entries of each device CQ.
    """

    def __init__(self, context: Any, depth: int) -> None:
        super().__init__(depth)
        first = DeviceCq(context, depth)
        self.channel_fd = first.fd
        """The channel of the device CQ made with it (the device that made it watches it)."""
        self._parts: dict[int, DeviceCq] = {first.fd: first}
        """The device CQs by their channel's descriptor."""
        self._ep.register(first.fd, select.EPOLLIN)
        self._harvest_lock = threading.Lock()
        self._qps: dict[int, PostingQp] = {}
        self.events = 0
        """Completion events read from the channels."""
        self.add_progress(self._harvest)

    def part_for(self, context: Any) -> DeviceCq:
        """The device CQ of ``context`` (the device of a QP that completes here), made on
        first use (module docstring); its channel's descriptor is for the device's thread
        to watch too."""
        with self._harvest_lock:
            for part in self._parts.values():
                if part.context is context:
                    return part
            part = DeviceCq(context, self.depth)
            self._parts[part.fd] = part
            self._ep.register(part.fd, select.EPOLLIN)
            return part

    def attach(self, qp_num: int, qp: PostingQp) -> None:
        """QP ``qp_num`` posts work completing here; it names the queue of its failed work
        (module docstring)."""
        self._qps[qp_num] = qp

    def detach(self, qp_num: int) -> None:
        """QP ``qp_num`` is gone."""
        self._qps.pop(qp_num, None)

    def from_device(self) -> None:
        """The device's thread saw the channel fire (module docstring): harvest and ring
        whom the CQ is armed for, unless a thread asleep on :meth:`fileno` was armed for
        (it wakes on the same event and takes it, with no thread between)."""
        if self._armed in (ARM_SLEEPER, ARM_PROGRESS):
            return
        self._harvest()

    def _harvest(self) -> None:
        """The progress hook (module docstring): channel events, re-arm, poll (the doorbell
        drained if rung: :meth:`EpollCq.ready_now`)."""
        with self._harvest_lock:
            ready = self.ready_now()
            if ready is None:
                return  # closed
            parts = self._parts
            for fd in ready:
                part = parts.get(fd)
                if part is not None and part.take_event():
                    self.events += 1
            out: list[WorkCompletion] = []
            for part in parts.values():
                self._poll_device(part.ibv, out)
        if out:
            self.push_many(out)

    def _poll_device(self, device_cq: Any, out: list[WorkCompletion]) -> None:
        while True:
            try:
                n, wcs = device_cq.poll(BATCH)
            except Exception:  # a CQ in error or closed: nothing to take
                return
            for wc in wcs:
                out.append(self._convert(wc))
            if n < BATCH:
                return

    def _convert(self, wc: Any) -> WorkCompletion:
        status = _STATUSES.get(wc.status, WcStatus.GENERAL_ERR)
        qp_num, wr_id = wc.qp_num, wc.wr_id
        if status is WcStatus.SUCCESS:
            opcode = _OPCODES.get(wc.opcode, WcOpcode.SEND)
        else:
            qp = self._qps.get(qp_num)
            opcode = qp.failed(wr_id) if qp is not None else WcOpcode.SEND
        flags = wc.wc_flags
        imm = socket.ntohl(wc.imm_data) if flags & IBV_WC_WITH_IMM else 0
        return WorkCompletion(wr_id=wr_id, status=status, opcode=opcode, qp_num=qp_num,
                              byte_len=wc.byte_len, imm_data=imm, wc_flags=WcFlag(flags & 15),
                              src_qp=wc.src_qp, vendor_err=wc.vendor_err)  # fmt: skip

    def close(self) -> None:
        """Release the descriptors and the device CQs (after their QPs)."""
        self._qps.clear()
        for part in self._parts.values():
            part.close()
        super().close()
