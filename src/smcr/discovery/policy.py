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

import os
from dataclasses import dataclass
from pathlib import Path

from smcr.peers import IpAddress, PeerRule, PolicyError, parse, parse_rule

DEFAULT_FILE = Path("/etc/smcr/peers")

__all__ = ["DEFAULT_FILE", "IpAddress", "PeerRule", "Policy", "PolicyError", "parse",
           "parse_rule"]  # (the entries' syntax is smcr.peers's)

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
