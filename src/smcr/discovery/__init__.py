"""How a TCP connection learns that both ends speak SMC, before a byte of CLC is sent.

Linux proposes SMC only when the SYN and the SYN-ACK both carried the SMC TCP
option; a peer that did not offer it never sees a CLC message, and the socket
is plain TCP at once with the reason ``0x03010000`` (peer has no SMC).  smcr
does the same, in one of three modes (``SMCR_DISCOVERY``):

``bpf``
    The TCP option itself, written and read by a sock_ops program that
    ``smcr enable`` (root, once) attached to a cgroup (:mod:`.bpf`).  Exact,
    like Linux; costs two ``bpf(2)`` calls per connection.
``policy``
    The user lists the peers (prefixes and ports) that speak SMC
    (:mod:`.policy`): for hosts where the option cannot be had.  No system
    call, but a promise nothing checks.
``off``
    Every connection is plain TCP.

``auto`` (the default) takes ``bpf`` when the program is enabled for a cgroup
this process belongs to, else ``policy`` when any peer is listed, else
``off``.  A mode that cannot work (``bpf`` forced but not enabled, a policy
file with errors) means plain TCP, never an error on a socket: its reason is
in :attr:`Discovery.why` (``smcr info``, ``smcr discovery``).  A process whose
configuration rules SMC out says so once, on standard error, at its first SMC
socket (:meth:`Discovery.report_off`): every connection falling back to TCP
with nothing said looked like a working smcr.  ``SMCR_DISCOVERY=off`` asks for
it and is not reported; ``SMCR_DEBUG`` prints the mode chosen in any case.
"""

from __future__ import annotations

import _socket
import ipaddress
import os
import socket
import sys
import threading
from dataclasses import dataclass, field

from smcr import settings
from smcr.discovery import bpf, policy

MODES = ("auto", "bpf", "policy", "off")


@dataclass
class Discovery:
    """The discovery mode in force in this process, and the means to apply it."""

    mode: str  # "bpf", "policy" or "off"
    why: str = ""  # how the mode was chosen (or why a wanted one is not in force)
    flags: bpf.SocketFlags | None = None
    rules: policy.Policy = field(default_factory=lambda: policy.Policy((), ""))
    tcp_ports: tuple[tuple[int, int], ...] = ()
    """Ports whose connections stay TCP (``SMCR_TCP_PORTS``): :meth:`keeps_tcp`."""

    def keeps_tcp(self, port: int) -> bool:
        """Whether connections of ``port`` (the one a client connects to, the one a server
        listens on) stay TCP by the user's choice (``SMCR_TCP_PORTS``)."""
        return any(low <= port <= high for low, high in self.tcp_ports)

    def opt_in(self, sock: socket.socket, port: int = 0) -> bool:
        """Before ``connect``/``listen``: ask for the option on ``sock``; whether SMC
        may follow at all on this socket (False: it is plain TCP, whatever the peer).

        :param port: the port a client connects to, or the one a server listens on (0:
            not known): one that :meth:`keeps_tcp` names gets no option, as a Linux
            ``smc_hs_ctrl`` program that says no to it."""
        if self.tcp_ports and self.keeps_tcp(port):
            return False
        if self.mode == "policy":
            return True
        if self.flags is None:
            self.report_off()
            return False
        try:
            self.flags.want(_kernel_fd(sock))
        except OSError:
            return False
        return True

    def report_off(self) -> None:
        """Once per process: say that SMC is off and why, unless ``SMCR_DISCOVERY=off``
        asked for it."""
        global _reported  # noqa: PLW0603 - once per process
        if _reported or self.mode != "off" or self.why == EXPLICIT_OFF:
            return
        _reported = True
        print(f"smcr: SMC-R is off in this process, its connections are plain TCP: {self.why} "
              "(smcr discovery tells more)", file=sys.stderr)  # fmt: skip

    def peer_offered(self, sock: socket.socket, client: bool) -> bool:
        """After ``connect`` (``client``) or ``accept``: did the peer offer SMC?

        bpf: the option was in the peer's SYN-ACK / SYN.  policy: the peer's
        address is listed for the server's port (the peer's port when we are the
        client, our own when we accepted).
        """
        if self.mode == "bpf" and self.flags is not None:
            try:
                return self.flags.peer(_kernel_fd(sock))
            except OSError:
                return False
        if self.mode == "policy":
            try:
                peer = sock.getpeername()
                port = peer[1] if client else sock.getsockname()[1]
                address = ipaddress.ip_address(str(peer[0]).split("%")[0])
            except (OSError, ValueError, IndexError):
                return False
            return self.rules.matches(address, int(port))
        return False


    def hs_congested(self, port: int, congested: bool) -> bool:
        """A listener of local ``port`` with ``SMC_LIMIT_HS`` has (no longer) more SMC
        handshakes running than it allows: while any has, the port's SYN-ACKs go
        without the option and its new clients stay TCP (Linux's ``smc_hs_congested``).
        Whether the option can be held back so (bpf mode, with a program that has the
        ports map)."""
        if self.mode != "bpf" or self.flags is None:
            return False
        try:
            return self.flags.congested(port, congested)
        except OSError:
            return False

    def port_listens(self, port: int) -> None:
        """A listener that may serve SMC starts on ``port`` (:meth:`SocketFlags.port_listens`)."""
        if self.mode == "bpf" and self.flags is not None:
            try:
                self.flags.port_listens(port)
            except OSError:
                pass


