"""The peer policy: entries, matching, where they come from, bad input."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from smcr.discovery import policy
from smcr.discovery.policy import PolicyError, parse, parse_rule


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def test_entries_prefix_port_range_and_ipv6_brackets() -> None:
    rules = parse("10.1.0.0/16:5000, 192.0.2.7\n[fd00::/8]:8000-8099  ::1 # comment 10.9.9.9")
    assert [str(r) for r in rules] == ["10.1.0.0/16:5000", "192.0.2.7/32", "[fd00::/8]:8000-8099",
                                       "::1/128"]
    net, host, v6, lo6 = rules
    assert net.matches(ip("10.1.200.3"), 5000)
    assert not net.matches(ip("10.1.200.3"), 5001)
    assert not net.matches(ip("10.2.0.1"), 5000)
    assert host.matches(ip("192.0.2.7"), 1) and host.matches(ip("192.0.2.7"), 65535)
    assert v6.matches(ip("fd12::1"), 8099) and not v6.matches(ip("fd12::1"), 8100)
    assert lo6.matches(ip("::1"), 80) and not lo6.matches(ip("127.0.0.1"), 80)


def test_ipv4_mapped_peer_matches_ipv4_entry() -> None:
    """A dual-stack socket sees IPv4 peers as ::ffff:a.b.c.d."""
    assert parse_rule("127.0.0.0/8").matches(ip("::ffff:127.0.0.5"), 9)


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "host.example", "10.0.0.1:", "10.0.0.1:99999",
                                 "10.0.0.1:5-4", "[::1", "[::1]x", "10.0.0.1:a"])
def test_bad_entries_are_named(bad: str) -> None:
    with pytest.raises(PolicyError, match="peer entry"):
        parse_rule(bad)


def test_load_file_and_environment_together(tmp_path: Path) -> None:
    peers = tmp_path / "peers"
    peers.write_text("# SMC hosts\n10.0.0.0/8:5000\n")
    found = policy.load({"SMCR_PEERS_FILE": str(peers), "SMCR_PEERS": "127.0.0.1"})
    assert [str(r) for r in found.rules] == ["10.0.0.0/8:5000", "127.0.0.1/32"]
    assert found.source == f"{peers} + SMCR_PEERS"
    assert found.matches(ip("10.3.4.5"), 5000) and found.matches(ip("127.0.0.1"), 1)
    assert not found.matches(ip("10.3.4.5"), 5001)


def test_missing_file_is_no_policy_and_bad_one_names_itself(tmp_path: Path) -> None:
    assert policy.load({"SMCR_PEERS_FILE": str(tmp_path / "none")}).rules == ()
    bad = tmp_path / "bad"
    bad.write_text("10.0.0.0/8\nnot-an-address\n")
    with pytest.raises(PolicyError, match=str(bad)):
        policy.load({"SMCR_PEERS_FILE": str(bad)})
    with pytest.raises(PolicyError, match="SMCR_PEERS"):
        policy.load({"SMCR_PEERS_FILE": str(tmp_path / "none"), "SMCR_PEERS": "1.2.3.4:x"})
