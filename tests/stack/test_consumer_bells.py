"""Consumer bells (``smcr.rdma.bells``) and the readiness descriptor that has one
(``smcr.stack.readiness.Readiness``): the requester's side is played here by a mapping
of the CQ's notification segment, as a peer process maps it."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from smcr.rdma import bells, doorbell
from smcr.rdma.bells import WatchSlot
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm.cq import ShmCompletionQueue
from smcr.rdma.stores import store_u32
from smcr.stack import readiness as readiness_mod
from smcr.stack.readiness import CHECK_DELAY, CHECK_GRAIN, DeferredChecks, Readiness

_CLONE_NEWNET = 0x40000000

TOKEN = 7


@pytest.fixture
def cq() -> Iterator[ShmCompletionQueue]:
    q = ShmCompletionQueue(64)
    yield q
    q.close()


Belled = tuple[Readiness, WatchSlot, mmap.mmap, bytes]
"""A descriptor with a bell for :data:`TOKEN`, the peer's mapping of the CQ's notification
segment, and the bell names' prefix there."""


@pytest.fixture
def belled(cq: ShmCompletionQueue) -> Iterator[Belled]:
    r, bell = _with_bell(cq)
    notify, prefix = _peer(cq)
    yield r, bell, notify, prefix
    r.close()
    notify.close()


def _events(r: Readiness) -> int:
    p = select.poll()
    p.register(r.fileno(), select.POLLIN | select.POLLOUT)
    got = p.poll(0)
    return got[0][1] if got else 0


def _queued(r: Readiness) -> int:
    """Datagrams waiting on the descriptor (read out; the caller's state is spoiled)."""
    n = 0
    try:
        while True:
            r.a.recv(64, socket.MSG_DONTWAIT)
            n += 1
    except BlockingIOError:
        return n


def _with_bell(cq: ShmCompletionQueue, token: int = TOKEN,
               later: DeferredChecks | None = None) -> tuple[Readiness, WatchSlot]:  # fmt: skip
    r = Readiness(named=True)
    r.attach(cq, token, later)
    assert r.rid and r.bell is not None
    return r, r.bell


def _armed(bell: WatchSlot) -> bool:
    """(A call: mypy would take an ``assert`` on the attribute for a narrowing.)"""
    return bell.armed


def _peer(cq: ShmCompletionQueue) -> tuple[mmap.mmap, bytes]:
    notify = lay.map_segment(os.dup(cq.notify_fd))
    prefix = bells.peer_prefix(notify)
    assert prefix and bells.probe(prefix)
    return notify, prefix


def test_a_peer_rings_an_armed_bell_and_the_descriptor_turns_readable(belled: Belled) -> None:
    r, bell, notify, prefix = belled
    r.set(False, True, quiet=True)
    assert r.looks and _armed(bell)
    assert _events(r) == select.POLLOUT
    assert bells.ring_consumer(notify, prefix, TOKEN)
    assert _events(r) == select.POLLIN | select.POLLOUT
    assert not bells.ring_consumer(notify, prefix, TOKEN)
    # the runtime takes the message: readable, and no second datagram of its own
    r.set(True, True, quiet=True)
    assert bell.rung == 1 and not _armed(bell)
    r.set(False, True, quiet=True)  # (read out: drained, armed again)
    assert _events(r) == select.POLLOUT and _armed(bell)


def test_one_datagram_per_message(belled: Belled) -> None:
    r, _bell, notify, prefix = belled
    r.set(False, True, quiet=True)
    assert bells.ring_consumer(notify, prefix, TOKEN)
    r.set(True, True, quiet=True)
    assert _queued(r) == 1


def test_an_arm_taken_without_a_datagram_is_rung_by_the_consumer(belled: Belled) -> None:
    """A requester that died between taking the arm and sending: the consumer that takes
    the message finds no datagram and makes the descriptor readable itself."""
    r, bell, notify, _ = belled
    r.set(False, True, quiet=True)
    lay.U32.pack_into(notify, bell.offset, 0)
    r.set(True, True, quiet=True)
    assert _events(r) & select.POLLIN


