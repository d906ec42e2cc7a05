"""No news waits for a sleeper that nobody rings: when a thread blocked in ``recv`` on one
connection returns, the news of another connection that came right after it is taken at
once (the progress thread takes over), not when some poller's sleep runs out."""

from __future__ import annotations

import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import smcr
from smcr.rdma.roce.device import RoceDevice
from smcr.stack.counters import COUNTERS
from smcr.stack.progress import STANDBY
from tests.socket import smc_peer
from tests.socket.conftest import RNICS, Peer, rnics
from tests.support import voluntary_switches

TRIALS = 10


def test_threads_blocked_on_their_own_connections_miss_no_wakeup() -> None:
    """Two client threads, a connection each, blocking round trips against a server with a
    thread per connection: one thread at a time sleeps on the CQ for everyone, the other
    waits for it, and the CQ's arm word changes hands between them and the progress
    thread's standby at every round trip.  A requester that cleared the word with a plain
    store after loading it could erase the arm a poller made in between (its 1 over the
    standby's 2, rung at the standby's door): the poller slept on with its news in the
    queue, and both threads waited a whole second (in about one run of 20,000 round trips
    in five).  Generous: a round trip takes microseconds, a missed wake-up a second."""
    size, rounds, threads = 100, 6000, 2
    peer = Peer(smc_peer.threaded_echo_server, threads, size)
    try:
        port = peer.recv()
        conns = [smcr.create_connection(("127.0.0.1", port), timeout=20) for _ in range(threads)]
        assert all(c.smc_info().mode == "SMCR" for c in conns)
        slowest = [0.0] * threads
        failed: list[BaseException] = []

        def run(i: int) -> None:
            conn, msg, buf = conns[i], bytes([i]) * size, bytearray(size)
            try:
                for _ in range(rounds):
                    began = time.monotonic()
                    conn.sendall(msg)
                    assert conn.recv_into(buf, size, socket.MSG_WAITALL) == size
                    slowest[i] = max(slowest[i], time.monotonic() - began)
                    assert buf == msg
            except BaseException as e:  # (reported by the test's thread)
                failed.append(e)

        workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert not failed, failed
        assert max(slowest) < 0.5, slowest
        for c in conns:
            c.close()
        assert peer.recv() == "done"
    finally:
        peer.stop()


def test_news_after_a_blocked_reader_returns_is_taken_at_once() -> None:
    """Two threads used to sleep on the CQ's doorbell (the blocked reader and the progress
    thread); the reader drained it, and the progress thread slept on, the CQ unarmed, so
    the second connection's byte waited up to a second (a third of the trials).  A
    generous bound: the figure is about 10 ms (the progress thread's look-in)."""
    peer = Peer(smc_peer.two_conn_server)
    try:
        port = peer.recv()
        first = smcr.create_connection(("127.0.0.1", port), timeout=20)
        second = smcr.create_connection(("127.0.0.1", port), timeout=20)
        assert first.smc_info().mode == second.smc_info().mode == "SMCR"
        first.settimeout(None)
        delays = []
        for _ in range(TRIALS):
            got = threading.Event()

            def read(done: threading.Event = got) -> None:
                first.recv(1)
                done.set()

            reader = threading.Thread(target=read)
            reader.start()
            time.sleep(0.2)  # (the reader polls; the progress thread stands by)
            peer.ctl.send("go")
            assert got.wait(10)
            began = time.monotonic()
            readable, _, _ = select.select([second.fileno()], [], [], 5)
            delays.append(time.monotonic() - began)
            assert readable and second.recv(1) == b"y"
            reader.join(10)
        assert max(delays) < 0.5, sorted(delays)
        peer.ctl.send("quit")
        first.close()
        second.close()
    finally:
        peer.stop()


