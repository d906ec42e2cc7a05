"""``smcr run``: unmodified Python programs use SMC-R (the role of Linux's ``smc_run``).

How.  ``smcr run COMMAND`` starts COMMAND with a directory of smcr's at the
front of ``PYTHONPATH`` that holds a ``sitecustomize`` module: every Python
interpreter started below it (COMMAND itself, its ``subprocess`` children,
``multiprocessing`` workers of any start method) runs :func:`install` before
the program's first line, then the ``sitecustomize`` it would have run
otherwise.  A forked child inherits the installed interpreter as it is.

What :func:`install` changes.  ``socket.socket`` becomes a class of its own
(:class:`RunSocket`) whose AF_INET/AF_INET6 stream sockets are SMC sockets
(:class:`smcr.SMCSocket`), and discovery decides per connection whether SMC-R
is used (:mod:`smcr.discovery`); other sockets (AF_UNIX, UDP, socketpair)
are the standard library's and behave exactly as before.  Subclasses of
``socket.socket`` that the program defines make SMC sockets too.
``isinstance(s, socket.socket)`` holds for every socket, made before or after,
and for ``ssl.SSLSocket`` too.  When the ``ssl`` module is imported,
``SSLContext.wrap_socket`` of a socket in SMC-R mode returns a TLS socket whose
records travel over SMC-R (:mod:`smcr.run.tls`); asyncio's own TLS runs over
its transports and so over SMC-R already.

What it costs.  Every Python interpreter below COMMAND runs :func:`install`,
and most never make a TCP socket: it imports nothing of smcr but this module
and sets up the hooks (about a millisecond).  smcr's socket layer, the engine,
the compiled modules and discovery are imported when the program makes its
first AF_INET/AF_INET6 stream socket (:func:`_smc_class`): that ``socket()``
call takes as long as ``import smcr.socket`` (a few hundred milliseconds), and
the runtime's threads start with the first connection.  ``SMCR_RUN_EAGER=1``
does both at :func:`install` instead (:func:`_start_runtime`).

What it does not reach: programs that are not Python (their own children
that are Python are covered); ``python -S``/``-I`` (no ``site``, so no
hook); sockets wrapped by ``ssl`` before they connect (they connect as plain
TCP, as the ``ssl`` module drives the descriptor itself).

Environment (set by ``smcr run``, read by :func:`install`): ``SMCR_RUN``
(``1``: install), ``SMC_RCVBUF`` and ``SMC_SNDBUF`` (RMB and send buffer
sizes, as Linux's smc_run names them), ``SMCR_RUN_DEBUG`` (``1``: a line on
standard error for each connection: its mode and, for TCP, the reason),
``SMCR_RUN_EAGER`` (``1``: import smcr and start the runtime with the
interpreter, not with the first socket; see :func:`_start_runtime`).  A value
that smcr refuses is met by the first TCP socket: a line on standard error, and
the program's sockets stay the standard library's.
"""

from __future__ import annotations

import _socket
import _thread
import os
import socket
import sys

from smcr.run import patches

TYPE_CHECKING = False  # (typing costs milliseconds to import; mypy reads this name as True)
if TYPE_CHECKING:
    from typing import Any

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")
"""The directory whose ``sitecustomize`` installs smcr in every Python started below."""

_ORIGINAL = socket.socket
_INET = (int(socket.AF_INET), int(socket.AF_INET6))
_TYPE_FLAGS = int(socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)


