"""Engine configuration: a frozen dataclass with Linux's defaults (STYLE §7).

Every timeout is Linux's (``smc_clc.h``, ``smc_llc.h``, ``smc_close.h``; spec
§2.7 table); tests shorten them through this object, never by patching.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Knobs of the SMC-R engine (Linux defaults)."""

    sndbuf_size: int = 65536
    """Send buffer per connection (sysctl ``net.smc.wmem``, 64 KiB)."""
    rmb_size: int = 65536
    """RMB (receive buffer) per connection (sysctl ``net.smc.rmem``, 64 KiB)."""
    clc_wait: float = 6.0
    """``CLC_WAIT_TIME``: wait for Proposal / Accept / Confirm."""
    llc_wait: float = 2.0
    """``SMC_LLC_WAIT_TIME``: wait for an LLC response."""
    llc_wait_first: float = 4.0
    """``2 * SMC_LLC_WAIT_TIME``: client waits for the first CONFIRM LINK."""
    testlink_time: float = 30.0
    """``SMC_LLC_TESTLINK_DEFAULT_TIME``; 0 disables the keepalive."""
    close_wait_tx: float = 2.0
    """``SMC_MAX_STREAM_WAIT_TIMEOUT``: close waits this long for unsent data."""
    max_conns: int = 255
    """Connections per link group (Linux ``SMC_RMBS_PER_LGR_MAX``)."""
    max_links: int = 2
    """Advertised in CONFIRM LINK (Linux ``SMC_LINKS_ADD_LNK_MAX``)."""
    lgr_linger_server: float = 600.0
    """An empty link group is kept this long for reuse, then ended (Linux, server)."""
    lgr_linger_client: float = 610.0
    """The same for a client's link group (Linux: 10 s more than the server's)."""
    qp_mtu: int = 5
    """Our QP MTU enum for CLC (5 = 4096: the shm RNIC's active MTU)."""


@dataclass(frozen=True, slots=True)
class LocalIdentity:
    """This system as CLC and LLC describe it: RNIC GID and MAC, and the peer ID."""

    gid: bytes
    mac: bytes
    peer_id: bytes