def _unchecked(r: Readiness) -> bool:
    """(A call, as :func:`_armed`.)"""
    return r.unchecked


def _take_on_trust(r: Readiness) -> None:
    """Turn readable as a reader that took the CQ's news does (``DataPath.take_news``)."""
    r.defer_check = True
    try:
        r.set(True, True, quiet=True)
    finally:
        r.defer_check = False


def test_a_reader_that_reads_everything_drains_without_looking_for_the_ring(
        belled: Belled) -> None:  # fmt: skip
    """Readable on a peer's ring taken on trust, then read out: the drain takes the
    datagram, nothing is looked at, and the bell is armed again."""
    r, bell, notify, prefix = belled
    r.set(False, True, quiet=True)
    assert bells.ring_consumer(notify, prefix, TOKEN)
    _take_on_trust(r)
    assert _unchecked(r) and bell.rung == 1
    r.set(False, True, quiet=True)
    assert not _unchecked(r)
    r.check()  # (nothing left to check)
    assert _events(r) == select.POLLOUT and _armed(bell)


@pytest.mark.parametrize("came", [True, False])
def test_a_ring_taken_on_trust_is_checked_when_the_read_leaves_it_readable(
        belled: Belled, came: bool) -> None:  # fmt: skip
    """A reader that leaves bytes behind checks the ring it trusted: one datagram either
    way, the peer's if it came, else the consumer's own (a requester that died between
    taking the arm and sending)."""
    r, bell, notify, prefix = belled
    r.set(False, True, quiet=True)
    if came:
        assert bells.ring_consumer(notify, prefix, TOKEN)
    else:
        lay.U32.pack_into(notify, bell.offset, 0)
    _take_on_trust(r)
    assert _unchecked(r)
    assert bool(_events(r) & select.POLLIN) == came  # (not rung yet when it never came)
    r.check()
    assert not _unchecked(r) and _events(r) & select.POLLIN
    assert _queued(r) == 1


def _pending(later: DeferredChecks) -> list[Readiness]:
    """(A call, as :func:`_armed`.)"""
    return [r for _, r in later.pending]


Deferred = tuple[Readiness, DeferredChecks, mmap.mmap, bytes]
"""As :data:`Belled`, with the deferred checks the descriptor was attached with instead
of its bell."""


@pytest.fixture
def deferred(cq: ShmCompletionQueue) -> Iterator[Deferred]:
    later = DeferredChecks()
    r, _bell = _with_bell(cq, later=later)
    notify, prefix = _peer(cq)
    yield r, later, notify, prefix
    r.close()
    notify.close()


@pytest.mark.parametrize("came", [True, False])
def test_a_ring_that_another_calls_news_turned_readable_is_checked_later(
        deferred: Deferred, came: bool) -> None:  # fmt: skip
    """News that another call took (an event loop's read of one connection takes every
    connection's CDCs) turns a rung descriptor readable on trust: its datagram is looked
    for only once :data:`CHECK_DELAY` has passed, then one datagram either way."""
    r, later, notify, prefix = deferred
    r.set(False, True, quiet=True)
    if came:
        assert bells.ring_consumer(notify, prefix, TOKEN)
    else:  # (a requester that died between taking the arm and sending)
        assert r.bell is not None
        lay.U32.pack_into(notify, r.bell.offset, 0)
    r.set(True, True, quiet=True)
    r.set(True, True, quiet=True)  # (again: still one check waits)
    assert _unchecked(r) and _pending(later) == [r] and later.due
    assert bool(_events(r) & select.POLLIN) == came  # nothing looked at, nothing rung
    later.run(later.due - CHECK_DELAY / 2)  # (not yet)
    assert _unchecked(r) and _pending(later) == [r]
    later.run(later.due)
    assert not _unchecked(r) and not _pending(later) and not later.due
    assert _events(r) & select.POLLIN and _queued(r) == 1


