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
  reads a target takes it (a compare and exchange to 0: a plain store could erase an
  arm for another door that the consumer made after the load) and rings the door of the
  value it took: the CQ's doorbell for 1
  (:data:`~smcr.rdma.completion.ARM_SLEEPER`), its standby doorbell for 2
  (:data:`~smcr.rdma.completion.ARM_STANDBY`, handed to requesters whose hello asks for it;
  an older requester rings the doorbell for any target).

This is Dekker's pattern: with a fence between each side's store and load, at
least one of them sees the other's store, so either the sleeper's last poll
finds the SEND or the requester rings (x86-64 may reorder a store after a
later load, hence the fences; a ``threading.Lock`` round trip is a locked
instruction, a full barrier).  A requester clears the word only together with
a ring, so a cleared word always means "a ring is on its way or the consumer
is awake and will poll before it sleeps": no wakeup is lost.  Stale ones
(the consumer woke for another reason) cost a spurious wakeup, as before.

**Marks: a poll looks only at the QPs that have work.**  Many QPs share one CQ (a
runtime has one for all its link groups), and a poll used to run every QP's progress
hook, each a look at its receive area: with a thousand peers (or a thousand first
contacts that never finish) every poll cost a thousand looks.  Now each QP on the CQ
has a *mark* byte in the same shared segment (from :data:`MARKS` on), handed to its
requester at the hello; a requester stores ``produced``, then 1 in the mark (x86-64
keeps stores in order), and the poll finds the marked bytes (``find``, a ``memchr``),
clears them, fences, and only then runs those QPs' hooks, which load ``produced``.
Either the hook sees the new count or the requester's mark lands after the clear, and
the next poll finds it (the fence is what keeps the clear from passing the load).
With a few QPs (:data:`FEW`) a poll still looks at each: cheaper than the marks then.  A
requester that does not mark (an smcr before marks: its hello does not ask for one)
leaves its QP among the hooks every poll runs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Final

from smcr.rdma import bells
from smcr.rdma.bells import WatchSlot
from smcr.rdma.completion import ARM_SLEEPER, ARM_STANDBY, CompletionQueue
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm.words import fence, load_u32, store_u32

#: Offset of the armed word (u32) in a CQ's shared notification segment.
ARMED: Final = 0
MARKS: Final = 64
"""Offset of the first QP's mark byte (module doc)."""
MAX_MARKS: Final = 1 << 16
"""Mark bytes of one CQ (QPs past them are looked at by every poll, as unmarked ones)."""
NOTIFY_SIZE: Final = bells.WATCHES_END
"""The ARMED word, the nonce of the consumer bells, the mark bytes, the watch words
(:mod:`smcr.rdma.bells`)."""
FEW: Final = 4
"""Up to this many marked QPs a poll looks at each (as it did before marks): with one
or a few link groups that is cheaper than finding, clearing and fencing (a send and its
completion cost 0.85 us more through the marks, measured)."""


