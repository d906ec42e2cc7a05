"""Discovery by policy: the user names the peers that speak SMC.

Where the TCP option cannot be had (no root to run ``smcr enable``, no cgroup
v2, a middlebox that strips options), smcr can still be told which peers speak
SMC.  An entry names an address prefix and optionally a port or port range::

    10.1.0.0/16:5000        hosts of 10.1/16, port 5000
    192.0.2.7               that host, any port
    [fd00::/8]:8000-8099    IPv6 prefixes go in brackets when a port follows
    ::1                     (without a port, no brackets needed)

The same entries serve both roles, so one file can be given to every host of
a deployment: a client proposes SMC when it connects to a listed address and
port; a server expects a CLC Proposal from a client whose address is listed
for the port it listens on.

Where entries come from: the file ``/etc/smcr/peers`` (or the one
``SMCR_PEERS_FILE`` names; one entry or more per line, ``#`` starts a comment)
and the environment variable ``SMCR_PEERS`` (entries separated by commas or
white space), both together.

What it costs and risks: no system call per connection (a prefix match), but
the policy is a promise about the peer that nothing checks: a listed peer that
does not speak SMC (or a plain program on a listed port) receives a 92-byte CLC
Proposal as data, and the client falls back only after the CLC timeout.  List
only what really runs smcr or Linux SMC.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FILE = Path("/etc/smcr/peers")

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


@dataclass(frozen=True, slots=True)
class Policy:
    """The peers that speak SMC, from the file and the environment."""

    rules: tuple[PeerRule, ...]
    source: str

    def matches(self, address: IpAddress, port: int) -> bool:
        """Whether any entry covers ``address`` on ``port``."""
        return any(rule.matches(address, port) for rule in self.rules)


def load(environ: dict[str, str] | None = None) -> Policy:
    """The policy in force: ``SMCR_PEERS_FILE`` (default :data:`DEFAULT_FILE`, if it
    exists) and ``SMCR_PEERS``.

    :raises PolicyError: naming the file or variable with the bad entry.
    """
    env = os.environ if environ is None else environ
    rules: list[PeerRule] = []
    sources = []
    path = Path(env.get("SMCR_PEERS_FILE") or DEFAULT_FILE)
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = None
    except OSError as exc:
        raise PolicyError(f"{path}: {exc.strerror}") from None
    if text is not None:
        try:
            rules += parse(text)
        except PolicyError as exc:
            raise PolicyError(f"{path}: {exc}") from None
        sources.append(str(path))
    if env.get("SMCR_PEERS"):
        try:
            rules += parse(env["SMCR_PEERS"])
        except PolicyError as exc:
            raise PolicyError(f"SMCR_PEERS: {exc}") from None
        sources.append("SMCR_PEERS")
    return Policy(tuple(rules), " + ".join(sources))
