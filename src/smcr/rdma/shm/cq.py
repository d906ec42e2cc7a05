"""The completion queue of the shm RNIC: doorbells only for a CQ that is about to sleep.

Design: a requester that places a SEND in its peer's receive area must make
sure the peer's thread notices it.  Ringing the peer CQ's doorbell (a socket
write) on every SEND costs a syscall, and worse, the wakeup's scheduler hint
puts the woken peer on the ringer's CPU: on a two-core host a streaming
sender and receiver then take turns instead of running side by side.  Real
RNICs have the answer, ``ibv_req_notify_cq``: the consumer *arms* its CQ just
before it sleeps, and the device raises an event only for an armed CQ.

Here the armed flag lives in a one-page shared segment (``ARMED`` word) that
the responder hands to each requester at RTR along with the doorbell:

* the sleeper (:meth:`ShmCompletionQueue.req_notify`) stores 1, then -- after
  a full fence -- polls once more, and only then sleeps;
* a requester stores ``produced``, fences, loads the word, and only when it
  reads 1 stores 0 and rings.

This is Dekker's pattern: with a fence between each side's store and load, at
least one of them sees the other's store, so either the sleeper's last poll
finds the SEND or the requester rings (x86-64 may reorder a store after a
later load, hence the fences; a ``threading.Lock`` round trip is a locked
instruction, a full barrier).  A requester clears the word only together with
a ring, so a cleared word always means "a ring is on its way or the consumer
is awake and will poll before it sleeps": no wakeup is lost.  Stale ones
(the consumer woke for another reason) cost a spurious wakeup, as before.
"""

from __future__ import annotations

import os
import threading

from smcr.rdma.base import CompletionQueue
from smcr.rdma.shm import layout as lay

#: Offset of the armed word (u32) in a CQ's shared notification segment.
ARMED = 0
NOTIFY_SIZE = 64
_FENCE = threading.Lock()


def fence() -> None:
    """A full memory barrier (a lock round trip is a locked instruction on x86-64)."""
    _FENCE.acquire()
    _FENCE.release()


class ShmCompletionQueue(CompletionQueue):
    """A :class:`~smcr.rdma.base.CompletionQueue` whose arming requesters can see."""

    def __init__(self, depth: int) -> None:
        super().__init__(depth)
        self.notify_fd, self._notify = lay.new_segment("smcr-cqnotify", NOTIFY_SIZE)
        # armed from the start: a consumer that never arms still gets its first ring
        lay.U32.pack_into(self._notify, ARMED, 1)

    def req_notify(self) -> None:
        """Arm for local completions and for peers' SENDs, then fence (module doc)."""
        super().req_notify()
        if not self._notify.closed:
            lay.U32.pack_into(self._notify, ARMED, 1)
            fence()

    def close(self) -> None:
        """Release the descriptors and the notification segment."""
        super().close()
        if not self._notify.closed:
            self._notify.close()
            os.close(self.notify_fd)