class ShmCompletionQueue(CompletionQueue):
    """A :class:`~smcr.rdma.completion.CompletionQueue` whose arming requesters can see."""

    def __init__(self, depth: int) -> None:
        super().__init__(depth)
        self.notify_fd, self._notify = lay.new_segment("smcr-cqnotify", NOTIFY_SIZE)
        self._notify_open = True
        """Until :meth:`close`: ``_notify.closed`` is a generic getattr on the mmap, a few
        hundred instructions per wait in the CQ's arming calls."""
        # armed from the start: a consumer that never arms still gets its first ring
        store_u32(self._notify, ARMED, ARM_SLEEPER)
        self._marked: dict[int, Callable[[], None]] = {}
        """Offset of a mark byte -> the progress hook of the QP whose requester marks it."""
        self._mark_of: dict[Callable[[], None], int] = {}
        self._free_marks: list[int] = []
        self._marks_end = MARKS
        """One past the highest mark byte handed out: where a poll's search ends."""
        self._marks_lock = threading.Lock()
        self.nonce = bells.publish_nonce(self._notify)
        """The bell nonce this CQ published (its process's when it was made; 0: none)."""
        self._watched: dict[int, int] = {}
        """Watch slot -> the rid that holds it."""
        self._runs: dict[Callable[[], None], Callable[[], None]] = {}
        """A QP's progress hook -> what polls call in its place (:meth:`set_peek`): the
        marks, the unmarked QPs' list and :attr:`_peeks` hold that."""
        self._peeks: dict[Callable[[], None], Callable[[], bool]] = {}
        """What polls call for a QP (its run) -> its look (:meth:`has_news`): whether the
        run would find SENDs to take."""

    def take_mark(self, hook: Callable[[], None]) -> int:
        """A mark byte for the QP whose progress hook is ``hook``, whose requester marks it
        from now on: polls run ``hook`` only when the byte is set (module doc).

        :returns: the byte's offset in the notification segment, or 0 when none is left
            (the hook then stays among those every poll runs).
        """
        with self._marks_lock:
            offset = self._mark_of.get(hook, 0)
            if not offset:
                if self._free_marks:
                    offset = self._free_marks.pop()
                elif self._marks_end < MARKS + MAX_MARKS:  # (the watch words follow)
                    offset = self._marks_end
                    self._marks_end += 1
                if offset:
                    self._mark_of[hook] = offset
                    self._marked = {**self._marked, offset: self._runs.get(hook, hook)}
        if not offset:
            self.add_progress(self._runs.get(hook, hook))
            return 0
        self.remove_progress(self._runs.get(hook, hook))
        if self._notify_open:
            self._notify[offset] = 1  # (whatever came before the requester marked)
        return offset

    def drop_mark(self, hook: Callable[[], None], scan: bool) -> None:
        """``hook``'s QP gives its mark back; with ``scan`` every poll runs the hook again
        (its next requester may not mark), otherwise it is gone."""
        with self._marks_lock:
            offset = self._mark_of.pop(hook, 0)
            if offset:
                self._marked = {k: v for k, v in self._marked.items() if k != offset}
                self._free_marks.append(offset)
                if self._notify_open:
                    self._notify[offset] = 0
        if scan:
            self.add_progress(self._runs.get(hook, hook))
        else:
            self.remove_progress(self._runs.get(hook, hook))

    def watch(self, token: int, rid: int) -> WatchSlot | None:
        """A watch word for the connection whose alert token is ``token``, whose readiness
        descriptor is named by ``rid`` (its requester rings it by name,
        :mod:`smcr.rdma.bells`); None when the slot is held by another connection, or
        the names are not the ones this CQ published (a forked child's)."""
        if not rid or not self.rings_by_name():
            return None
        slot = token & bells.WATCH_MASK
        with self._marks_lock:
            if slot in self._watched:
                return None
            self._watched[slot] = rid
        return WatchSlot(self._notify, bells.WATCHES + 4 * slot, rid)

    def rings_by_name(self) -> bool:
        """Whether :meth:`watch` can give consumer bells: this process's names are the ones
        the CQ published (not a forked child's)."""
        return (bool(self.nonce) and bells.NAMES.ready() and self.nonce == bells.NAMES.nonce
                and self._notify_open)  # fmt: skip

    def unwatch(self, slot: WatchSlot) -> None:
        """The connection of ``slot`` is gone (or rings by name no more)."""
        index = (slot.offset - bells.WATCHES) // 4
        with self._marks_lock:
            if self._watched.get(index) == slot.rid:
                del self._watched[index]
                slot.take()

    def set_peek(self, hook: Callable[[], None], peek: Callable[[], bool] | None,
                 run: Callable[[], None] | None = None) -> None:  # fmt: skip
        """``peek`` says whether ``hook`` (a QP's) would find SENDs to take, taking none
        (:meth:`has_news`); polls call ``run`` in the hook's place where given (the same
        work, in C: :func:`smcr.rdma.shm.send.c_looks`).  ``peek`` None forgets them (the
        hook is the key of the marks and of the unmarked QPs' list, :meth:`take_mark`)."""
        with self._marks_lock:
            peeks, runs = dict(self._peeks), dict(self._runs)
            if peek is None:
                peeks.pop(runs.pop(hook, hook), None)
            else:
                runs[hook] = run or hook
                peeks[runs[hook]] = peek
            self._peeks, self._runs = peeks, runs

    def has_news(self) -> bool:
        """Whether a poll would find something, taking nothing where a QP's look says
        (:meth:`set_peek`): a SEND left where the peer placed it is taken in place by the
        poll that follows (the consumer's lock held), where :meth:`has_completions` would
        have delivered it into a receive (a completion, a copy, the generic receive path:
        a blocking reader's spin paid that for every message).  A set mark byte counts
        as news as it is (the poll clears it)."""
        if self._wcs:
            return True
        peeks = self._peeks
        for hook in self._progress:
            peek = peeks.get(hook)
            if peek is None:
                hook()
            elif peek():
                return True
        marked = self._marked
        if len(marked) <= FEW:
            for hook in marked.values():
                peek = peeks.get(hook)
                if peek is None:
                    hook()
                elif peek():
                    return True
        else:
            try:
                if self._notify.find(b"\x01", MARKS, self._marks_end) >= 0:
                    return True
            except ValueError:  # closed (the device is going)
                return False
        return bool(self._wcs)

    def run_progress(self) -> None:
        """The hooks of unmarked QPs, then those of the QPs whose marks are set (cleared
        first, then a fence: the module doc says why)."""
        for hook in self._progress:
            hook()
        marked = self._marked
        if len(marked) <= FEW:  # a look at each costs less than finding their marks
            for look in marked.values():
                look()
            return
        end = self._marks_end
        notify = self._notify
        found: list[int] = []
        try:
            find = notify.find
            at = find(b"\x01", MARKS, end)
            while at >= 0:
                notify[at] = 0
                found.append(at)
                at = find(b"\x01", at + 1, end)
        except ValueError:  # closed (the device is going)
            return
        if not found:
            return
        fence()
        for at in found:
            work = marked.get(at)
            if work is not None:
                work()

    def req_notify(self, target: int = ARM_SLEEPER) -> None:
        """Arm for local completions and for peers' SENDs, then fence (module doc); the
        word holds ``target``, which names the doorbell a requester rings."""
        super().req_notify(target)
        if self._notify_open:
            store_u32(self._notify, ARMED, target)
            fence()

    def take_arm(self) -> int:
        """Disarm for local completions and for peers' SENDs (:meth:`CompletionQueue.take_arm
        <smcr.rdma.completion.CompletionQueue.take_arm>`).  A requester that finds the word
        cleared rings nobody: the caller's look after it arms again finds its SEND."""
        armed = super().take_arm()
        notify = self._notify
        if not self._notify_open:
            return armed
        word: int = load_u32(notify, ARMED)
        if word:
            store_u32(notify, ARMED, 0)
            return word
        return armed

    def take_standby(self) -> bool:
        """As :meth:`CompletionQueue.take_standby
        <smcr.rdma.completion.CompletionQueue.take_standby>`, the word too (a requester that
        reads 0 rings nobody: the poller looks)."""
        taken = super().take_standby()
        notify = self._notify
        if self._notify_open and load_u32(notify, ARMED) == ARM_STANDBY:
            store_u32(notify, ARMED, 0)
            return True
        return taken

    def close(self) -> None:
        """Release the descriptors and the notification segment."""
        super().close()
        if self._notify_open:
            self._notify_open = False
            self._notify.close()
            os.close(self.notify_fd)


