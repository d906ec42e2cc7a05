"""The process's SMC-R counters, named as Linux ``net/smc/smc_stats.h`` names them.

Design (the why of each):

* **Plain integer updates on the data path.**  A send adds one to
  ``tx_pd[len.bit_length()]`` and a receive one to ``rx_pd[...]``: a list
  index and an add (tens of nanoseconds), no lock, no function call.  The
  request counts (``tx_cnt``/``rx_cnt``) are the sums of those lists, and the
  Linux size buckets (8 KiB .. >1 MiB) are folded from them when asked.  Lost
  updates between threads (``+=`` is not atomic) are possible and accepted, as
  Linux accepts per-CPU counters read without a lock.
* **Bytes are not counted per call**: a connection's cursors already hold them
  (``tx_app``, ``rx_cons``); the runtime adds a connection's to
  :attr:`Counters.closed_tx_bytes`/``closed_rx_bytes`` when it is released, and a
  snapshot adds the live ones (:func:`smcr.diag.snapshot.counters`).
* **Outcomes are counted where the socket learns them** (control path): SMC by
  version and role with its buffer sizes, handshake errors by role, TCP
  fallbacks by role and ``(local, peer)`` reason code.
* The module imports nothing of smcr, so the runtime and the socket layer can
  both reach :data:`COUNTERS` without an import cycle.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Final

BUCKETS: Final = ("8K", "16K", "32K", "64K", "128K", "256K", "512K", "1024K", "G_1024K")
"""Linux ``SMC_BUF_8K`` .. ``SMC_BUF_G_1024K``: sizes up to 8 KiB, up to 16 KiB, ..."""
_BITS: Final = 65


def bucket_of(size: int) -> int:
    """Linux ``smc_stat_*`` bucket index of a size: <= 8 KiB is 0, <= 16 KiB 1, .., > 1 MiB 8."""
    if size <= 8192:
        return 0
    return min(8, (size - 1).bit_length() - 13)


def fold(by_bits: list[int]) -> list[int]:
    """Counts per ``size.bit_length()`` -> counts per Linux bucket.

    ``bit_length`` b holds sizes in [2**(b-1), 2**b - 1]; its Linux bucket is that
    of its largest size, except that the exact power of two 2**(b-1) belongs to the
    bucket below -- a slip of one size per bucket, the price of one add per call.
    """
    out = [0] * len(BUCKETS)
    for bits, count in enumerate(by_bits):
        if count:
            out[bucket_of((1 << bits) - 1 if bits else 0)] += count
    return out


class Counters:
    """One process's counters (module docstring); :data:`COUNTERS` is the process's."""

    __slots__ = ("bell_cnt", "clc_spin_cnt", "clnt_fback", "clnt_hshake_err_cnt",
                 "clnt_v1_succ_cnt", "clnt_v2_succ_cnt", "closed_rx_bytes", "closed_tx_bytes",
                 "closed_tx_peer_full",
                 "cork_cnt", "inplace_cnt", "late_news_cnt", "ndly_cnt", "rx_buf_full_cnt",
                 "rx_pd", "rx_rmbsize",
                 "sendfile_cnt",
                 "srv_fback", "srv_hshake_err_cnt", "srv_v1_succ_cnt", "srv_v2_succ_cnt",
                 "trimmed_bytes", "tx_buf_full_cnt", "tx_pd", "tx_rmbsize",
                 "urg_data_cnt")  # fmt: skip

    def __init__(self) -> None:
        self.tx_pd = [0] * _BITS  # per request size's bit_length (data path)
        self.rx_pd = [0] * _BITS
        self.tx_rmbsize = [0] * len(BUCKETS)  # send buffers of SMC connections
        self.rx_rmbsize = [0] * len(BUCKETS)  # RMBs
        self.tx_buf_full_cnt = 0  # send: our send buffer was full (rmb_tx.buf_full_cnt)
        self.rx_buf_full_cnt = 0  # receive: our RMB was full (rmb_rx.buf_full_cnt)
        self.closed_tx_peer_full = 0  # released connections' writes the peer's RMB blocked
        self.closed_tx_bytes = 0
        self.closed_rx_bytes = 0
        self.clnt_v1_succ_cnt = self.clnt_v2_succ_cnt = 0
        self.srv_v1_succ_cnt = self.srv_v2_succ_cnt = 0
        self.clnt_hshake_err_cnt = self.srv_hshake_err_cnt = 0
        self.clnt_fback: Counter[tuple[int, int]] = Counter()
        self.srv_fback: Counter[tuple[int, int]] = Counter()
        self.urg_data_cnt = self.cork_cnt = self.ndly_cnt = self.sendfile_cnt = 0
        self.bell_cnt = 0  # smcr's own: messages whose peer rang the reader's bell
        self.inplace_cnt = 0  # smcr's own: CDCs read in the QP's receive ring (shm)
        self.late_news_cnt = 0
        """smcr's own: news that the standing-by progress thread found at a look-in, with
        nobody rung for it (a missed wake-up: it waited up to ``STANDBY``)."""
        self.clc_spin_cnt = 0
        """smcr's own: handshake messages (a client's Accept, a server's Confirm) that the
        waiting thread watched for and caught without sleeping (:mod:`smcr.stack.progress`,
        ``CLC_SPIN``)."""
        self.trimmed_bytes = 0
        """smcr's own: bytes of peers' RMBs that quiet connections had written and gave
        back (:mod:`smcr.stack.trim`)."""

    # ------------------------------------------------------------ control path

    def smc_established(self, server: bool, version: int, rmb_size: int,
                        sndbuf_size: int) -> None:  # fmt: skip
        """A handshake ended in SMC-R (Linux ``SMC_STAT_SERV_SUCC_INC``/``CLNT_SUCC_INC``)."""
        if server:
            if version >= 2:
                self.srv_v2_succ_cnt += 1
            else:
                self.srv_v1_succ_cnt += 1
        elif version >= 2:
            self.clnt_v2_succ_cnt += 1
        else:
            self.clnt_v1_succ_cnt += 1
        self.rx_rmbsize[bucket_of(rmb_size)] += 1
        self.tx_rmbsize[bucket_of(sndbuf_size)] += 1

    def handshake_failed(self, server: bool) -> None:
        """A handshake failed with no way back to TCP (``*_hshake_err_cnt``)."""
        if server:
            self.srv_hshake_err_cnt += 1
        else:
            self.clnt_hshake_err_cnt += 1

    def fell_back(self, server: bool, local: int, peer: int) -> None:
        """A connection fell back to TCP (Linux ``smc_stat_fallback``, by reason)."""
        (self.srv_fback if server else self.clnt_fback)[(local, peer)] += 1

    def released(self, conn: Any) -> None:
        """An SMC connection was released: keep what its cursors counted (runtime)."""
        self.closed_tx_bytes += getattr(conn, "tx_app", 0)
        self.closed_rx_bytes += getattr(conn, "rx_cons", 0)
        self.closed_tx_peer_full += getattr(conn, "stats_write_blocked", 0)

    def to_dict(self, live_tx: int = 0, live_rx: int = 0, live_peer_full: int = 0
                ) -> dict[str, Any]:  # fmt: skip
        """The counters as :func:`smcr.diag.stats` shapes them (JSON; Linux names)."""
        tx_pd, rx_pd = fold(self.tx_pd), fold(self.rx_pd)
        return {
            "clnt_v1_succ_cnt": self.clnt_v1_succ_cnt, "clnt_v2_succ_cnt": self.clnt_v2_succ_cnt,
            "srv_v1_succ_cnt": self.srv_v1_succ_cnt, "srv_v2_succ_cnt": self.srv_v2_succ_cnt,
            "clnt_hshake_err_cnt": self.clnt_hshake_err_cnt,
            "srv_hshake_err_cnt": self.srv_hshake_err_cnt,
            "clnt_fback_cnt": sum(self.clnt_fback.values()),
            "srv_fback_cnt": sum(self.srv_fback.values()),
            "clnt_fback": _reasons(self.clnt_fback), "srv_fback": _reasons(self.srv_fback),
            "tx_bytes": self.closed_tx_bytes + live_tx, "rx_bytes": self.closed_rx_bytes + live_rx,
            "tx_cnt": sum(tx_pd), "rx_cnt": sum(rx_pd),
            "tx_pd": tx_pd, "rx_pd": rx_pd,
            "tx_rmbsize": list(self.tx_rmbsize), "rx_rmbsize": list(self.rx_rmbsize),
            "tx_buf_full_cnt": self.tx_buf_full_cnt,
            "tx_buf_full_peer_cnt": self.closed_tx_peer_full + live_peer_full,
            "rx_buf_full_cnt": self.rx_buf_full_cnt,
            "urg_data_cnt": self.urg_data_cnt, "cork_cnt": self.cork_cnt,
            "ndly_cnt": self.ndly_cnt, "sendfile_cnt": self.sendfile_cnt,
            "bell_cnt": self.bell_cnt, "inplace_cnt": self.inplace_cnt,
            "late_news_cnt": self.late_news_cnt, "trimmed_bytes": self.trimmed_bytes,
            "clc_spin_cnt": self.clc_spin_cnt,
        }  # fmt: skip

    def any(self) -> bool:
        """Whether anything was counted (a process that counted nothing leaves no file)."""
        return bool(any(self.tx_pd) or any(self.rx_pd) or self.clnt_fback or self.srv_fback
                    or self.clnt_hshake_err_cnt or self.srv_hshake_err_cnt
                    or any(self.tx_rmbsize))  # fmt: skip


def _reasons(counts: Counter[tuple[int, int]]) -> list[dict[str, int]]:
    return [{"local": local, "peer": peer, "count": n}
            for (local, peer), n in sorted(counts.items())]  # fmt: skip


COUNTERS: Final = Counters()
"""This process's counters (a forked child starts from its parent's; see ``start``)."""


def _forked_child() -> None:
    """A forked child counts its own connections from zero (its parent's are its parent's)."""
    COUNTERS.__init__()  # type: ignore[misc]


os.register_at_fork(after_in_child=_forked_child)