class _AnySocket(type):
    """Metaclass of :class:`RunSocket`: every socket object (of the standard library's
    class, ssl's, ours) is an instance of it, as it was of the original.  Its subclasses
    (the program's, and the SMC classes :func:`_smc_class` makes) check as usual."""

    def __instancecheck__(cls, obj: object) -> bool:
        if cls is RunSocket:
            return isinstance(obj, _ORIGINAL)
        return super().__instancecheck__(obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        if cls is RunSocket:
            return issubclass(sub, _ORIGINAL)
        return super().__subclasscheck__(sub)


class RunSocket(_ORIGINAL, metaclass=_AnySocket):
    """What ``socket.socket`` is under ``smcr run``: its AF_INET/AF_INET6 stream sockets
    (and every socket of a subclass) are made of the matching class of :func:`_smc_class`,
    a subclass of this class and of :class:`smcr.SMCSocket`; the others of this class,
    which is the standard library's with nothing added."""

    __slots__ = ()
    _smcr_run = True
    _smcr_plain = _ORIGINAL  # (what smcr.socket.base subclasses, whenever it is imported)
    _smcr_smc = False  # True in the classes of SMC sockets

    def __new__(cls, family: int = -1, type: int = -1, proto: int = -1,
                fileno: int | None = None, **extra: object) -> RunSocket:  # fmt: skip
        # (extra: SMCSocket's own keywords, for its accepted sockets; its __init__ takes them)
        made = cls
        if not cls._smcr_smc and (cls is not RunSocket or _inet_stream(family, type, fileno)):
            made = _smc_class(cls)
        sock: RunSocket = _socket.socket.__new__(made)
        return sock


RunSocket.__module__ = RunSocket.__name__ = RunSocket.__qualname__ = "socket"
RunSocket.__doc__ = _ORIGINAL.__doc__


_AF_SMC = 43  # (smcr.socket.linuxapi.AF_SMC, not imported before the first socket)


def _inet_stream(family: int, kind: int, fileno: int | None) -> bool:
    """Whether ``socket.socket(family, kind, proto, fileno)`` makes a TCP socket (as the C
    constructor reads its arguments: -1 is AF_INET and SOCK_STREAM, or with ``fileno``
    what the descriptor is).  Once smcr is imported, every socket made from a descriptor
    goes to :class:`smcr.SMCSocket`, which knows its own sockets' ``fileno()``."""
    if fileno is not None:
        if _smc_base is not None:
            return True
        if family == -1 or kind == -1:
            try:  # the C type alone: it reads the descriptor's family and type
                probe = _socket.socket(family, kind, -1, fileno)
            except (OSError, TypeError, ValueError, OverflowError):
                return False  # the constructor will say so
            family, kind = probe.family, probe.type
            probe.detach()
    if family == _AF_SMC and fileno is None:
        return True  # Linux's SMC API: smcr.socket.linuxapi makes it (or refuses as Linux)
    if family == -1:
        family = _INET[0]
    if kind == -1:
        kind = int(socket.SOCK_STREAM)
    return family in _INET and isinstance(kind, int) and kind & ~_TYPE_FLAGS == socket.SOCK_STREAM


def parse_size(text: str) -> int:
    """``65536``, ``64k``, ``1m`` -> bytes (smc_run's ``-r``/``-t``).

    :raises ValueError: for anything else, or a size outside 16 KiB .. 1 GiB.
    """
    from smcr import settings  # noqa: PLC0415 - not in every interpreter's start

    try:
        return settings.buffer_size(text)
    except ValueError:
        raise ValueError(f"buffer size {text!r} is not allowed: expected 16k .. 1024m "
                         "(k, m suffixes)") from None


def installed() -> bool:
    """Whether this interpreter runs with smcr installed."""
    return getattr(socket.socket, "_smcr_run", False) is True


_environment: dict[str, str] = {}
"""``SMC_RCVBUF``, ``SMC_SNDBUF`` and ``SMCR_RUN_DEBUG`` as :func:`install` found them."""


def install(boot: bool = False) -> None:
    """Make every new AF_INET/AF_INET6 stream socket an SMC socket (module docstring).
    Idempotent; the buffer sizes and debug output come from the environment.

    :param boot: called by the start-up hook, before the program's first line (an
        eager start then freezes what is alive, :func:`_start_runtime`)."""
    if installed():
        return
    for name in ("SMC_RCVBUF", "SMC_SNDBUF", "SMCR_RUN_DEBUG"):
        _environment[name] = os.environ.get(name, "")
    socket.socket = RunSocket  # type: ignore[misc]
    patches.install()
    eager = os.environ.get("SMCR_RUN_EAGER", "").lower() in ("1", "on", "yes", "true")
    if eager and _smc_class(RunSocket) is not RunSocket:
        _start_runtime(freeze=boot)


_smc_base: type[Any] | None = None
"""The base of every SMC socket class: :class:`smcr.SMCSocket` with the buffer sizes and
debug output of ``smcr run``; None until the first TCP socket imports smcr."""
_smc_classes: dict[type[Any], type[Any]] = {}
"""The class of SMC sockets for each class that ``socket.socket`` is (:func:`_smc_class`)."""
_lock = _thread.RLock()


def _smc_class(cls: type[Any]) -> type[Any]:
    """The class of the SMC sockets that ``cls(...)`` makes: a subclass of ``cls`` and of
    :data:`_smc_base`, named as ``cls``, made once.  The first call imports smcr's socket
    layer; if that fails (a setting smcr refuses, a broken install), a line on standard
    error says so and every socket stays the standard library's (``cls`` itself)."""
    found = _smc_classes.get(cls)
    if found is not None:
        return found
    with _lock:
        found = _smc_classes.get(cls)
        if found is None:
            base = _load()
            if base is None:
                return cls
            names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                     "__doc__": cls.__doc__, "_smcr_smc": True}  # fmt: skip
            metaclass: Any = type(cls)
            found = _smc_classes[cls] = metaclass(cls.__name__, (cls, base), names)
    return found


