"""``SMCR_TCP_PORTS``: connections of the ports a user names stay plain TCP (short
connections, whose SMC-R set-up costs more than they gain).

A client connecting to such a port sends no SMC option in its SYN, a listener on one
none in its SYN-ACKs: each end falls back as with a peer that does not speak SMC
(``0x03010000``), as Linux does when an ``smc_hs_ctrl`` program says no.  The other ports
keep SMC-R.  Both ends live in this process here: discovery is chosen again
(``discovery.reset``) after the environment changes, so one end can name the port and
the other not.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

import smcr
from smcr import discovery, settings
from smcr.wire.decline import DeclineCode

PEERNOSMC = int(DeclineCode.PEERNOSMC)


def keep_tcp(monkeypatch: pytest.MonkeyPatch, ports: str | None) -> discovery.Discovery:
    """Name ``ports`` in ``SMCR_TCP_PORTS`` (None: unset) and choose discovery again."""
    if ports is None:
        monkeypatch.delenv("SMCR_TCP_PORTS", raising=False)
    else:
        monkeypatch.setenv("SMCR_TCP_PORTS", ports)
    discovery.reset()
    return discovery.current()


def exchange(server: smcr.SMCSocket) -> tuple[tuple[str, int], tuple[str, int]]:
    """Connect to ``server``, a message each way checked byte for byte: (mode, local
    decline code) of the client and of the accepted end."""
    with smcr.create_connection(server.getsockname(), timeout=20) as client:
        accepted, _ = server.accept()
        with accepted:
            accepted.settimeout(20)
            client.sendall(b"request!")
            assert accepted.recv(64) == b"request!"  # (no CLC message among the bytes)
            accepted.sendall(b"response")
            assert client.recv(64) == b"response"
            a, c = client.smc_info(), accepted.smc_info()
            return (a.mode, a.local_code), (c.mode, c.local_code)


def bound() -> smcr.SMCSocket:
    """A server socket bound to a port of its own, not listening yet."""
    srv = smcr.SMCSocket()
    srv.bind(("127.0.0.1", 0))
    srv.settimeout(20)
    return srv


def test_ports_and_ranges_are_parsed_and_bad_ones_named() -> None:
    assert settings.port_ranges("80, 8000-8099 443") == ((80, 80), (8000, 8099), (443, 443))
    for bad in ("", "0", "65536", "90-80", "http", "80-", "-80", "80,x"):
        with pytest.raises(ValueError):
            settings.port_ranges(bad)
    with pytest.raises(settings.SettingError, match="SMCR_TCP_PORTS='8o'"):
        settings.TCP_PORTS.check("8o")
    found = discovery.Discovery("bpf", tcp_ports=((80, 80), (8000, 8099)))
    assert found.keeps_tcp(80) and found.keeps_tcp(8050) and found.keeps_tcp(8099)
    assert not found.keeps_tcp(81) and not found.keeps_tcp(8100) and not found.keeps_tcp(0)


def test_smcr_discovery_shows_the_ports() -> None:
    env = {**os.environ, "SMCR_TCP_PORTS": "8000, 9000-9099"}

    def discovery_cli(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "smcr", "discovery", *args], env=env,
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        return out.stdout

    assert ("plain TCP (SMCR_TCP_PORTS): connections of ports 8000, 9000-9099"
            in discovery_cli().splitlines())  # fmt: skip
    assert json.loads(discovery_cli("--json"))["tcp_ports"] == [[8000, 8000], [9000, 9099]]


def test_a_bad_value_turns_smc_off_with_its_reason(discovery_env: pytest.MonkeyPatch) -> None:
    found = keep_tcp(discovery_env, "80,web")
    assert found.mode == "off" and "SMCR_TCP_PORTS='80,web'" in found.why
    assert not found.opt_in(socket.socket(), 5000)


root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (BPF)")


@pytest.mark.root
@root
def test_a_listener_on_a_named_port_has_its_clients_stay_tcp(
        discovery_env: pytest.MonkeyPatch) -> None:  # fmt: skip
    assert keep_tcp(discovery_env, None).mode == "bpf"
    named, other = bound(), bound()
    with named, other:
        other.listen()
        # the server names its port when it listens; its clients do not
        assert keep_tcp(discovery_env, str(named.getsockname()[1])).mode == "bpf"
        named.listen()
        keep_tcp(discovery_env, None)
        assert exchange(named) == (("TCP", PEERNOSMC), ("TCP", PEERNOSMC))
        assert exchange(other) == (("SMCR", 0), ("SMCR", 0))


@pytest.mark.root
@root
def test_a_client_of_a_named_port_stays_tcp(discovery_env: pytest.MonkeyPatch) -> None:
    assert keep_tcp(discovery_env, None).mode == "bpf"
    named, other = bound(), bound()
    with named, other:
        named.listen()
        other.listen()
        port = named.getsockname()[1]
        found = keep_tcp(discovery_env, f"{port}-{port}")
        assert found.keeps_tcp(port) and not found.keeps_tcp(other.getsockname()[1])
        assert exchange(named) == (("TCP", PEERNOSMC), ("TCP", PEERNOSMC))
        assert exchange(other) == (("SMCR", 0), ("SMCR", 0))


def test_with_a_peer_list_both_ends_naming_the_port_stay_tcp(
        discovery_env: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Discovery by policy: no option to hold back, so both ends must name the port (a
    client that lists the server's port and does not name it sends its Proposal, as to
    any listed peer that does not speak SMC)."""
    discovery_env.setenv("SMCR_DISCOVERY", "policy")
    discovery_env.setenv("SMCR_PEERS", "127.0.0.1")
    named, other = bound(), bound()
    with named, other:
        found = keep_tcp(discovery_env, str(named.getsockname()[1]))
        assert found.mode == "policy"
        named.listen()
        other.listen()
        assert exchange(named) == (("TCP", PEERNOSMC), ("TCP", PEERNOSMC))
        assert exchange(other) == (("SMCR", 0), ("SMCR", 0))