def test_deferred_checks_share_their_times(cq: ShmCompletionQueue) -> None:
    """Checks fall due on a grid (:data:`CHECK_GRAIN`): never before their delay, at most
    a grain after it, and those added within one grain together (one wake-up for all)."""
    later = DeferredChecks()
    made = [Readiness(named=True) for _ in range(20)]
    try:
        for r in made:
            r.attach(cq, TOKEN, later)
        dues = []
        start = time.monotonic()
        for r in made:
            before = time.monotonic()
            later.add(r)
            due = later.pending[-1][0]
            assert before + CHECK_DELAY <= due <= time.monotonic() + CHECK_DELAY + CHECK_GRAIN
            assert abs(due / CHECK_GRAIN - round(due / CHECK_GRAIN)) < 1e-6
            dues.append(due)
        grains_crossed = int((time.monotonic() - start) / CHECK_GRAIN) + 1  # (a loaded host)
        assert len(set(dues)) <= 1 + grains_crossed  # one time per grain the adds spanned
        later.run(dues[0])  # (the first time: every check due then, none after)
        assert [due for due, _ in later.pending] == [d for d in dues if d > dues[0]]
        assert sum(r.check_pending for r in made) == len(later.pending)
    finally:
        for r in made:
            r.close()


def test_each_deferred_check_waits_its_own_delay(cq: ShmCompletionQueue) -> None:
    """Two descriptors turned readable apart: the first one's time looks at it alone."""
    later = DeferredChecks()
    first, second = Readiness(named=True), Readiness(named=True)
    try:
        for r in (first, second):
            r.attach(cq, TOKEN, later)
        first.unchecked = True
        later.add(first)
        first_due = later.due
        later.pending[0] = (first_due - 1.0, first)  # (turned readable a while ago)
        later.due = first_due - 1.0
        second.unchecked = True
        later.add(second)
        later.run(first_due - 0.5)
        assert not _unchecked(first) and _unchecked(second)
        assert _pending(later) == [second] and later.due >= first_due
        later.run(later.due)
        assert not _unchecked(second) and not _pending(later) and not later.due
    finally:
        first.close()
        second.close()


def test_a_ring_read_out_before_its_check_is_not_looked_for(deferred: Deferred) -> None:
    """The program reads the connection (the drain takes the datagram) before the check:
    the check then finds nothing to do and rings nothing."""
    r, later, notify, prefix = deferred
    r.set(False, True, quiet=True)
    assert bells.ring_consumer(notify, prefix, TOKEN)
    r.set(True, True, quiet=True)
    r.set(False, True, quiet=True)  # (read out)
    assert not _unchecked(r) and _pending(later) == [r]
    later.run(later.due)
    assert _events(r) == select.POLLOUT and r.bell is not None and _armed(r.bell)
    # a closed descriptor's check fails quietly
    r.set(False, True, quiet=True)
    assert bells.ring_consumer(notify, prefix, TOKEN)
    r.set(True, True, quiet=True)
    r.close()
    later.run(later.due)
    assert not _pending(later)


def test_a_late_datagram_is_settled_and_the_bell_armed_again(belled: Belled) -> None:
    r, bell, notify, prefix = belled
    r.set(False, True, quiet=True)
    assert bells.ring_consumer(notify, prefix, TOKEN)
    assert _events(r) & select.POLLIN  # (readable, but the message was taken meanwhile)
    assert r.settle()
    assert _events(r) == select.POLLOUT and _armed(bell)


