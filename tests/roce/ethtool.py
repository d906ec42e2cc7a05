"""Turn a net device feature on or off (``ethtool -K``), for hosts without the ethtool tool.

Used by the capture test to switch off UDP segmentation offload on a veth, so
that the kernel cuts our UDP GSO sends into packets *before* the capture point
and the capture shows the IPv4 IDs the kernel really gave them.  Run inside a
namespace: ``python -m tests.roce.ethtool IFNAME FEATURE on|off``.
"""

from __future__ import annotations

import array
import fcntl
import socket
import struct
import sys

SIOCETHTOOL = 0x8946
ETHTOOL_GSSET_INFO = 0x37
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_SFEATURES = 0x3B
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32


def _ioctl(sock: socket.socket, ifname: str, data: array.array[int]) -> None:
    addr, _ = data.buffer_info()
    ifreq = struct.pack("16sP", ifname.encode(), addr).ljust(40, b"\0")
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)


def feature_names(sock: socket.socket, ifname: str) -> list[str]:
    """The device's feature names, in bit order (``ethtool -k`` lists them)."""
    info = array.array("B", struct.pack("IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0))
    _ioctl(sock, ifname, info)
    count = struct.unpack_from("I", info, 16)[0]
    strings = array.array("B", struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count)
                          + bytes(count * ETH_GSTRING_LEN))  # fmt: skip
    _ioctl(sock, ifname, strings)
    raw = strings.tobytes()[12:]
    return [raw[i * 32 : (i + 1) * 32].split(b"\0", 1)[0].decode() for i in range(count)]


def set_feature(ifname: str, name: str, on: bool) -> None:
    """Request feature ``name`` on or off on ``ifname`` (in this network namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        names = feature_names(sock, ifname)
        bit = names.index(name)
        blocks = (len(names) + 31) // 32
        words = [0] * (2 * blocks)
        words[2 * (bit // 32)] = 1 << (bit % 32)  # valid
        words[2 * (bit // 32) + 1] = (1 << (bit % 32)) if on else 0  # requested
        req = array.array("B", struct.pack(f"II{2 * blocks}I", ETHTOOL_SFEATURES, blocks, *words))
        _ioctl(sock, ifname, req)


if __name__ == "__main__":
    set_feature(sys.argv[1], sys.argv[2], sys.argv[3] == "on")
