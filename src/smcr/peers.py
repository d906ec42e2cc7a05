"""The syntax of a peers list (``/etc/smcr/peers``, ``SMCR_PEERS``): ``PREFIX[:PORT[-PORT]]``
entries, separated by commas, blanks or lines, ``#`` comments.  What the entries mean for
discovery is :mod:`smcr.discovery.policy`'s; the syntax lives down here so that the
settings (:mod:`smcr.settings`) can check ``SMCR_PEERS`` without importing discovery.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class PolicyError(ValueError):
    """An entry that is not ``PREFIX[:PORT[-PORT]]``."""


@dataclass(frozen=True, slots=True)
class PeerRule:
    """One entry: a prefix and an inclusive port range (0-65535 for any port)."""

    network: IpNetwork
    low: int = 0
    high: int = 65535

    def matches(self, address: IpAddress, port: int) -> bool:
        """Whether ``address`` (an IPv4-mapped IPv6 address counts as IPv4) on ``port``
        is covered."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return (address.version == self.network.version and address in self.network
                and self.low <= port <= self.high)  # fmt: skip

    def __str__(self) -> str:
        if (self.low, self.high) == (0, 65535):
            return str(self.network)
        ports = str(self.low) if self.low == self.high else f"{self.low}-{self.high}"
        net = f"[{self.network}]" if self.network.version == 6 else str(self.network)
        return f"{net}:{ports}"


def _ports(text: str, entry: str) -> tuple[int, int]:
    low_text, _, high_text = text.partition("-")
    try:
        low = int(low_text)
        high = int(high_text) if high_text else low
    except ValueError:
        raise PolicyError(f"bad port in peer entry {entry!r}") from None
    if not 0 <= low <= high <= 65535:
        raise PolicyError(f"bad port range in peer entry {entry!r}")
    return low, high


def parse_rule(entry: str) -> PeerRule:
    """One ``PREFIX[:PORT[-PORT]]`` entry.

    :raises PolicyError: for anything else.
    """
    text = entry.strip()
    ports = None
    if text.startswith("["):
        net_text, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise PolicyError(f"bad peer entry {entry!r}")
        ports = rest[1:] if rest else None
    elif text.count(":") == 1:
        net_text, _, ports = text.partition(":")
    else:
        net_text = text
    try:
        network = ipaddress.ip_network(net_text, strict=False)
    except ValueError:
        raise PolicyError(f"bad address prefix in peer entry {entry!r}") from None
    if ports is not None:
        return PeerRule(network, *_ports(ports, entry))
    return PeerRule(network)


def parse(text: str) -> list[PeerRule]:
    """Entries of a file or of ``SMCR_PEERS``: separated by commas, blanks or lines;
    ``#`` comments to the end of a line."""
    rules = []
    for line in text.splitlines():
        for entry in line.split("#", 1)[0].replace(",", " ").split():
            rules.append(parse_rule(entry))
    return rules