def test_no_arm_while_bytes_of_ours_wait_or_unwritable(belled: Belled) -> None:
    """A window update rung to a program that waits for writability only would be heard by
    nobody: the bell is armed only when a message could change readability alone."""
    r, bell, notify, prefix = belled
    r.set(False, True, quiet=False)
    assert not _armed(bell)
    assert not bells.ring_consumer(notify, prefix, TOKEN)
    r.set(False, False, quiet=True)
    assert not _armed(bell) and _events(r) == 0
    r.set(False, True, quiet=True)
    assert _armed(bell) and _events(r) == select.POLLOUT
    r.set(False, True, quiet=False)  # (a send left bytes waiting: the arm taken back)
    assert not _armed(bell)
    assert not bells.ring_consumer(notify, prefix, TOKEN)


def test_a_ring_after_the_arm_was_taken_back_asks_for_a_look(belled: Belled) -> None:
    r, _bell, notify, prefix = belled
    r.set(False, True, quiet=True)
    r.looks = False
    assert bells.ring_consumer(notify, prefix, TOKEN)
    r.set(False, True, quiet=False)
    assert r.looks  # (the peer's message rang nobody else: the caller looks at the CQ)


def test_slots_are_not_shared_and_come_back(cq: ShmCompletionQueue) -> None:
    r, _ = _with_bell(cq)
    other = Readiness(named=True)
    other.attach(cq, TOKEN + bells.WATCH_SLOTS)
    assert other.bell is None  # (its slot is held: the CQ's path)
    r.close()
    third, _bell = _with_bell(cq, TOKEN + bells.WATCH_SLOTS)
    third.close()
    other.close()


def test_a_taken_name_leaves_a_socket_pair(cq: ShmCompletionQueue) -> None:
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    squatter.bind(bells.NAMES.name(bells.NAMES.rid + 1))  # (the next one's name)
    r = Readiness(named=True)
    assert not r.rid
    r.attach(cq, TOKEN)
    assert r.bell is None  # (no name: no bell, the CQ's path)
    r.set(True, True)
    assert _events(r) == select.POLLIN | select.POLLOUT
    r.set(False, False)
    assert _events(r) == 0
    r.close()
    squatter.close()


@pytest.mark.parametrize("named", [True, False])
def test_a_descriptor_follows_what_it_is_told(named: bool) -> None:
    r = Readiness(named)
    assert bool(r.rid) == named
    assert _events(r) == select.POLLOUT
    r.set(True, True)
    assert _events(r) == select.POLLIN | select.POLLOUT
    r.set(True, False)
    assert _events(r) == select.POLLIN
    r.set(False, False)
    assert _events(r) == 0
    r.set(False, True)
    assert _events(r) == select.POLLOUT
    r.close()


@pytest.mark.parametrize("named", [True, False])
def test_fail_makes_it_ready_for_good_with_an_error(named: bool) -> None:
    """As a TCP socket whose connect failed: readable, writable, EPOLLERR and EPOLLHUP."""
    r = Readiness(named)
    r.set(False, False)
    r.fail()
    ev = _events(r)
    assert ev & select.POLLIN and ev & select.POLLOUT, ev
    assert ev & select.POLLERR and ev & select.POLLHUP, ev
    r.set(False, False)  # (changes nothing now)
    assert _events(r) & select.POLLIN
    r.close()


def _wait_events(ep: select.epoll, seen: list[int]) -> None:
    seen.extend(events for _, events in ep.poll(20))


def test_a_poller_woken_by_fail_sees_the_error_no_later_than_writability() -> None:
    """A program waiting for ``EPOLLOUT`` on a non-blocking connect that fails is woken
    with ``EPOLLERR`` in its events, as over TCP: never writable alone (a refused connect
    that looks like a made one).  A thread waits in epoll while another fails the
    descriptor, many times over (the wake-up races the steps of :meth:`fail`); at the
    end every event of a refused connect is there."""
    alone = 0
    for _ in range(300):
        r = Readiness(named=True)
        r.set(False, False)
        ep = select.epoll()
        ep.register(r.fileno(), select.EPOLLOUT | select.EPOLLERR)
        seen: list[int] = []
        waiter = threading.Thread(target=_wait_events, args=(ep, seen))
        waiter.start()
        r.fail()
        waiter.join()
        ep.close()
        ev = _events(r)
        r.close()
        assert seen, "no event in 20 s"
        alone += not seen[0] & select.EPOLLERR
        assert ev & select.POLLOUT and ev & select.POLLERR and ev & select.POLLHUP, ev
    assert alone == 0