def test_an_answer_awaited_in_select_after_a_blocking_recv_is_taken_at_once() -> None:
    """A program that waits in a blocking ``recv`` and then, on the same connection, in
    ``select`` (a client with a timeout, then an event loop): the peer's next answer makes
    the connection readable when it comes.  The thread that polled while it waited in
    ``recv`` arms the CQ for the progress thread's standby when it returns; before, nobody
    was armed and the answer waited for the standing-by progress thread's next look-in,
    100 ms every time (TCP: about 0.1 ms).  A generous bound on the median: the figure
    is under a millisecond."""
    peer = Peer(smc_peer.echo_server)
    try:
        port = peer.recv()
        with smcr.create_connection(("127.0.0.1", port), timeout=20) as conn:
            assert conn.smc_info().mode == "SMCR"
            delays = []
            for _ in range(TRIALS * 2):
                conn.sendall(b"a")
                assert conn.recv(1) == b"a"  # (a short blocking wait: this thread polls)
                began = time.monotonic()
                conn.sendall(b"b")
                readable, _, _ = select.select([conn], [], [], 5)
                delays.append(time.monotonic() - began)
                assert readable and conn.recv(1) == b"b"
                time.sleep(0.02)  # (the progress thread stands by meanwhile, as it would)
            delays.sort()
            assert delays[len(delays) // 2] < 0.03, delays
        assert peer.recv()[0] == "SMCR"
    finally:
        peer.stop()


def test_a_request_after_an_answer_rings_no_progress_thread() -> None:
    """A client that sends a request and waits for its answer in a blocking ``recv``, round
    after round, on a busy host (a CPU-bound process beside it): the peer, woken by the
    request, often answers before the client is back in ``recv`` -- it preempts the
    client right in the send's doorbell call -- and the answer rang the CQ's standby
    arm, which the client's last ``recv`` had left: its progress thread woke, took the lock and
    the GIL, and handed the answer over, 0.8 times a round trip (measured), on top of
    the client's own work.  A send after a read now takes the standby arm over while it
    posts, and looks once more after: the peer rings nobody, the client takes its
    answer itself."""
    rounds = 600
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    peer = Peer(smc_peer.echo_server)
    try:
        port = peer.recv()
        with smcr.create_connection(("127.0.0.1", port), timeout=20) as conn:
            assert conn.smc_info().mode == "SMCR"
            conn.settimeout(None)
            for _ in range(50):
                conn.sendall(b"x" * 32)
                assert conn.recv(100) == b"x" * 32
            before = voluntary_switches("smcr-progress")
            for i in range(rounds):
                conn.sendall(i.to_bytes(32, "big"))
                got = conn.recv(100)
                while len(got) < 32:
                    got += conn.recv(100)
                assert got == i.to_bytes(32, "big")
            woke = voluntary_switches("smcr-progress") - before
        assert peer.recv()[0] == "SMCR"
        assert woke < rounds // 10, f"{woke} progress wake-ups in {rounds} round trips"
    finally:
        busy.kill()
        busy.wait()
        peer.stop()


def test_an_event_loop_servers_connections_wake_its_progress_thread_about_once_each() -> None:
    """A connection per request served from one ``selectors`` loop (an event-loop web
    server): nobody polls for the handshakes, so the progress thread takes each client's
    Confirm -- one wake-up.  It was woken five or six times per connection (measured): by
    the handshake's socket registered on the epoll it sleeps on while the client's
    Proposal, which the watcher thread was about to read, was already there; and for each
    completion of what the loop's thread posted itself (the closing CDC), which the
    poster now takes."""
    conns = 300
    peer = Peer(smc_peer.loop_accept_server, conns)
    try:
        port = peer.recv()
        for i in range(conns):
            with smcr.create_connection(("127.0.0.1", port), timeout=20) as c:
                assert c.smc_info().mode == "SMCR"
                c.sendall(i.to_bytes(4, "big"))
                assert c.recv(10) == i.to_bytes(4, "big")
        smc, (progress, _watcher) = peer.recv()
        assert smc == conns
        assert progress < conns * 5 // 2, f"{progress} progress wake-ups in {conns} connections"
    finally:
        peer.stop()


def test_a_blocking_request_response_client_leaves_the_cq_unarmed_between_round_trips() -> None:
    """A program that only ever waits in its own ``send`` and ``recv`` (it never watched a
    readiness descriptor, no other thread waits, nothing is under way) takes what comes
    between two of its calls at its next one: its ``recv`` no longer arms the CQ for the
    progress thread's standby when it returns, nor its ``send`` takes that arm and arms
    it again (about a quarter of a round trip's CPU: 30-34 -> 20-22 us per 32 B round trip,
    idle), also when the answer is there before the ``recv`` (a send that took the arm
    armed it again, and the next one took it, round after round).  Once it calls
    ``fileno()`` (for ``select``, an event loop), the arm is set at once and after every
    answer, as before."""
    rounds = 50
    server = Peer(smc_peer.echo_server)
    client = Peer(smc_peer.standby_client, server.recv(), rounds)
    try:
        before, at_fileno, after = client.recv(60)
        assert server.recv()[0] == "SMCR"
        assert before == 0, f"the CQ was armed after {before} of {2 * rounds} answers"
        assert at_fileno, "fileno() did not arm the CQ for the standby"
        assert after == rounds, f"armed after {after} of {rounds} answers once watched"
    finally:
        client.stop()
        server.stop()


def test_a_thread_waiting_on_another_connection_keeps_the_standby_armed() -> None:
    """While one thread polls in ``recv`` on one connection, another that waits in ``recv``
    on a second is counted: when the first returns, the CQ stays armed for the progress
    thread's standby, which then hands the second its byte (5 ms later), not the
    progress thread's next look-in; the count is back to 0 once both are done."""
    server = Peer(smc_peer.two_conn_server)
    client = Peer(smc_peer.waiting_client, server.recv())
    try:
        counted, needed = client.recv(60)
        assert counted == 1 and needed
        server.ctl.send("go")
        client.ctl.send("read")
        got, left = client.recv(30)
        assert got and left == 0
        server.ctl.send("quit")
    finally:
        client.stop()
        server.stop()


def loop_round_trip(conn: socket.socket, sel: selectors.BaseSelector, i: int) -> None:
    """One round trip of an event loop to an echo server: ``i`` as 4 bytes out on the
    non-blocking ``conn``, then reads each after ``sel`` says it is readable, until the
    echo is back (asserted equal)."""
    assert conn.send(i.to_bytes(4, "big")) == 4
    got = b""
    while len(got) < 4:
        assert sel.select(10), "no answer in 10 s"
        try:
            got += conn.recv(4 - len(got))
        except BlockingIOError:
            continue
    assert got == i.to_bytes(4, "big")


@RNICS
def test_an_event_loop_hears_every_answer_when_it_comes(peer: Callable[..., Peer]) -> None:
    """An event loop (a non-blocking socket, ``select`` on it between its calls, as asyncio
    and most servers wait) is woken by each answer when it comes, not at the standing-by
    progress thread's next look-in (:data:`smcr.stack.progress.STANDBY`, 10 ms).  Over
    RoCE a quarter of such round trips took 10-11 ms and the median was 1-5 ms (the
    ``smcr bench`` event-loop row: 5.5-7.9 ms against TCP's 0.05): the ring that woke
    the progress thread took the CQ's arm, and it stood by again unarmed (nothing the loop
    does arms it: it never waits on the CQ), and the loop's read, a mere look, made the
    RNIC's thread leave the QP's socket to pollers for 4 ms (none sleeps on it).  What
    is asserted: this process's progress thread found hardly any answer at a look-in
    (``late_news_cnt``, ``smcr stats -d``), and, generously, few round trips took as
    long as a look-in (on a busy machine other waits make some that long too)."""
    rounds = 100
    server = peer(smc_peer.echo_server)
    with smcr.create_connection((smc_peer.host(), server.recv()), timeout=20) as conn:
        assert conn.smc_info().mode == "SMCR"
        missed = COUNTERS.late_news_cnt
        conn.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(conn, selectors.EVENT_READ)
            delays = []
            for i in range(rounds):
                began = time.monotonic()
                loop_round_trip(conn, sel, i)
                delays.append(time.monotonic() - began)
        missed = COUNTERS.late_news_cnt - missed  # (the closing CDCs' news is not awaited)
        conn.setblocking(True)
    assert server.recv()[0] == "SMCR"
    # (before: 26 in 100 over RoCE, every fourth round; one may be a look-in whose wait
    # ran out just as its ring came)
    assert missed <= 2, f"{missed} answers found at the progress thread's look-in"
    late = sorted(d for d in delays if d >= 0.009)
    assert len(late) <= rounds // 5, f"{len(late)} of {rounds} answers 9 ms late or more: {late}"


@rnics(kinds=("roce-lo", "roce"))
def test_an_event_loops_answers_are_read_by_the_thread_that_makes_them_ready(
        peer: Callable[..., Peer]) -> None:  # fmt: skip
    """Over RoCE, the answers an event loop awaits in ``select`` are read from the QP's
    socket by the runtime's progress thread, which then makes the connection's readiness
    descriptor readable, and not by the RNIC's own thread, which had to ring the
    progress thread for them: one thread hop per message where there were two (a 32-byte
    event-loop round trip between two namespaces took 390 us, now 260).  What is
    asserted: of the packets this process received during the round trips, the RNIC's
    thread read hardly any (``rx_rnic_thread``; before, nearly all), and every answer
    came."""
    rounds = 200
    server = peer(smc_peer.echo_server)
    with smcr.create_connection((smc_peer.host(), server.recv()), timeout=20) as conn:
        assert conn.smc_info().mode == "SMCR"
        stack = conn._stack
        assert stack is not None and isinstance(stack.device, RoceDevice)
        stats = stack.device.stats
        conn.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(conn, selectors.EVENT_READ)
            settled = time.monotonic() + 2 * STANDBY
            i = 0
            while settled or i < rounds:
                if settled and time.monotonic() >= settled:  # (until then the connect's wait
                    settled, i = 0.0, 0  # counts: the progress thread stands by after it)
                    rx, by_rnic = stats["rx"], stats["rx_rnic_thread"]
                loop_round_trip(conn, sel, i)
                i += 1
        rx, by_rnic = stats["rx"] - rx, stats["rx_rnic_thread"] - by_rnic
        conn.setblocking(True)
    assert server.recv()[0] == "SMCR"
    assert rx >= rounds, f"{rx} packets for {rounds} answers"
    assert by_rnic <= rx // 10, f"the RNIC's thread read {by_rnic} of {rx} packets"
