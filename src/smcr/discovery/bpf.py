"""Discovery by the SMC TCP option: load, attach and pin the sock_ops program.

Who needs what.  Loading a program and attaching it to a cgroup needs root
(CAP_BPF and CAP_NET_ADMIN): that is :func:`enable` (``smcr enable``), run
once per boot.  It attaches the program to a cgroup v2 directory (by default
the root of the cgroup v2 hierarchy: every process of the host) and pins the
link and the per-socket map in a bpffs directory (``/sys/fs/bpf/smcr``, or
``SMCR_BPF_DIR``), so that they outlive the command.  The map is pinned
readable and writable for everyone: a process reaches a map entry only
through a socket descriptor it holds, so it can only ever mark or read its own
sockets.  After that, any smcr process of that cgroup, root or not, opens the
pinned map (:class:`SocketFlags`) and uses discovery: per connection it costs
one map update before ``connect``/``listen`` and one lookup after.

A second map, also every user's, counts per local port the listeners with
``SMC_LIMIT_HS`` whose SMC handshakes are congested; their SYN-ACKs go without
the option meanwhile (:mod:`.program`).  A user can so keep SMC off another's
port, which flooding that port with handshakes would do as well; it cannot
reach a connection that has started.
:func:`disable` (``smcr disable``) detaches the program and removes the pins.

Sockets of processes outside the cgroup send no option, so their peers see a
plain TCP client or server: they fall back, as Linux does with a peer that
does not speak SMC.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from smcr.discovery import bpfsys, program

BPFFS = Path("/sys/fs/bpf")
DEFAULT_PIN_DIR = BPFFS / "smcr"
RUN_BPFFS = Path("/run/smcr-bpf")
RUN_PIN_DIR = RUN_BPFFS / "smcr"
"""A second copy of the pins, for processes started by ``ip netns exec``: it mounts a
sysfs of the namespace over ``/sys``, which hides ``/sys/fs/bpf``."""
MAP_PIN, LINK_PIN, PORTS_PIN, WITHHELD_PIN = "map", "link", "ports", "withheld"
PROG_PIN_PREFIX = "prog-v"
PROG_PIN = f"{PROG_PIN_PREFIX}{program.VERSION}"
"""The program itself, pinned under its version: which one is attached, at a glance."""
PINS = (MAP_PIN, LINK_PIN, PORTS_PIN, WITHHELD_PIN, PROG_PIN)
"""What ``smcr enable`` pins; a directory without all of them holds another smcr's
program, which ``enable`` replaces."""
_BPF_FS_MAGIC = 0xCAFE4A11
_LINK_TYPE_CGROUP = 3


def pin_dir() -> Path:
    """Where ``smcr enable`` pins the map and the link (``SMCR_BPF_DIR`` overrides)."""
    return Path(os.environ.get("SMCR_BPF_DIR") or DEFAULT_PIN_DIR)


def pin_dirs() -> list[Path]:
    """Where to look for the pins: :func:`pin_dir`, and by default also
    :data:`RUN_PIN_DIR`."""
    if os.environ.get("SMCR_BPF_DIR"):
        return [pin_dir()]
    return [DEFAULT_PIN_DIR, RUN_PIN_DIR]


def cgroup2_mount() -> Path | None:
    """The mount point of the cgroup v2 hierarchy, or None when there is none."""
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return Path(fields[1].replace("\\040", " "))
    except OSError:
        return None
    return None


def own_cgroup() -> Path | None:
    """This process's cgroup v2 directory (from ``/proc/self/cgroup``), or None."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    try:
        with open("/proc/self/cgroup") as lines:
            for line in lines:
                if line.startswith("0::"):
                    return mount / line[3:].strip().lstrip("/")
    except OSError:
        return None
    return None


def _is_bpffs(path: Path) -> bool:
    buf = ctypes.create_string_buffer(128)  # struct statfs: f_type is the first field
    if bpfsys.libc.statfs(os.fsencode(path), buf) != 0:
        return False
    return bool(struct.unpack_from("=q", buf.raw)[0] == _BPF_FS_MAGIC)


