"""Fixtures of the rxe interop suite: one guest per session, one fresh QP pair per test.

The session fixture builds the image if it is not cached, boots one guest (and g2 at
the same time when a test of the session needs it, paused until then), creates rxe0 in
it and starts its pyverbs server; whatever happens, it stops the guests and deletes
netns smcnet at the end (and before, if a crashed run
left them).  Timings go to ``$KVM_BASE/run/interop-timings.json`` and to the
terminal summary, so the cost of the suite is visible in every CI log.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop.guest import (
    FIGURES,
    NETNS,
    Guest,
    GuestPanicError,
    GuestPeer,
    HostPeer,
    cache_dir,
    ensure_image,
    netns_exists,
    recover_if_panicked,
)
from tests.interop.kernel_exchange import SECOND_GUEST_SETUP, check_setup, setup_kernel_smc

TIMINGS: dict[str, float] = {}
#: How long a session waits for another one on this machine to finish.
SESSION_LOCK_WAIT = 1500.0
SESSION_LOCK = Path("/run/lock" if Path("/run/lock").is_dir() else "/tmp") / "smcr-interop.lock"


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespace, tap, QEMU)"
    for tool in ("qemu-system-x86_64", "qemu-img", "debootstrap", "tcpdump", "nft"):
        if shutil.which(tool) is None:
            return f"needs {tool} (install.sh installs it)"
    return None


SECOND_GUEST_TESTS = ("test_kernel_to_kernel_figures",)
"""The tests that use g2 beside g1: when the session runs one, g2 boots with g1."""


@pytest.fixture(scope="package")
def rxe_guest(request: pytest.FixtureRequest) -> Iterator[Guest]:
    """The booted guest, for this package's tests only: it goes (and its lock with it) once
    they are done, not at the end of the run.  Why: an idle guest under TCG still takes
    about half a CPU, which the rest of a run (most of it) would share with it."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    # One session at a time per machine: netns smcnet is a machine-wide name, so a second
    # pytest run (another checkout or cache, a colleague) waits here instead of tearing ours
    # down.  Hence a lock in /run/lock, not in the cache directory.
    lock = open(SESSION_LOCK, "w")  # noqa: SIM115 (held for the whole session)
    t0 = time.monotonic()
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() - t0 > SESSION_LOCK_WAIT:
                lock.close()
                pytest.fail(f"another interop session held {SESSION_LOCK} too long")
            time.sleep(1.0)
    TIMINGS["lock_wait_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    try:
        second = any(item.originalname in SECOND_GUEST_TESTS for item in request.session.items
                     if isinstance(item, pytest.Function))  # fmt: skip
        yield from _session(base, t0, second)
    finally:
        lock.close()


def _session(base: Path, t0: float, second: bool) -> Iterator[Guest]:
    """g1 booted with its services; with ``second``, g2 booted at the same time and paused
    (``guest.second``) for the test that needs it, instead of a boot of its own there."""
    TIMINGS["image_build_s"] = ensure_image(base)
    guest = Guest(base)
    # a crashed earlier run may have left its guest and namespace: ours by the pidfile
    if netns_exists() or (base / "run" / "g1.pid").exists():
        guest.teardown()
    if netns_exists():
        pytest.fail(f"netns {NETNS} is in use by something else")
    try:
        if second:  # g2's set-up runs while g1's services start
            g2 = guest.second = Guest(base, index=2)
            guest.boot(g2)
            g2_setup = g2.run(SECOND_GUEST_SETUP, background=True)
        else:
            guest.boot()
        TIMINGS["boot_s"] = guest.boot_seconds
        guest.start_services()
        if guest.second is not None:
            try:
                check_setup(guest.second.wait(g2_setup, 120, SECOND_GUEST_SETUP))
                guest.second.pause()
            except Exception as exc:  # (its test boots g2 itself, and says what fails)
                guest.second.stop()
                guest.second = None
                warnings.warn(f"g2 not ready beside g1: {exc}", stacklevel=1)
        TIMINGS["setup_total_s"] = time.monotonic() - t0
        yield guest
    finally:
        guest.teardown()
        if guest.restarts:
            TIMINGS["guest_restarts"] = guest.restarts
        TIMINGS["session_s"] = time.monotonic() - t0
        run = base / "run"
        run.mkdir(parents=True, exist_ok=True)
        (run / "interop-timings.json").write_text(json.dumps(TIMINGS, indent=1))


@pytest.fixture(autouse=True)
def _guest_alive(request: pytest.FixtureRequest) -> None:
    """Before each test of the guest: boot it again if its kernel panicked in an earlier
    one (:func:`~tests.interop.guest.recover_if_panicked`), so one kernel bug fails one
    test, not every test after it."""
    if "rxe_guest" not in request.fixturenames:
        return
    guest: Guest = request.getfixturevalue("rxe_guest")
    if recover_if_panicked(guest):
        warnings.warn("the guest's kernel had panicked (guest booted again)", stacklevel=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A guest test that failed because a guest's kernel panicked runs once more (its
    guest booted again by :func:`_guest_alive` or its own fixture): Linux 6.12's rxe
    corrupts its memory now and then under TCG (seen: a double fault in the slab
    allocator under ``rxe_requester``, ``rxe_skb_tx_dtor`` from the neighbour timer), once
    in several CI runs, a bug of the guest's kernel that no test of smcr can settle.  Only
    a panic (a :class:`GuestPanicError` raised, or in the failure's chain: its cause or
    the exception it was raised while handling): any other failure fails at once, and a
    second panic fails the test; the rerun shows as ``R`` and in the summary, beside the
    panic's warning.  Not caught: a panic seen only as the other end's error (a guest
    whose server died while the host or the other guest waited as the client)."""
    for item in items:
        if item.get_closest_marker("interop") is not None:
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=[GuestPanicError]))


@pytest.fixture
def peers(rxe_guest: Guest) -> Iterator[tuple[HostPeer, GuestPeer]]:
    """smcr's QP on 10.99.0.1 and a fresh rxe QP in the guest, not yet connected; none of
    the guest kernel's links left to send into it (an earlier test's kernel SMC links,
    or a guest restarted if they stay: :meth:`Guest.wait_kernel_links_gone`)."""
    if not rxe_guest.wait_kernel_links_gone():
        links = rxe_guest.kernel_links()
        rxe_guest.restart()
        warnings.warn(f"the guest's kernel kept its links (guest restarted): {links}",
                      stacklevel=1)  # fmt: skip
    host = HostPeer()
    try:
        guest = GuestPeer(host)
        yield host, guest
    finally:
        host.close()
        subprocess.run(["ip", "netns", "exec", NETNS, "nft", "delete", "table", "inet",
                        "smcrloss"], check=False, capture_output=True, timeout=30)  # fmt: skip


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        text = ", ".join(f"{k} {v:.1f}" for k, v in TIMINGS.items())
        terminalreporter.write_line(f"rxe interop timings (s): {text}")
    if FIGURES:
        text = ", ".join(f"{k} {v}" for k, v in FIGURES.items())
        terminalreporter.write_line(f"smcr <-> kernel SMC-R figures (guest under TCG): {text}")


@pytest.fixture(scope="package")
def kernel_smc(rxe_guest: Guest) -> Guest:
    """The guest with kernel SMC set up (pnet entry and UEID; rxe0 exists already)."""
    setup_kernel_smc(rxe_guest)
    return rxe_guest
