"""``smcr chk``: did SMC-R work here, and if not, why (smc-tools' ``smc_chk``).

* ``smcr chk -S [-p PORT] [-6]``: an echo server (every client's mode printed).
* ``smcr chk -C HOST [-p PORT] [-6]``: a client against such a server: sends
  a pattern, checks the echo, says whether SMC-R was used, else the fallback
  codes decoded (:func:`smcr.wire.decline.describe`).
* ``smcr chk``: both on this host, the server in a process of its own (SMC-R is
  between processes), over loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
from typing import Any

PORT = 37373  # smc_chk's default
PATTERN = bytes(range(256)) * 256  # 64 KiB


def _echo(conn: Any) -> None:
    with conn, contextlib.suppress(OSError):
        while data := conn.recv(65536):
            conn.sendall(data)


def serve(port: int, ipv6: bool, once: bool, host: str | None = None) -> int:
    """The echo server: prints ``port N`` first (the local check reads it)."""
    import smcr  # noqa: PLC0415

    address = host or ("::" if ipv6 else "0.0.0.0")
    srv = smcr.create_server((address, port), family=10 if ipv6 else 2)
    print(f"port {srv.getsockname()[1]}", flush=True)
    with srv:
        while True:
            conn, peer = srv.accept()
            info = conn.smc_info()
            how = "SMC-R" if info.mode == "SMCR" else f"TCP {info.reason}"
            print(f"client {peer[0]} port {peer[1]}: {how}", flush=True)
            if once:
                _echo(conn)
                return 0
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()


def check(host: str, port: int, ipv6: bool) -> dict[str, Any]:
    """Connect, echo :data:`PATTERN`, and say how it went."""
    import smcr  # noqa: PLC0415
    from smcr.wire.decline import describe  # noqa: PLC0415

    result: dict[str, Any] = {"host": host, "port": port, "smc": False, "mode": "-",
                              "local_code": 0, "peer_code": 0, "reason": "", "echo_ok": False}
    try:
        sock = smcr.create_connection((host, port), timeout=30.0)
    except OSError as exc:
        result["error"] = f"connect failed: {exc.strerror or exc}"
        return result
    with sock:
        info = sock.smc_info()
        result.update(mode=info.mode, smc=info.mode == "SMCR", local_code=info.local_code,
                      peer_code=info.peer_code)  # fmt: skip
        if info.mode != "SMCR":
            result["reason"] = describe(info.local_code or info.peer_code)
            result["fix"] = fix(info.local_code, info.peer_code)
        try:
            sock.sendall(PATTERN)
            got = bytearray()
            while len(got) < len(PATTERN) and (chunk := sock.recv(65536)):
                got += chunk
            result["echo_ok"] = bytes(got) == PATTERN
        except OSError as exc:
            result["error"] = f"echo failed: {exc.strerror or exc}"
    return result


SHM_UNREACHABLE = (
    "the peer's shm RNIC is out of reach: shm RNICs meet by a socket in the user's "
    "runtime directory (/run/smcr for root: same user, any network namespace) or by an "
    "abstract socket (any user, same network namespace); a container with its own network "
    "namespace and its own /run has neither: run it in the host's network namespace, or "
    "bind-mount the peer's runtime directory into it (same user), or use SMCR_RNIC=roce "
    "on both ends"
)
"""Why an shm link did not come up (``ERR_RDYLNK``), and the fixes (README "Across users
and containers")."""
SHM_OTHER_HOST = (
    "the shm RNIC serves processes of one host and checks that by address: the peer's "
    "address is not this end's (another host, or a container with a network namespace of "
    "its own, whose address tells nothing of the host): use SMCR_RNIC=roce on both ends, "
    "or run the container in the host's network namespace"
)
"""Why an shm connection declined with ``DIFFPREFIX``, and the fixes."""


def fix(local_code: int, peer_code: int) -> str:
    """What to do about a fallback, where smcr can tell: the peer did not offer SMC
    (``PEERNOSMC``) is most often this host's discovery, off or not covering the peer;
    an shm link that could not come up (``ERR_RDYLNK``) a peer out of the shm RNIC's
    reach (:mod:`smcr.rdma.shm.rendezvous`); an shm prefix mismatch (``DIFFPREFIX``) a
    peer at another address (:mod:`smcr.core.handshake`: same host by address)."""
    from smcr import discovery  # noqa: PLC0415
    from smcr.stack.devices import rnic_kind  # noqa: PLC0415
    from smcr.wire.decline import DeclineCode  # noqa: PLC0415

    if rnic_kind() == "shm" and DeclineCode.ERR_RDYLNK in (local_code, peer_code):
        return SHM_UNREACHABLE
    if rnic_kind() == "shm" and DeclineCode.DIFFPREFIX in (local_code, peer_code):
        return SHM_OTHER_HOST
    if DeclineCode.PEERNOSMC not in (local_code, peer_code):
        return ""
    found = discovery.current()
    if found.mode == "off":
        return (f"SMC-R is off here ({found.why}): run 'smcr enable' as root, or list the "
                "peer in SMCR_PEERS or the peers file; 'smcr discovery' tells more")
    return (f"discovery here is {found.mode} ({found.why}); the peer did not offer SMC: is "
            "it on there ('smcr discovery' on the peer)?")


def _local(port: int, ipv6: bool) -> dict[str, Any]:
    host = "::1" if ipv6 else "127.0.0.1"
    cmd = [sys.executable, "-m", "smcr", "chk", "-S", "--once", "-p", str(port), "--bind", host]
    if ipv6:
        cmd.append("-6")
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        first = server.stdout.readline().split()
        if len(first) != 2 or first[0] != "port":
            return {"host": host, "port": port, "smc": False, "error": "server did not start"}
        result = check(host, int(first[1]), ipv6)
        server.wait(timeout=30)
        return result
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def run(args: argparse.Namespace) -> int:
    """0 when SMC-R was used and the echo came back whole, 1 otherwise."""
    from smcr import discovery  # noqa: PLC0415

    discovery.reported_by_caller()  # (a fallback's line names the cause and the fix)
    if args.server:
        return serve(args.port, args.ipv6, args.once, args.bind)
    if args.connect:
        result = check(args.connect, args.port, args.ipv6)
    else:
        result = _local(0 if args.port == PORT else args.port, args.ipv6)
    ok = result["smc"] and result["echo_ok"]
    if args.json:
        print(json.dumps(result))
        return 0 if ok else 1
    print(f"Test with target IP {result['host']} and port {result['port']}")
    if "error" in result:
        print(f"  Live test (SMC-R)  [FAILED]  {result['error']}")
    elif result["smc"]:
        print(f"  Live test (SMC-R)  [{'OK' if result['echo_ok'] else 'FAILED: echo differs'}]")
    else:
        print(f"  Live test (SMC-R)  [FAILED]  fell back to TCP, reason "
              f"0x{result['local_code']:08x}/0x{result['peer_code']:08x}")
        print(f"    {result['reason']}")
        if result.get("fix"):
            print(f"    {result['fix']}")
    return 0 if ok else 1


__all__ = ["PORT", "SHM_OTHER_HOST", "SHM_UNREACHABLE", "check", "fix", "run", "serve"]
