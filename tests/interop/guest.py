"""The rxe guest of the interop suite: image cache, boot, commands over 9p, teardown; the two peers.

Why copies of the harness scripts (``harness/``) instead of ``../shared/interop``:
the suite must run from a clean clone of this repository in CI, where a
sibling directory is an accident of the layout, and the team's shared
scripts may change under us; the copies are pinned, and the changes to them
are marked in their headers.  The data follow shared/interop's convention:
everything (rootfs, img/, run/, share/) lives in ``$KVM_BASE``, default
``~/.cache/smcr-interop`` (``$SMCR_INTEROP_CACHE`` wins if set), outside the
repository, so the ~100 s image build happens once per machine.

Network: ``boot.sh`` creates netns ``smcnet`` with bridge br0 (10.99.0.1/24)
and one guest at 10.99.0.11 (rxe0 on its eth0).  smcr's RNIC runs in that
namespace on 10.99.0.1 (:class:`HostPeer`); the guest's pyverbs program
(``harness/tools/rxe_peer.py``) is reached through it (:class:`GuestPeer`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.roce.netns import REPO

HARNESS = Path(__file__).resolve().parent / "harness"
NETNS = "smcnet"
HOST_IP = "10.99.0.1"
GUEST_IP = "10.99.0.11"
GUEST_PORT = 18515
KERNEL = "6.12"
#: Bounds: a fresh image build (debootstrap + two kernels) and a TCG boot.
BUILD_TIMEOUT = 1800.0
BOOT_TIMEOUT = 400.0
#: Figures measured by the tests (throughput, round trips), for the terminal summary.
FIGURES: dict[str, float] = {}


def cache_dir() -> Path:
    """Where the image and the guests' run files live (outside the repository)."""
    base = os.environ.get("SMCR_INTEROP_CACHE") or os.environ.get("KVM_BASE")
    return Path(base) if base else Path.home() / ".cache" / "smcr-interop"


def image_ready(base: Path) -> bool:
    """Whether ``build-image.sh`` has left a complete image behind."""
    img = base / "img"
    return all((img / f).exists() for f in ("base.ext4", f"vmlinuz-{KERNEL}",
                                             f"initrd.img-{KERNEL}"))  # fmt: skip


def _env(base: Path) -> dict[str, str]:
    return os.environ | {"KVM_BASE": str(base), "DEBIAN_FRONTEND": "noninteractive"}