_load_failed = False
_loading = False  # (a socket that importing smcr makes is a plain one)


def _load() -> type[Any] | None:
    """:data:`_smc_base`, importing smcr's socket layer the first time (under ``_lock``);
    None if that failed."""
    global _smc_base, _load_failed, _loading  # noqa: PLW0603 - one per process
    if _smc_base is not None or _load_failed or _loading:
        return _smc_base
    _loading = True
    try:
        from smcr.socket import SMCSocket  # noqa: PLC0415 - with the first TCP socket
        from smcr.socket.base import bufsize  # noqa: PLC0415

        names: dict[str, Any] = {"__module__": __name__, "__qualname__": "SMCSocket"}
        for name, attribute in (("SMC_RCVBUF", "default_rmb_size"),
                                ("SMC_SNDBUF", "default_sndbuf_size")):  # fmt: skip
            if _environment.get(name):
                names[attribute] = bufsize(parse_size(_environment[name]))
        if _environment.get("SMCR_RUN_DEBUG") == "1":
            names["_debug"] = True
        base = type("SMCSocket", (SMCSocket,), names)
    except Exception as exc:  # the program must run on whatever happens
        _load_failed = True
        print(f"smcr run: not active in this interpreter: {exc!r}", file=sys.stderr)
        return None
    finally:
        _loading = False
    _smc_base = base
    return base


def _after_fork_in_child() -> None:
    """A child forked while another thread imported smcr would wait for ``_lock``
    forever: it gets a new one (and tries the import again)."""
    global _lock, _loading  # noqa: PLW0603 - the child's own
    _lock = _thread.RLock()
    _loading = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def _start_runtime(freeze: bool) -> None:
    """With ``SMCR_RUN_EAGER=1``: start the runtime with the interpreter: the watcher
    thread, the default RNIC's runtime and the diag endpoint, whose threads otherwise
    start with the program's first SMC socket.  For programs and test harnesses that
    count threads (``threading.active_count()``, ``_thread._count()``: CPython's own
    tests wait for the count to come back after each test): they then see a steady
    count, as they would without smcr.  Costs each interpreter the import of smcr's
    socket layer (a few hundred milliseconds) at start, which is why it is not the
    default.  A failure is left for the first socket to meet.

    With ``freeze`` (the start-up hook's call, before the program's first line), the
    objects alive then (the interpreter's start-up and smcr's modules) move to the
    collector's permanent generation (``gc.freeze``): they live as long as the
    interpreter anyway, and smcr's socket layer roughly doubles the objects every
    full collection walks: harnesses that call ``gc.collect()`` after each test
    (CPython's, 3 per asyncio test) spent 5-8 ms more per call, most of what
    ``smcr run`` added to test_asyncio's time.  Not later: the program's objects
    would never be collected."""
    import gc  # noqa: PLC0415

    from smcr import diag  # noqa: PLC0415
    from smcr.stack.runtime import get_stack  # noqa: PLC0415
    from smcr.stack.watcher import get_watcher  # noqa: PLC0415

    try:
        get_watcher()
        get_stack()
        diag.start()
    except (OSError, ValueError):
        pass
    if freeze:
        gc.freeze()