def test_an_older_consumer_is_never_rung_by_name() -> None:
    """A notification segment without watch words (an older smcr) has no bell prefix."""
    fd, short = lay.new_segment("old-notify", 64 + (1 << 16))
    try:
        assert bells.peer_prefix(short) == b""
    finally:
        short.close()
        os.close(fd)


def test_a_strangers_datagram_is_drained_and_the_arm_kept(belled: Belled) -> None:
    """Anyone in the network namespace can write to a name: a read that finds nothing makes
    the descriptor unreadable again, and the bell stays armed for the peer."""
    r, bell, _, _ = belled
    r.set(False, True, quiet=True)
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stranger.sendto(b"x", bells.NAMES.name(r.rid))
    assert _events(r) & select.POLLIN
    assert not r.settle()  # (no look needed: nobody took the arm)
    assert _events(r) == select.POLLOUT and _armed(bell) and bell.holds()
    stranger.close()


# ---------------------------------------------------------------- without a sink of its own


def test_a_named_descriptor_is_one_socket_and_shares_the_full_peer() -> None:
    """Not writable by being connected to the process's full peer: no second socket per
    descriptor, one peer for all of them."""
    many = [Readiness(named=True) for _ in range(50)]
    try:
        for r in many:
            assert r.rid and r.b is None
            r.set(False, False)
        assert all(_events(r) == 0 for r in many)
        assert len({id(r.peer) for r in many}) == 1 and many[0].peer is not None
        for r in many:
            r.set(True, True)
        assert all(_events(r) == select.POLLIN | select.POLLOUT for r in many)
    finally:
        for r in many:
            r.close()


def test_turning_writable_wakes_an_edge_triggered_poller() -> None:
    r = Readiness(named=True)
    ep = select.epoll()
    try:
        r.set(False, False)
        ep.register(r.fileno(), select.EPOLLIN | select.EPOLLOUT | select.EPOLLET)
        assert ep.poll(0) == []
        r.set(False, True)
        assert ep.poll(0) == [(r.fileno(), select.EPOLLOUT)]
        r.set(True, True)
        assert ep.poll(0) == [(r.fileno(), select.EPOLLIN | select.EPOLLOUT)]
    finally:
        ep.close()
        r.close()


def test_readable_stays_readable_when_it_turns_writable() -> None:
    """Leaving the full peer drops the socket's queue (Linux ``unix_dgram_disconnected``):
    the descriptor is rung again, one datagram as before."""
    r = Readiness(named=True)
    try:
        r.set(True, False)
        assert _events(r) == select.POLLIN
        r.set(True, True)
        assert _events(r) == select.POLLIN | select.POLLOUT
        assert _queued(r) == 1
    finally:
        r.close()


def test_a_peer_cannot_ring_while_not_writable_and_the_descriptor_rings_itself(
        deferred: Deferred) -> None:  # fmt: skip
    """A requester that took the arm as the descriptor turned not writable and readable
    at once: its datagram is refused (only the full peer may send now; it rings the CQ
    instead), so the descriptor rings itself rather than trust it until its check."""
    r, later, notify, prefix = deferred
    bell = r.bell
    assert bell is not None
    r.set(False, True, quiet=True)
    assert _armed(bell)
    rid = bells._U32_UNPACK(notify, bell.offset)[0]
    store_u32(notify, bell.offset, 0)  # a requester takes the arm...
    r.set(True, False)  # (the runtime meanwhile: readable, and the send buffer full)
    assert not bells.ring_name(prefix, rid)  # ...and its datagram is refused (EPERM)
    assert _events(r) == select.POLLIN and not r.unchecked and not later.pending