def cq_watch(cq: CompletionQueue, hook: Callable[[], None], peek: Callable[[], bool],
             run: Callable[[], None] | None = None) -> None:  # fmt: skip
    """A new QP whose progress hook is ``hook`` receives on ``cq``; ``peek`` says whether the
    hook would find SENDs (:meth:`ShmCompletionQueue.has_news`), ``run`` does what it does
    (:meth:`ShmCompletionQueue.set_peek`).  A shm CQ looks at it only from a requester's
    hello on (:func:`cq_requester`): nobody can place a SEND before a hello maps the QP's
    area; another CQ runs the hook at every poll."""
    if isinstance(cq, ShmCompletionQueue):
        cq.set_peek(hook, peek, run)
    else:
        cq.add_progress(hook)


def cq_requester(cq: CompletionQueue, hook: Callable[[], None], marks: bool) -> int:
    """A requester said hello to ``hook``'s QP: one that ``marks`` gets the QP's mark byte
    (its offset; polls run ``hook`` when it is set), another (an smcr before marks) has
    every poll run ``hook`` (0)."""
    if not isinstance(cq, ShmCompletionQueue):
        return 0
    if marks:
        return cq.take_mark(hook)
    cq.drop_mark(hook, scan=True)
    return 0


def cq_forget(cq: CompletionQueue, hook: Callable[[], None]) -> None:
    """``hook``'s QP is destroyed: no poll runs it any more."""
    if isinstance(cq, ShmCompletionQueue):
        cq.drop_mark(hook, scan=False)
        cq.set_peek(hook, None)
    else:
        cq.remove_progress(hook)
