"""The ``bpf(2)`` system call from pure Python (ctypes): no compiler, no libbpf, no headers.

Only the commands discovery needs.  Every attribute block is packed with
:mod:`struct` in the kernel's ``union bpf_attr`` layout and padded with zeros
(the kernel refuses non-zero bytes past the fields it knows for a command).
Failures raise :class:`OSError` with the kernel's errno, so callers can tell
"not allowed" (``EPERM``) from "not there" (``ENOENT``).
"""

from __future__ import annotations

import ctypes
import os
import struct

# union bpf_attr commands (include/uapi/linux/bpf.h)
MAP_CREATE = 0
MAP_LOOKUP_ELEM = 1
MAP_UPDATE_ELEM = 2
MAP_DELETE_ELEM = 3
PROG_LOAD = 5
OBJ_PIN = 6
OBJ_GET = 7
OBJ_GET_INFO_BY_FD = 15
BTF_LOAD = 18
LINK_CREATE = 28
LINK_DETACH = 34

_ATTR_SIZE = 144  # the fields used here end well before; the rest must be zero
_SYSCALL_NR = {"x86_64": 321, "aarch64": 280, "arm64": 280, "riscv64": 280, "ppc64le": 361,
               "s390x": 351, "i686": 357, "armv7l": 386}  # fmt: skip

_MACHINE = os.uname().machine
"""What ``platform.machine()`` says (it asks ``os.uname``; importing :mod:`platform` costs a
process's start about 2 ms)."""


def _libc() -> ctypes.CDLL:
    """The C library, errno kept: the process's own symbols, which include it (Python is
    linked against it), or by name where not.  (``ctypes.util.find_library`` would cost a
    process's start about 18 ms: it imports subprocess, shutil and tempfile, and asks
    ``ldconfig``.)"""
    lib = ctypes.CDLL(None, use_errno=True)
    try:
        lib.syscall  # noqa: B018 - looked up to see that it is there
    except AttributeError:
        lib = ctypes.CDLL("libc.so.6", use_errno=True)
    return lib


libc = _libc()
"""The C library, errno kept (also for the mount and statfs calls of :mod:`.bpf`)."""
libc.syscall.restype = ctypes.c_long
_NR = ctypes.c_long(_SYSCALL_NR.get(_MACHINE, -1))


def supported() -> bool:
    """Whether this machine's architecture has a known ``bpf(2)`` number."""
    return _MACHINE in _SYSCALL_NR


def call(cmd: int, attr: bytes) -> int:
    """``bpf(cmd, attr, size)``; returns the kernel's non-negative result.

    :raises OSError: with the kernel's errno (``ENOSYS`` on an unknown architecture).
    """
    nr = _SYSCALL_NR.get(_MACHINE)
    if nr is None:
        raise OSError(38, f"bpf(2): unknown system call number on {_MACHINE}")
    buf = ctypes.create_string_buffer(attr.ljust(_ATTR_SIZE, b"\0"), _ATTR_SIZE)
    result = int(libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf,
                               ctypes.c_uint(_ATTR_SIZE)))  # fmt: skip
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf(cmd={cmd}): {os.strerror(err)}")
    return result