def test_rings_past_the_full_peers_send_buffer_go_through_a_fresh_one(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Not writable, a descriptor is rung by its full peer, each unread ring counted against
    that peer's send buffer: when it is full a new full peer takes the descriptor over and
    rings it."""
    small = readiness_mod.FullPeer()
    small.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # (the kernel's least)
    here = readiness_mod.netns_of(small.sock)
    monkeypatch.setattr(readiness_mod, "_FULL_PEERS", {here: [small]})
    many = [Readiness(named=True) for _ in range(60)]
    try:
        for r in many:
            r.set(False, False)
        for r in many:
            r.set(True, False)
        assert all(_events(r) == select.POLLIN for r in many)  # (readable, still not writable)
        assert len(readiness_mod._FULL_PEERS[here]) > 1
    finally:
        for r in many:
            r.close()
        for peer in readiness_mod._FULL_PEERS[here]:
            peer.close()


def _unix_abstract_hash(name: bytes) -> int:
    """Linux's chain for an abstract datagram name (``unix_abstract_hash``: the 16-bit
    ones'-complement sum of the address, folded, its two bytes XORed, ``SOCK_DGRAM``
    mixed in, 256 chains)."""
    addr = socket.AF_UNIX.to_bytes(2, "little") + name + b"\0" * (len(name) % 2)
    total = sum(int.from_bytes(addr[i:i + 2], "little") for i in range(0, len(addr), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    folded = ~total & 0xFFFF
    folded ^= folded >> 8
    folded ^= socket.SOCK_DGRAM
    return 0xFF & ~folded


def test_the_bell_names_of_many_connections_spread_over_the_kernels_name_chains() -> None:
    """Every ring looks its name up in the kernel, walking the chain its name hashes to: the
    names of 2,048 consecutive readiness descriptors use nearly every one of the 256
    chains, a ring walking at most twice the fewest names possible on average (names with
    the rid in digits used a fifth of them, a ring walking ~85); every name distinct and
    printable (``/proc/net/unix`` shows them as they are)."""
    prefix = bells.prefix_of(0x0123456789ABCDEF)
    counts: dict[int, int] = {}
    for rid in range(1000, 3048):
        chain = _unix_abstract_hash(doorbell.bell_name(prefix, rid))
        counts[chain] = counts.get(chain, 0) + 1
    walked = sum(n * n for n in counts.values()) / 2048  # names compared per ring, on average
    assert len(counts) >= 240 and walked <= 2 * (2048 / 256 + 1)
    names = {doorbell.bell_name(prefix, rid) for rid in range(0, 5000)}
    assert len(names) == 5000
    assert all(name[1:].decode("ascii").isprintable() for name in names)


def test_a_threads_readiness_descriptors_know_its_network_namespace() -> None:
    """Names, and so full peers, are per network namespace: a descriptor made in a thread
    that moved to another namespace is connected to a full peer of that namespace, and no
    full peer of the process's namespace is made there (its sockets would not reach the
    names of this one).  The namespace is read from the descriptor's socket itself."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        here = readiness_mod.netns_of(probe)
    found: dict[str, object] = {}

    def elsewhere() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNET) != 0:  # (this thread only)
            found["error"] = os.strerror(ctypes.get_errno())
            return
        r = Readiness(named=True)
        try:
            found["there"] = r.netns
            r.set(False, False)  # not writable: connected to its namespace's full peer
            found["events"] = _events(r)
            try:
                readiness_mod.full_peer(here, fresh=True)
            except OSError as exc:
                found["made here"] = exc.errno
        finally:
            r.close()

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join()
    assert "error" not in found, found
    assert found["there"] != here and found["there"] in readiness_mod._FULL_PEERS
    assert found["events"] == 0  # (neither readable nor writable)
    assert found["made here"] == errno.EXDEV
    for peer in readiness_mod._FULL_PEERS.pop(found["there"]):
        peer.close()
