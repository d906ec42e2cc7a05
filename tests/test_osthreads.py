"""The kernel knows smcr's threads by their names (``top -H``, ``ps -L``, ``perf``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

from smcr.osthreads import COMM_LIMIT, NamedThread


def _comm(native_id: int) -> str:
    with open(f"/proc/self/task/{native_id}/comm") as f:
        return f.read().rstrip("\n")


def test_a_named_thread_is_known_by_its_name_and_a_long_one_by_its_first_15_bytes() -> None:
    seen: dict[str, str] = {}
    go = threading.Event()

    def look() -> None:
        seen[threading.current_thread().name] = _comm(threading.get_native_id())
        go.wait(5)

    threads = [NamedThread(target=look, name=name, daemon=True)
               for name in ("smcr-progress", "smcr-a-name-longer-than-fifteen")]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        while t.name not in seen:
            t.join(0.01)
    go.set()
    assert seen == {"smcr-progress": "smcr-progress",
                    "smcr-a-name-longer-than-fifteen": "smcr-a-name-lon"}  # fmt: skip
    assert len(seen["smcr-a-name-longer-than-fifteen"]) == COMM_LIMIT
    assert _comm(threading.get_native_id()) != "smcr-progress"  # (the caller's own stays)


def test_a_runtime_s_threads_show_their_names_in_ps() -> None:
    """A process with an SMC-R connection: ``ps -L`` lists the runtime's threads by name."""
    code = (
        "import smcr, socket, subprocess, os\n"
        "srv = smcr.create_server(('127.0.0.1', 0))\n"
        "c = smcr.SMCSocket(); c.connect(srv.getsockname()); s, _ = srv.accept()\n"
        "c.sendall(b'x'); assert s.recv(1) == b'x' and c.using_smc\n"
        "print(subprocess.run(['ps', '-L', '-o', 'comm=', '-p', str(os.getpid())],"
        " capture_output=True, text=True, check=True).stdout)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()  # fmt: skip
    assert {"smcr-progress", "smcr-shm-engine", "smcr-shm-server"} <= set(out), out


def _blocked(native_id: int) -> set[int]:
    """The signals the thread blocks, from its ``SigBlk`` mask in /proc."""
    with open(f"/proc/self/task/{native_id}/status") as f:
        mask = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    return {n + 1 for n in range(64) if mask >> n & 1}


def test_a_named_thread_leaves_the_process_s_signals_to_the_program_s_threads() -> None:
    """A signal sent to the process goes to a thread that does not block it; one that
    lands on an smcr thread is never handled while the main thread sleeps on a lock."""
    seen: list[set[int]] = []
    t = NamedThread(target=lambda: seen.append(_blocked(threading.get_native_id())),
                    name="smcr-test")  # fmt: skip
    before = _blocked(threading.get_native_id())
    t.start()
    t.join()
    assert _blocked(threading.get_native_id()) == before  # (the starter's mask as it was)
    wanted = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD,
              signal.SIGALRM, signal.SIGRTMIN}  # fmt: skip
    assert wanted <= seen[0]
    assert not {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGPIPE} & seen[0]


def test_a_runtime_s_threads_all_block_the_process_s_signals() -> None:
    code = (
        "import smcr, os, signal\n"
        "srv = smcr.create_server(('127.0.0.1', 0))\n"
        "c = smcr.SMCSocket(); c.connect(srv.getsockname()); s, _ = srv.accept()\n"
        "c.sendall(b'x'); assert s.recv(1) == b'x' and c.using_smc\n"
        "for tid in sorted(os.listdir('/proc/self/task')):\n"
        "    comm = open(f'/proc/self/task/{tid}/comm').read().strip()\n"
        "    blk = [l for l in open(f'/proc/self/task/{tid}/status') if l.startswith('SigBlk')]\n"
        "    mask = int(blk[0].split()[1], 16)\n"
        "    print(comm, bool(mask >> (signal.SIGTERM - 1) & 1))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split("\n")  # fmt: skip
    rows = dict(line.split() for line in out if line)
    assert rows.pop("python") == "False"  # the main thread takes it
    assert len(rows) >= 3 and set(rows.values()) == {"True"}, rows