def _mount_bpffs(path: Path) -> None:
    """Mount a bpffs at ``path`` unless one is there (``mount -t bpf bpf /sys/fs/bpf``)."""
    if _is_bpffs(path):
        return
    path.mkdir(parents=True, exist_ok=True)
    if bpfsys.libc.mount(b"bpf", os.fsencode(path), b"bpf", 0, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount bpffs on {path}: {os.strerror(err)}")


@dataclass(frozen=True, slots=True)
class Status:
    """What ``smcr enable`` left in a pin directory."""

    enabled: bool
    pin_dir: Path
    cgroup: Path | None = None  # where the program is attached
    prog_id: int = 0
    covers_us: bool = False  # this process is in that cgroup (or below it)
    why: str = ""  # when not enabled: what is missing
    cgroup_id: int = 0
    replaced: int = 0
    """The id of an earlier smcr's program that :func:`enable` put this one in place of:
    processes started before it keep that program's socket map, which no program reads
    now, so their new connections are TCP until they restart (0: nothing replaced)."""

    def attached_to(self) -> str:
        """Where the program is attached, in words (when enabled)."""
        if self.cgroup is not None:
            return f"cgroup {self.cgroup}"
        if self.cgroup_id:
            return f"cgroup id {self.cgroup_id} (not visible here)"
        return "a cgroup only root can tell (the pinned link is root's)"


def _cgroup_path(cgroup_id: int) -> Path | None:
    """The cgroup v2 directory whose inode number is ``cgroup_id``."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    if mount.stat().st_ino == cgroup_id:
        return mount
    for root, dirs, _files in os.walk(mount):
        for name in dirs:
            path = Path(root) / name
            try:
                if path.stat().st_ino == cgroup_id:
                    return path
            except OSError:
                continue
    return None


def status(pins: Path | None = None) -> Status:
    """Whether discovery is enabled in ``pins`` (default: the first of :func:`pin_dirs`
    that has it), where, and whether this process is covered."""
    if pins is None:
        found = [status(where) for where in pin_dirs()]
        return next((state for state in found if state.enabled), found[0])
    if not bpfsys.supported():
        return Status(False, pins, why="bpf(2) is not known on this architecture")
    try:
        link_fd = bpfsys.obj_get(str(pins / LINK_PIN))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return Status(False, pins, why=f"nothing pinned at {pins / LINK_PIN}")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return _status_unprivileged(pins, exc)
        return Status(False, pins, why=f"{pins / LINK_PIN}: {os.strerror(exc.errno or 0)}")
    try:
        link_type, prog_id, cgroup_id = bpfsys.link_info(link_fd)
    except OSError as exc:
        return Status(False, pins, why=f"link information: {exc.strerror}")
    finally:
        os.close(link_fd)
    if link_type != _LINK_TYPE_CGROUP or cgroup_id == 0:
        return Status(False, pins, why="the pinned link is detached")
    cgroup = _cgroup_path(cgroup_id)
    mine = own_cgroup()
    # where the cgroup tree is not visible (``ip netns exec`` mounts its own /sys), take
    # it that we are covered; if not, our SYNs carry no option and both ends see TCP
    covers = cgroup is None or mine is None or mine == cgroup or cgroup in mine.parents
    return Status(True, pins, cgroup, prog_id, covers, cgroup_id=cgroup_id)


def _status_unprivileged(pins: Path, denied: OSError) -> Status:
    """The status as a user other than root sees it: the link is root's alone (whoever may
    open it may detach it, so ``smcr enable`` leaves it mode 0600), but the map is every
    user's (0666), and a map pinned beside a link is the program's, attached.  Where it
    is attached stays unknown, so this process is taken to be covered, as where the
    cgroup tree is not visible: if it is not, its SYNs carry no option and both ends see
    TCP."""
    try:
        os.close(bpfsys.obj_get(str(pins / MAP_PIN)))
    except OSError as exc:
        return Status(False, pins, why=f"{pins / LINK_PIN}: {os.strerror(denied.errno or 0)}; "
                                       f"{pins / MAP_PIN}: {os.strerror(exc.errno or 0)}")
    return Status(True, pins, covers_us=True)


def enable(cgroup: Path | None = None, pins: Path | None = None) -> Status:
    """Load the program, attach it to ``cgroup`` (default: the cgroup v2 root) and pin
    it in ``pins``; does nothing when it is enabled there already.

    :raises OSError: not root, no cgroup v2, or the kernel refused (its reason).
    """
    copies = [pins] if pins is not None else pin_dirs()
    pins = copies[0]
    now = status(pins)
    if now.enabled and all((pins / name).exists() for name in PINS):
        return now
    if now.enabled:  # an earlier smcr's program, without the maps of this one: replace it
        for where in copies:
            disable(where)
    replaced = now.prog_id if now.enabled else 0
    target = cgroup or cgroup2_mount()
    if target is None:
        raise OSError(2, "no cgroup v2 hierarchy is mounted")
    _mount_bpffs(BPFFS if BPFFS in pins.parents else pins.parent)
    pins.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name in _ours(pins):  # stale pins of a detached program
        (pins / name).unlink(missing_ok=True)
    blob, key_type, value_type = program.btf()
    fds: list[int] = []
    try:
        btf_fd = bpfsys.btf_load(blob)
        fds.append(btf_fd)
        map_fd = bpfsys.map_create(program.MAP_TYPE_SK_STORAGE, 4, program.VALUE.size,
                                   program.MAP_F_NO_PREALLOC | program.MAP_F_CLONE,
                                   b"smcr_sk", btf_fd, key_type, value_type)  # fmt: skip
        fds.append(map_fd)
        ports_fd = bpfsys.map_create(program.MAP_TYPE_HASH, program.PORT.size,
                                     program.PORT.size, 0, b"smcr_ports",
                                     max_entries=program.PORTS_MAX)  # fmt: skip
        fds.append(ports_fd)
        withheld_fd = bpfsys.map_create(program.MAP_TYPE_LRU_HASH, program.WITHHELD_KEY.size,
                                        4, 0, b"smcr_withheld",
                                        max_entries=program.WITHHELD_MAX)  # fmt: skip
        fds.append(withheld_fd)
        prog_fd = bpfsys.prog_load(program.PROG_TYPE_SOCK_OPS,
                                   program.build(map_fd, ports_fd, withheld_fd),
                                   b"smcr_sockops", program.ATTACH_CGROUP_SOCK_OPS)  # fmt: skip
        fds.append(prog_fd)
        cg_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        fds.append(cg_fd)
        link_fd = bpfsys.link_create(prog_fd, cg_fd, program.ATTACH_CGROUP_SOCK_OPS)
        fds.append(link_fd)
        _pin(pins, map_fd, ports_fd, withheld_fd, prog_fd, link_fd)
        for extra in copies[1:]:
            _mount_bpffs(extra.parent)
            extra.mkdir(mode=0o755, exist_ok=True)
            _pin(extra, map_fd, ports_fd, withheld_fd, prog_fd, link_fd)
    except OSError:
        for where in copies:
            for name in _ours(where):
                (where / name).unlink(missing_ok=True)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return replace(status(pins), replaced=replaced)


def _pin(pins: Path, map_fd: int, ports_fd: int, withheld_fd: int, prog_fd: int,
         link_fd: int) -> None:  # fmt: skip
    """Pin the maps user space uses (every user's), the program, its own map and the link
    (root's) in ``pins``."""
    for name in _ours(pins):
        (pins / name).unlink(missing_ok=True)
    for fd, name in ((map_fd, MAP_PIN), (ports_fd, PORTS_PIN)):
        bpfsys.obj_pin(fd, str(pins / name))
        os.chmod(pins / name, 0o666)
    bpfsys.obj_pin(withheld_fd, str(pins / WITHHELD_PIN))
    bpfsys.obj_pin(prog_fd, str(pins / PROG_PIN))
    bpfsys.obj_pin(link_fd, str(pins / LINK_PIN))


def _ours(pins: Path) -> list[str]:
    """The names in ``pins`` that smcr pins there (this version's, and another's program)."""
    try:
        there = [path.name for path in pins.iterdir()]
    except OSError:
        there = []
    return sorted(set(PINS) | {name for name in there if name.startswith(PROG_PIN_PREFIX)})


def disable(pins: Path | None = None) -> bool:
    """Detach the program and remove the pins (default: in every one of
    :func:`pin_dirs`); whether anything was enabled there."""
    if pins is None:
        return any([disable(where) for where in pin_dirs()])
    was = False
    try:
        link_fd = bpfsys.obj_get(str(pins / LINK_PIN))
    except OSError:
        link_fd = -1
    if link_fd >= 0:
        try:
            bpfsys.link_detach(link_fd)
            was = True
        except OSError:
            pass
        finally:
            os.close(link_fd)
    for name in _ours(pins):
        try:
            (pins / name).unlink()
            was = True
        except FileNotFoundError:
            pass
    try:
        if pins not in (BPFFS, RUN_BPFFS):
            pins.rmdir()
    except OSError:
        pass
    return was


class SocketFlags:
    """The pinned map, opened by an smcr process: mark a socket, read what the peer said.

    Keys are socket descriptors of this process; the kernel finds the socket's
    own entry (an sk-storage map), so nothing here outlives the socket.
    """

    def __init__(self, pins: Path | None = None) -> None:
        self.path = (pins or status().pin_dir) / MAP_PIN
        self.fd = bpfsys.obj_get(str(self.path))
        # one key and value buffer and two attribute blocks pointing at them, made once:
        # a connection costs two system calls, nothing else (a lock keeps threads apart)
        self._key = ctypes.c_int(0)
        self._value = (ctypes.c_uint32 * 2)()
        entry = (self.fd, 0, ctypes.addressof(self._key), ctypes.addressof(self._value), 0)
        self._update = bpfsys.prepare(struct.pack("=IIQQQ", *entry))
        self._lookup = bpfsys.prepare(struct.pack("=IIQQQ", *entry))
        self._lock = threading.Lock()
        try:
            self.ports_fd = bpfsys.obj_get(str(self.path.with_name(PORTS_PIN)))
        except OSError:
            self.ports_fd = -1  # (an earlier smcr's program: SMC_LIMIT_HS has no effect)

    def want(self, fd: int) -> None:
        """Ask for the option on this socket's SYN (before ``connect``) or SYN-ACKs
        (before ``listen``; its accepted children inherit it)."""
        with self._lock:
            self._key.value = fd
            self._value[0], self._value[1] = 1, 0
            bpfsys.call_prepared(bpfsys.MAP_UPDATE_ELEM, self._update)

    def peer(self, fd: int) -> bool:
        """Whether the peer's SYN (accepted socket) or SYN-ACK (connected socket)
        carried the option, and this socket asked for it."""
        with self._lock:
            self._key.value = fd
            try:
                bpfsys.call_prepared(bpfsys.MAP_LOOKUP_ELEM, self._lookup)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return False
                raise
            return bool(self._value[0] and self._value[1])

    def congested(self, port: int, more: bool) -> bool:
        """Count one more (``more``) or one fewer listener of local ``port`` whose SMC
        handshakes are congested: while any is, the port's SYN-ACKs go without the
        option.  False when the program has no ports map (nothing counted).

        The count is read, changed and written back: listeners of one port in two
        processes (``SO_REUSEPORT``) that change it at the same moment may lose a
        change; :meth:`port_listens` puts it right at the next ``listen``."""
        if self.ports_fd < 0:
            return False
        key = program.PORT.pack(port)
        with self._lock:
            found = bpfsys.map_lookup(self.ports_fd, key, program.PORT.size)
            count = program.PORT.unpack(found)[0] if found is not None else 0
            count = count + 1 if more else max(0, count - 1)
            if count:
                bpfsys.map_update(self.ports_fd, key, program.PORT.pack(count))
            else:
                bpfsys.map_delete(self.ports_fd, key)
        return True

    def port_listens(self, port: int) -> None:
        """A listener starts on ``port``: a count a listener before it left there (one
        killed while congested) no longer holds."""
        if self.ports_fd >= 0:
            with self._lock:
                bpfsys.map_delete(self.ports_fd, program.PORT.pack(port))

    def close(self) -> None:
        """Let the maps go (the pins stay)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.ports_fd >= 0:
            os.close(self.ports_fd)
            self.ports_fd = -1
