"""Helpers shared by the test modules."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The team's ``shared/`` folder beside the repository (``$SMCR_SHARED`` overrides).

    CI clones the repository with ``shared/`` beside it, so the golden captures
    are always there; a test that cannot find them fails rather than skips.
    """
    env = os.environ.get("SMCR_SHARED")
    return Path(env) if env else REPO_ROOT.parent / "shared"


GOLDEN = shared_dir() / "golden"
LINUX_PCAP = GOLDEN / "linux-6.12-smcr-v2-rxe.pcap"
LINUX_DECODED = GOLDEN / "linux-6.12-smcr-v2-rxe.decoded.txt"
ROCE_EXAMPLES_PCAP = GOLDEN / "rocev2-examples.pcap"

FUZZ_EXAMPLES = 2_000
"""Examples of each slow decoder fuzzer (``*_slow``) per run.  About 7 s each on this kind
of machine (5,000 took 15-22 s, 10,000 25-37 s: the fuzzers are a part of CI's 45 minutes
that a smaller number can give back); hypothesis draws new inputs every run, so CI's runs
add up to the larger search over time."""


def port_4791_free(address: str = "127.0.0.1") -> bool:
    """Whether UDP ``address``:4791 can be shared (not if rxe's kernel socket owns it here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            s.bind((address, 4791))
        except OSError:
            return False
    return True


def stop_capture(proc: subprocess.Popen[bytes]) -> None:
    """Stop a tcpdump/dumpcap started for a test: SIGINT (it writes what it has), then kill
    if it does not go within 10 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    for pipe in (proc.stdout, proc.stderr):  # (an unclosed one warns when collected)
        if pipe is not None:
            pipe.close()


def wait_for_mark(path: Path, send: Callable[[bytes], object], timeout: float = 10.0) -> None:
    """Send a marker datagram (``send(payload)``, again every 0.5 s) until its payload is in
    the capture file ``path``.

    dumpcap writes packets in the order it sees them, so once the marker is in the file the
    capture is live (at its start) and holds everything it saw before the marker (at its
    end); a fixed sleep instead is outlasted on a loaded machine (the CLC or the last
    packets missed)."""
    mark = b"smcr-capture-mark-" + os.urandom(8).hex().encode()
    deadline = time.monotonic() + timeout
    resend = 0.0
    while True:
        now = time.monotonic()
        if now >= resend:
            send(mark)
            resend = now + 0.5
        if path.exists() and mark in path.read_bytes():
            return
        assert now < deadline, f"the capture {path} did not show a marker within {timeout} s"
        time.sleep(0.02)


def pcap_frames(path: Path | str) -> Iterator[bytes]:
    """Each frame of a pcap file, in order; the file is closed once read (or abandoned)."""
    from scapy.utils import RawPcapReader  # noqa: PLC0415 - peers import this module: no scapy

    with RawPcapReader(str(path)) as reader:
        for frame, _meta in reader:
            yield bytes(frame)


def voluntary_switches(name: str) -> int:
    """How often the thread ``name`` of this process went to sleep so far (each time, a
    wake-up after it)."""
    thread = next(t for t in threading.enumerate() if t.name == name)
    with open(f"/proc/self/task/{thread.native_id}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


@contextlib.contextmanager
def out_of_descriptors() -> Iterator[None]:
    """This process at its descriptor limit (the soft limit lowered to what is open, and
    whatever that leaves taken), until the block ends: for a fresh process of its own
    (every thread of it meets ``EMFILE``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
    taken: list[int] = []
    try:
        while True:
            try:
                taken.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds ``thread`` has used so far (it must be running)."""
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