def ensure_image(base: Path) -> float:
    """Build the guest image unless cached; returns the seconds spent (0 when cached).

    A lock file keeps two concurrent sessions from building at once; the
    second one waits and then finds the image.
    """
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(base / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_ready(base):
            return 0.0
        with open(base / "build.log", "w") as log:
            subprocess.run(["bash", str(HARNESS / "build-image.sh")], env=_env(base), check=True,
                           stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           timeout=BUILD_TIMEOUT)  # fmt: skip
    if not image_ready(base):
        raise RuntimeError(f"build-image.sh left no image; see {base / 'build.log'}")
    return time.monotonic() - t0


def mark_to_guest(payload: bytes) -> None:
    """A UDP datagram (port 9, discard, from port 9) from the host side of netns ``smcnet``
    to the guest: the marker of :func:`tests.support.wait_for_mark` for captures on
    ``br0``.  From port 9 too: tshark picks a dissector by either port, and a random source
    port of another protocol's (EtherNet/IP's 2222) made a marker malformed to it."""
    subprocess.run(["ip", "netns", "exec", NETNS, sys.executable, "-c",
                    "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('', 9)); "
                    f"s.sendto({payload!r}, ('{GUEST_IP}', 9))"],
                   check=True, timeout=30)  # fmt: skip


def netns_exists(name: str = NETNS) -> bool:
    out = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    return any(line.split()[0] == name for line in out.stdout.splitlines() if line.strip())


def _until_prompt(mon: socket.socket) -> str:
    """What the QEMU monitor says up to its next prompt (the prompt left out)."""
    prompt, seen = b"(qemu) ", b""
    while not seen.endswith(prompt):
        chunk = mon.recv(4096)
        assert chunk, f"monitor closed: {seen!r}"
        seen += chunk
    return seen[: -len(prompt)].decode(errors="replace")


class GuestTimeoutError(RuntimeError):
    """A guest command that did not end within its time (:meth:`Guest.wait`)."""


class GuestPanicError(GuestTimeoutError):
    """The guest's kernel panicked while a command ran: nothing it was asked will end, so
    :meth:`Guest.wait` says so at once (with the console's account) instead of timing out.
    A timeout's kind, for the callers that restart a stuck guest."""


PANIC_MARK = "Kernel panic - not syncing"
"""What the guest's console says once its kernel has given up (an oops in a softirq, as
Linux 6.12's rxe has after a failover: ``rxe_skb_tx_dtor`` of a packet that waited for ARP)."""


class Guest:
    """One booted guest (g1, or with ``index`` 2 g2 at 10.99.0.12), driven through the 9p
    agent of the image."""

    def __init__(self, base: Path, index: int = 1) -> None:
        self.base = base
        self.index = index
        self.share = base / "share" / f"g{index}"
        self.console = base / "run" / f"g{index}.console"
        self.boot_seconds = 0.0
        self.server: str | None = None  # the pyverbs server's command id
        self.restarts = 0
        """Reboots by :meth:`restart` since the session began."""
        self.second: Guest | None = None
        """g2, booted beside g1 and paused, for the session's test that needs it (see
        ``conftest._session``)."""
        self.setups: list[Callable[[Guest], None]] = []
        """What :meth:`restart` does again after :meth:`start_services` (kernel SMC's
        set-up, once a test asked for it)."""

    def boot(self, *together: Guest) -> None:
        """Boot this guest (``boot.sh``; the namespace and bridge are made if missing), and
        the guests ``together`` (the next indexes) at the same time: one TCG vCPU each, so
        on two CPUs two boots take about as long as one."""
        t0 = time.monotonic()
        last = self.index + len(together)
        assert [g.index for g in together] == list(range(self.index + 1, last + 1)), together
        subprocess.run(["bash", str(HARNESS / "boot.sh"), str(last)],
                       env=_env(self.base) | {"WAIT": "1", "FIRST": str(self.index)},
                       check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                       timeout=BOOT_TIMEOUT)  # fmt: skip
        for guest in (self, *together):
            guest.boot_seconds = time.monotonic() - t0

    def monitor(self, command: str, timeout: float = 10.0) -> str:
        """One command to this guest's QEMU monitor (HMP on ``run/gN.mon``); its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mon:
            mon.settimeout(timeout)
            mon.connect(str(self.base / "run" / f"g{self.index}.mon"))
            _until_prompt(mon)  # (the banner)
            mon.sendall(command.encode() + b"\n")
            return _until_prompt(mon)

    def pause(self) -> None:
        """Stop this guest's vCPU (QEMU keeps it, costing no CPU) until :meth:`resume`;
        its clocks stop with it."""
        self.monitor("stop")
        assert "paused" in self.monitor("info status")

    def resume(self) -> None:
        """Run a guest :meth:`pause` stopped."""
        self.monitor("cont")
        assert "running" in self.monitor("info status")

    def stop(self) -> None:
        """Stop this guest's QEMU (its pidfile), leaving the others and the namespace."""
        pidfile = self.base / "run" / f"g{self.index}.pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            os.kill(pid, 15)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(pid, 0)  # raises once it is gone
                time.sleep(0.1)
            os.kill(pid, 9)
        pidfile.unlink(missing_ok=True)
        (self.share / "out" / "READY").unlink(missing_ok=True)

    def run(self, command: str, timeout: float = 60.0, background: bool = False) -> str:
        """Run a shell command in the guest (as ``run-in-guest.sh``); its output.

        :raises RuntimeError: on a non-zero exit status or when it takes longer than ``timeout``.
        """
        ident = f"c{time.time_ns()}"
        tmp = self.share / "cmd" / f"{ident}.tmp"
        tmp.write_text(command + "\n")
        tmp.rename(self.share / "cmd" / f"{ident}.sh")
        if background:
            return ident
        return self.wait(ident, timeout, command)

    def wait(self, ident: str, timeout: float, command: str = "") -> str:
        """Wait for a command started with ``background=True`` to end; its output.

        :raises RuntimeError: as :meth:`run` (:class:`GuestTimeoutError` when it timed out).
        """
        command = command or ident
        out, rc = self.share / "out" / f"{ident}.out", self.share / "out" / f"{ident}.rc"
        deadline = time.monotonic() + timeout
        looked = time.monotonic()
        while not rc.exists():
            if time.monotonic() > deadline:
                text = self.output(ident)
                raise GuestTimeoutError(f"guest command timed out: {command}\n{text}\n"
                                        f"{self.tail()}")  # fmt: skip
            if time.monotonic() - looked > 1.0:
                looked = time.monotonic()
                if self.panicked():
                    raise GuestPanicError(f"guest g{self.index} panicked during: {command}\n"
                                          f"{self.output(ident)}\n{self.tail(60)}")  # fmt: skip
            time.sleep(0.1)
        text = out.read_text(errors="replace")
        status = int(rc.read_text().strip() or "255")
        out.unlink(missing_ok=True)
        rc.unlink(missing_ok=True)
        if status:
            raise RuntimeError(f"guest command failed ({status}): {command}\n{text}")
        return text

    def wait_listening(self, ident: str, timeout: float = 60.0) -> str:
        """Wait until a server started with ``background=True`` says ``listening``; what it
        has written by then.

        :raises RuntimeError: it ended first (:meth:`wait`'s error, with its output).
        :raises AssertionError: it said nothing of the kind within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while "listening" not in (out := self.output(ident)):
            if (self.share / "out" / f"{ident}.rc").exists():
                self.wait(ident, 1)  # it ended: raises with its output
            assert time.monotonic() < deadline, f"guest server did not start: {out}"
            time.sleep(0.05)
        return out

    def output(self, ident: str) -> str:
        """What a background command has written so far."""
        with contextlib.suppress(OSError):
            return (self.share / "out" / f"{ident}.out").read_text(errors="replace")
        return ""

    def tail(self, n: int = 40) -> str:
        """The end of the guest's serial console (for failure messages)."""
        with contextlib.suppress(OSError):
            return "\n".join(self.console.read_text(errors="replace").splitlines()[-n:])
        return ""

    def panicked(self) -> bool:
        """Whether this guest's kernel has panicked since it booted (its console says so)."""
        with contextlib.suppress(OSError):
            return PANIC_MARK in self.console.read_text(errors="replace")
        return False

    def start_services(self) -> None:
        """After :meth:`boot`: rxe0 on eth0 (``rxe-setup.sh``) and the pyverbs server that
        :class:`GuestPeer` talks to, in the background."""
        setup = self.run("bash /mnt/host/tools/rxe-setup.sh", timeout=120)
        assert "pyverbs ok" in setup, setup
        self.server = self.run(f"exec python3 -u /mnt/host/tools/rxe_peer.py {GUEST_PORT}",
                               background=True)  # fmt: skip

    def restart(self) -> None:
        """A fresh boot of this guest with its services and :attr:`setups`, for a test
        that found the guest's kernel stuck: the tests after it must not inherit that."""
        self.stop()
        self.boot()
        self.start_services()
        for setup in self.setups:
            setup(self)
        self.restarts += 1

    def kernel_links(self) -> list[str]:
        """The RC QPs the guest's kernel holds for itself (kernel SMC's links; ``comm``
        in brackets, where a program's QP has its name): lines of ``rdma res show qp``."""
        out = self.run("timeout 20 rdma res show qp", timeout=60)
        return [line for line in out.splitlines()
                if " type RC " in line and " comm [" in line]  # fmt: skip

    def wait_kernel_links_gone(self, timeout: float = 20.0) -> bool:
        """Whether the guest's kernel let go of all its links within ``timeout`` seconds.
        A link whose peer went away is torn down within a second or two (its last SENDs
        retried a few times to that peer's address: packets that would land in a later
        test's QP there)."""
        deadline = time.monotonic() + timeout
        while self.kernel_links():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    def teardown(self) -> None:
        """Stop the guest and delete the namespace (bounded; never raises)."""
        with contextlib.suppress(Exception):
            subprocess.run(["bash", str(HARNESS / "teardown.sh")], env=_env(self.base), check=False,
                           capture_output=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
        if netns_exists():
            subprocess.run(["ip", "netns", "del", NETNS], check=False, capture_output=True,
                           timeout=30)  # fmt: skip


def recover_if_panicked(guest: Guest, set_up: Callable[[Guest], None] | None = None) -> bool:
    """Boot ``guest`` again if its kernel panicked (a test before left it so), then
    :meth:`Guest.start_services` and its :attr:`~Guest.setups` (g1) or ``set_up`` (a guest
    of one module's own); whether it had to.  One test's dead guest must not fail the rest."""
    if not guest.panicked():
        return False
    if set_up is None:
        guest.restart()
        return True
    guest.stop()
    guest.boot()
    set_up(guest)
    guest.restarts += 1
    return True


class HostPeer:
    """``tests.interop.host_peer`` in netns smcnet: smcr's end, driven by JSON lines (bounded)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, sys.executable, "-m", "tests.interop.host_peer",
             HOST_IP, GUEST_IP, str(GUEST_PORT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
        )  # fmt: skip
        try:
            ready = self._answer(90.0)
            assert ready == "ready", ready
            self.info: dict[str, Any] = self.ask("info")
        except BaseException:
            self.kill()
            raise

    def _answer(self, timeout: float) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"host peer did not answer in {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"host peer exited (rc={self.proc.poll()})"
        return json.loads(line)

    def ask(self, cmd: str, **args: Any) -> Any:
        """One command; waits 40 s, or 30 s more than the command's own ``timeout``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([cmd, args]) + "\n")
        self.proc.stdin.flush()
        inner = args.get("timeout", 0.0)
        if cmd == "guest":
            inner = args.get("args", {}).get("timeout", 0.0) + 20.0
        answer = self._answer(max(40.0, inner + 30.0))
        if isinstance(answer, dict) and "error" in answer:
            raise AssertionError(f"{cmd} failed: {answer['error']}\n{answer.get('trace', '')}")
        return answer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc.poll() is None:
                self.ask("close")
        self.kill()

    def kill(self) -> None:
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class GuestPeer:
    """The guest's pyverbs QP, reached through the host peer's side channel (same commands)."""

    def __init__(self, host: HostPeer) -> None:
        self.host = host
        self.info: dict[str, Any] = self.ask("info")

    def ask(self, cmd: str, **args: Any) -> Any:
        answer = self.host.ask("guest", op=cmd, args=args)
        if isinstance(answer, dict) and "error" in answer:
            raise AssertionError(f"guest {cmd} failed: {answer['error']}\n{answer.get('trace')}")
        return answer
