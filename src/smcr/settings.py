"""Every ``SMCR_*`` environment variable: what it means, what it allows, checked in one place.

Design (the why of each):

* **One registry** (:data:`VARIABLES`): the documentation's table of variables
  (``docs/configuration.md``) is built from it and a test checks that every
  ``SMCR_*`` name the sources read is in it, so a new variable cannot go
  undocumented.
* **A bad value is an error, never a guess**: :meth:`Variable.value` raises
  :class:`SettingError`, one line naming the variable, the value and what is
  allowed.  The ``smcr`` command checks every variable before it runs a
  sub-command (:func:`problems`) and prints that line; a program that uses the
  socket API meets the same error when its first SMC-R socket starts the
  runtime, instead of a default that was not asked for.
* **Values with a default elsewhere**: :meth:`Variable.value` takes what an
  unset variable means from its caller (the engine's
  :class:`~smcr.core.Config` keeps Linux's defaults); :attr:`Variable.default`
  only describes it for people.
* **No import of the rest of smcr**: the runtime, discovery and the tools all
  read settings, and the packaging code may run before smcr is importable.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from smcr.peers import parse

T = TypeVar("T")
U = TypeVar("U")


class SettingError(ValueError):
    """An ``SMCR_*`` variable has a value that is not allowed (message: one line)."""


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.lower()
        if value not in allowed:
            raise ValueError(text)
        return value

    return parse


def _count(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text, 10)
        if value < low or (high is not None and value > high):
            raise ValueError(text)
        return value

    return parse


def _non_negative(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(text)
    return value


_TRUE = ("1", "on", "yes", "true")
_FALSE = ("0", "off", "no", "false")


def _flag(text: str) -> bool:
    value = text.lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(text)
    return value in _TRUE


def _path(text: str) -> str:
    if "\0" in text:
        raise ValueError(text)
    return text


def _net_devices(text: str) -> tuple[str, ...]:
    """``all`` (every net device with an IPv4 address but ``lo``: ``()``) or a list of names
    of net devices that exist here."""
    if text.lower() == "all":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise ValueError(text)
    for name in names:
        try:
            socket.if_nametoindex(name)
        except OSError:
            raise ValueError(text) from None
    return names


def port_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """``80, 8000-8099`` -> ``((80, 80), (8000, 8099))``: ports 1-65535, separated by commas
    or blanks.

    :raises ValueError: for anything else, or for no port at all.
    """
    ranges = []
    for item in text.replace(",", " ").split():
        low, dash, high = item.partition("-")
        first, last = int(low, 10), int(high if dash else low, 10)
        if not 1 <= first <= last <= 65535:
            raise ValueError(item)
        ranges.append((first, last))
    if not ranges:
        raise ValueError(text)
    return tuple(ranges)


def _peers(text: str) -> str:
    """Entries of a peers list (:mod:`smcr.peers`)."""
    parse(text)
    return text


def buffer_size(text: str) -> int:
    """``65536``, ``64k``, ``1m`` -> bytes: 16 KiB .. 1 GiB (smc_run's ``-r``/``-t``).

    :raises ValueError: for anything else.
    """
    t = text.strip().lower()
    scale = 1
    if t.endswith(("k", "m")):
        scale = 1024 if t[-1] == "k" else 1 << 20
        t = t[:-1]
    value = int(t, 10) * scale
    if not 16 << 10 <= value <= 1 << 30:
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One environment variable: its name, how its text becomes a value, and for people
    what it allows (``allowed``), what unset means (``default``) and what it does."""

    name: str
    parse: Callable[[str], T] = field(repr=False)
    allowed: str
    default: str
    meaning: str
    group: str = "runtime"

    def text(self, environ: Mapping[str, str] | None = None) -> str:
        """The variable's text, without surrounding white space ("" when unset)."""
        env = os.environ if environ is None else environ
        return env.get(self.name, "").strip()

    def check(self, text: str) -> T:
        """``text`` as a value of this variable.

        :raises SettingError: naming the variable, the value and what is allowed.
        """
        try:
            return self.parse(text)
        except (ValueError, OverflowError):
            raise SettingError(f"{self.name}={text!r} is not allowed: expected "
                               f"{self.allowed}") from None  # fmt: skip

    def value(self, unset: U, environ: Mapping[str, str] | None = None) -> T | U:
        """The variable's value, or ``unset`` when it is unset or empty.

        :raises SettingError: for a value that is not allowed.
        """
        text = self.text(environ)
        return self.check(text) if text else unset


RNIC = Variable("SMCR_RNIC", _choice("shm", "roce", "verbs"), "shm, roce or verbs", "shm",
                "The RNIC under SMC-R: ``shm`` (shared memory, processes of one host), "
                "``roce`` (smcr's RoCEv2 over UDP, the RNIC of the TCP connection's "
                "interface) or ``verbs`` (the kernel's RDMA device whose RoCE v2 GID is the "
                "TCP connection's address, through rdma-core's pyverbs: a hardware RNIC or "
                "Linux Soft-RoCE; it speaks RoCEv2 with ``roce``). Both ends must use "
                "the same kind, or ``roce`` and ``verbs``.")
DISCOVERY = Variable("SMCR_DISCOVERY", _choice("auto", "bpf", "policy", "off"),
                     "auto, bpf, policy or off", "auto",
                     "How a connection learns that the peer speaks SMC: the TCP option "
                     "(``bpf``, needs ``smcr enable``), the peer list (``policy``), the first "
                     "of the two that is available (``auto``), or never (``off``).",
                     "discovery")
PEERS = Variable("SMCR_PEERS", _peers, "peer entries PREFIX[:PORT[-PORT]], separated by "
                 "commas or spaces", "none",
                 "Peers that speak SMC (discovery by policy), added to the peers file.",
                 "discovery")
TCP_PORTS = Variable("SMCR_TCP_PORTS", port_ranges, "ports or ranges PORT[-PORT], separated "
                     "by commas or spaces", "none",
                     "Connections of these ports stay plain TCP (short connections that SMC-R "
                     "would not speed up: its set-up costs more than TCP's): a client "
                     "connecting to such a port and a server listening on one offer no SMC, "
                     "and their peers fall back as from a peer without SMC (``0x03010000``). "
                     "Linux lets an ``smc_hs_ctrl`` BPF program decide so.",
                     "discovery")
PEERS_FILE = Variable("SMCR_PEERS_FILE", _path, "a file name", "/etc/smcr/peers",
                      "The peers file (discovery by policy): one entry or more per line, "
                      "``#`` starts a comment.", "files")
BPF_DIR = Variable("SMCR_BPF_DIR", _path, "a directory in a BPF file system",
                   "/sys/fs/bpf/smcr",
                   "Where ``smcr enable`` pins the TCP-option program and its map, and where "
                   "processes look for them.", "files")
UEID_FILE = Variable("SMCR_UEID_FILE", _path, "a file name", "/etc/smcr/ueid",
                     "The user EIDs for SMC-Rv2 (``smcr ueid``).", "files")
PNET_FILE = Variable("SMCR_PNET_FILE", _path, "a file name", "/etc/smcr/pnet",
                     "The PNET table (``smcr pnet``).", "files")
TESTLINK_TIME = Variable("SMCR_TESTLINK_TIME", _non_negative, "seconds >= 0 (0: off)", "30",
                         "Interval of the TEST LINK keepalive (Linux's sysctl "
                         "``net.smc.smcr_testlink_time``).")
MAX_LINKS = Variable("SMCR_MAX_LINKS", _count(1, 2), "1 or 2", "1",
                     "Links per link group offered in SMC-Rv2.1 (Linux's sysctl "
                     "``net.smc.smcr_max_links_per_lgr``); 2 takes part in ADD LINK.")
AUTOCORK = Variable("SMCR_AUTOCORK", _count(0), "bytes >= 0 (0: off)",
                    "65536 on shm, 0 on RoCE",
                    "Autocorking: small writes in a stream are sent as one CDC per batch of "
                    "up to this many bytes (Linux's ``autocorking_size``).")
SHM_RNICS = Variable("SMCR_SHM_RNICS", _count(1, 64), "a count from 1 to 64", "1",
                     "How many shm RNICs a process's runtime uses (more than one: redundant "
                     "links on one host).")
ROCE_DEVS = Variable("SMCR_ROCE_DEVS", _net_devices,
                     "all, or net device names of this host separated by commas", "none",
                     "More RoCE RNICs for a runtime, one per net device (its first IPv4 "
                     "address): redundant links over several interfaces. With "
                     "``SMCR_RNIC=verbs``, the RDMA devices of those net devices.")
ROCE_POLLER_RX = Variable("SMCR_ROCE_POLLER_RX", _flag, "1 or 0", "1",
                          "Whether a thread that polls a RoCE CQ also receives the QPs' "
                          "packets (a switch for diagnosis).")
SPIN_US = Variable("SMCR_SPIN_US", _non_negative, "microseconds >= 0", "50",
                   "How long a waiting application thread polls the CQ before it sleeps.")
DEBUG = Variable("SMCR_DEBUG", _flag, "1 or 0", "0",
                 "Print the runtime's decisions (discovery, link events) on standard error; "
                 "the ``smcr`` command shows tracebacks.")
DIAG = Variable("SMCR_DIAG", _flag, "1 or 0", "1",
                "Whether a process answers the observability tools (``smcr ss``, ``stats``, "
                "...) through its diag endpoint.")
DIAG_DIR = Variable("SMCR_DIAG_DIR", _path, "a directory", "<runtime directory>/diag",
                    "Where the diag endpoints and the counters of exited processes live "
                    "(``/run/smcr/diag`` for root, ``$XDG_RUNTIME_DIR/smcr/diag`` else).",
                    "files")
SHM_DIR = Variable("SMCR_SHM_DIR", _path, "a directory", "<runtime directory>",
                   "The shm RNICs' rendezvous directory (``/run/smcr`` for root, "
                   "``$XDG_RUNTIME_DIR/smcr`` else).", "files")
PURE_PYTHON = Variable("SMCR_PURE_PYTHON", _flag, "1 or 0", "0",
                       "Run every module as pure Python even where compiled modules are "
                       "installed or built.", "build")
NATIVE_DIR = Variable("SMCR_NATIVE_DIR", _path, "a directory", "src/smcr/_native",
                      "In a development checkout: another build of the same sources "
                      "(``python -m smcr.nativebuild --out DIR``), to compare builds.", "build")
RCVBUF = Variable("SMC_RCVBUF", buffer_size, "a size from 16k to 1024m (k, m suffixes)",
                  "the RNIC's", "Under ``smcr run`` (its ``-r``): the RMB of each connection.",
                  "run")
SNDBUF = Variable("SMC_SNDBUF", buffer_size, "a size from 16k to 1024m (k, m suffixes)",
                  "the RNIC's", "Under ``smcr run`` (its ``-t``): the send buffer of each "
                  "connection.", "run")
RUN = Variable("SMCR_RUN", _flag, "1", "unset",
               "Set by ``smcr run`` for the programs it starts (not for users).", "run")
RUN_DEBUG = Variable("SMCR_RUN_DEBUG", _flag, "1 or 0", "0",
                     "Set by ``smcr run -d``: how each connection was made, on standard "
                     "error.", "run")
RUN_EAGER = Variable("SMCR_RUN_EAGER", _flag, "1 or 0", "0",
                     "Under ``smcr run``: import smcr and start the runtime with each "
                     "interpreter (0: with its first TCP socket), for test harnesses that "
                     "count threads; costs each interpreter a few hundred milliseconds.",
                     "run")

VARIABLES: tuple[Variable[Any], ...] = (
    RNIC, DISCOVERY, PEERS, TCP_PORTS, PEERS_FILE, BPF_DIR, UEID_FILE, PNET_FILE, TESTLINK_TIME,
    MAX_LINKS, AUTOCORK, SHM_RNICS, ROCE_DEVS, ROCE_POLLER_RX, SPIN_US, DEBUG, DIAG, DIAG_DIR,
    SHM_DIR, PURE_PYTHON, NATIVE_DIR, RCVBUF, SNDBUF, RUN, RUN_DEBUG, RUN_EAGER,
)  # fmt: skip
"""Every variable smcr reads, in the order the documentation lists them."""

RUNTIME: tuple[Variable[Any], ...] = (RNIC, TESTLINK_TIME, MAX_LINKS, AUTOCORK, SHM_RNICS,
                                         ROCE_DEVS, SPIN_US)  # fmt: skip
"""The variables the runtime reads when it starts (:func:`smcr.stack.runtime.get_stack`)."""


def problems(variables: Iterable[Variable[Any]] = VARIABLES,
             environ: Mapping[str, str] | None = None) -> list[SettingError]:  # fmt: skip
    """What is wrong with the variables that are set: one error per bad value."""
    found = []
    for var in variables:
        text = var.text(environ)
        if text:
            try:
                var.check(text)
            except SettingError as exc:
                found.append(exc)
    return found


def check(variables: Iterable[Variable[Any]] = VARIABLES,
          environ: Mapping[str, str] | None = None) -> None:  # fmt: skip
    """Raise the first of :func:`problems`, if any.

    :raises SettingError: for the first variable with a value that is not allowed.
    """
    for error in problems(variables, environ):
        raise error


def spin_seconds() -> float:
    """``SMCR_SPIN_US`` in seconds, read when the runtime is imported: a bad value counts as
    unset there and is refused when the runtime starts (:data:`RUNTIME`)."""
    try:
        return SPIN_US.value(50.0) / 1e6
    except SettingError:
        return 50e-6


def debug() -> bool:
    """``SMCR_DEBUG``: on for ``1``/``on``/``yes``/``true``; a bad value counts as off (the
    ``smcr`` command refuses it)."""
    try:
        return DEBUG.value(False)
    except SettingError:
        return False


__all__ = ["RUNTIME", "VARIABLES", "SettingError", "Variable", "buffer_size", "check", "problems"]