def _kernel_fd(sock: socket.socket) -> int:
    """The socket's own descriptor (an SMC socket's ``fileno()`` may be another one)."""
    return int(_socket.socket.fileno(sock))


_current: Discovery | None = None
_lock = threading.Lock()
_reported = False
EXPLICIT_OFF = "SMCR_DISCOVERY=off"


def _choose() -> Discovery:
    """The mode (module docstring), with the ports that stay TCP (``SMCR_TCP_PORTS``; a value
    that is not allowed turns discovery off, with the reason)."""
    try:
        tcp_ports = settings.TCP_PORTS.value(())
    except settings.SettingError as exc:
        return Discovery("off", str(exc))
    found = _choose_mode()
    if tcp_ports:
        found.tcp_ports = tcp_ports
    return found


def _choose_mode() -> Discovery:
    wanted = os.environ.get("SMCR_DISCOVERY", "auto").strip().lower() or "auto"
    if wanted not in MODES:
        return Discovery("off", f"SMCR_DISCOVERY={wanted!r} is not one of {', '.join(MODES)}")
    if wanted == "off":
        return Discovery("off", EXPLICIT_OFF)
    why = []
    if wanted in ("auto", "bpf"):
        state = bpf.status()
        if state.enabled and state.covers_us:
            try:
                return Discovery("bpf", f"TCP option, attached to {state.attached_to()}",
                                 flags=bpf.SocketFlags(state.pin_dir))  # fmt: skip
            except OSError as exc:
                why.append(f"{state.pin_dir / bpf.MAP_PIN}: {exc.strerror}")
        elif state.enabled:
            why.append(f"the TCP option is enabled for {state.cgroup}, "
                       "which this process is not in")  # fmt: skip
        else:
            why.append(f"the TCP option is not enabled ({state.why}; smcr enable)")
        if wanted == "bpf":
            return Discovery("off", "; ".join(why))
    try:
        rules = policy.load()
    except policy.PolicyError as exc:
        return Discovery("off", "; ".join([*why, f"peer policy: {exc}"]))
    if rules.rules:
        return Discovery("policy", f"peers listed in {rules.source}", rules=rules)
    listed = os.environ.get("SMCR_PEERS_FILE") or policy.DEFAULT_FILE
    why.append(f"no peers listed (SMCR_PEERS, {listed})")
    return Discovery("off", "; ".join(why))


def reported_by_caller() -> None:
    """The process says itself why SMC is off (``smcr chk``): no report of its own."""
    global _reported  # noqa: PLW0603
    _reported = True


def current() -> Discovery:
    """The discovery of this process, chosen on first use (module docstring)."""
    global _current  # noqa: PLW0603 - one per process, like the runtimes
    found = _current
    if found is not None:
        return found
    with _lock:
        if _current is None:
            _current = _choose()
            if settings.debug():
                print(f"smcr: discovery {_current.mode}: {_current.why}", file=sys.stderr)
        return _current


def reset() -> None:
    """Choose again on next use (after ``smcr enable``/``disable`` or a changed
    environment, in this process)."""
    global _current  # noqa: PLW0603
    with _lock:
        if _current is not None and _current.flags is not None:
            _current.flags.close()
        _current = None