def call_prepared(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    """``bpf(cmd, attr)`` with an attribute block made once (:func:`prepare`) and reused:
    the per-connection calls cost one system call and no allocation.

    :raises OSError: with the kernel's errno.
    """
    result = int(libc.syscall(_NR, cmd, attr, _ATTR_SIZE))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def prepare(attr: bytes) -> ctypes.Array[ctypes.c_char]:
    """An attribute block for :func:`call_prepared` (zero-padded as the kernel wants)."""
    return ctypes.create_string_buffer(attr.ljust(_ATTR_SIZE, b"\0"), _ATTR_SIZE)


def _addr(buf: ctypes.Array[ctypes.c_char]) -> int:
    return ctypes.addressof(buf)


def obj_pin(fd: int, path: str) -> None:
    """Pin a BPF object (map, program, link) at ``path`` in a bpffs."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    call(OBJ_PIN, struct.pack("=QII", _addr(p), fd, 0))


def obj_get(path: str) -> int:
    """Open the BPF object pinned at ``path``; a new descriptor (close it)."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    return call(OBJ_GET, struct.pack("=QII", _addr(p), 0, 0))


def map_update(map_fd: int, key: bytes, value: bytes) -> None:
    """Create or replace one element (``BPF_ANY``)."""
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    call(MAP_UPDATE_ELEM, struct.pack("=IIQQQ", map_fd, 0, _addr(k), _addr(v), 0))


def map_lookup(map_fd: int, key: bytes, size: int) -> bytes | None:
    """One element's value, or None when the map has none for ``key``."""
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(size)
    try:
        call(MAP_LOOKUP_ELEM, struct.pack("=IIQQQ", map_fd, 0, _addr(k), _addr(v), 0))
    except OSError as exc:
        if exc.errno == 2:  # ENOENT
            return None
        raise
    return v.raw


def map_delete(map_fd: int, key: bytes) -> None:
    """Delete one element (missing is not an error)."""
    k = ctypes.create_string_buffer(key, len(key))
    try:
        call(MAP_DELETE_ELEM, struct.pack("=IIQ", map_fd, 0, _addr(k)))
    except OSError as exc:
        if exc.errno != 2:
            raise


def btf_load(blob: bytes) -> int:
    """Load BTF type information (the sk-storage map needs a typed value)."""
    b = ctypes.create_string_buffer(blob, len(blob))
    log = ctypes.create_string_buffer(16384)
    try:
        return call(BTF_LOAD, struct.pack("=QQIII", _addr(b), _addr(log), len(blob),
                                          len(log), 1))  # fmt: skip
    except OSError as exc:
        raise OSError(exc.errno, f"BTF load failed: {exc.strerror}: "
                      f"{log.value.decode(errors='replace')[-500:]}") from None  # fmt: skip


def map_create(map_type: int, key_size: int, value_size: int, flags: int, name: bytes,
               btf_fd: int = 0, btf_key_type: int = 0, btf_value_type: int = 0,
               max_entries: int = 0) -> int:  # fmt: skip
    """Create a map (``max_entries`` 0 for sk-storage maps, which have none)."""
    attr = struct.pack("=IIIIIII16sIIII", map_type, key_size, value_size, max_entries, flags,
                       0, 0, name[:15], 0, btf_fd, btf_key_type, btf_value_type)  # fmt: skip
    return call(MAP_CREATE, attr)


def prog_load(prog_type: int, insns: bytes, name: bytes, expected_attach_type: int) -> int:
    """Load a program (GPL); the verifier's log is in the error when it refuses."""
    ib = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 16)
    attr = struct.pack("=IIQQIIQII16sII", prog_type, len(insns) // 8, _addr(ib), _addr(lic),
                       1, len(log), _addr(log), 0, 0, name[:15], 0,
                       expected_attach_type)  # fmt: skip
    try:
        return call(PROG_LOAD, attr)
    except OSError as exc:
        raise OSError(exc.errno, f"program load failed: {exc.strerror}: "
                      f"{log.value.decode(errors='replace')[-2000:]}") from None  # fmt: skip


def link_create(prog_fd: int, target_fd: int, attach_type: int) -> int:
    """Attach a program through a link (detached when the link's last reference goes)."""
    return call(LINK_CREATE, struct.pack("=IIII", prog_fd, target_fd, attach_type, 0))


def link_detach(link_fd: int) -> None:
    """Detach a link at once, whoever still holds it."""
    call(LINK_DETACH, struct.pack("=I", link_fd))


def link_info(link_fd: int) -> tuple[int, int, int]:
    """``(type, prog_id, cgroup_id)`` of a link (cgroup id only for cgroup links; 0 when
    the link was detached)."""
    info = ctypes.create_string_buffer(64)
    call(OBJ_GET_INFO_BY_FD, struct.pack("=IIQ", link_fd, len(info), _addr(info)))
    link_type, _link_id, prog_id, _pad, cgroup_id = struct.unpack_from("=IIIIQ", info.raw)
    return link_type, prog_id, cgroup_id
