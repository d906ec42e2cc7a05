"""A preforking WSGI server (gunicorn, 3 sync workers) and an ASGI server (uvicorn) under
``smcr run``, with a threaded ``http.client`` under ``smcr run`` too: every response's
body is the one expected, no request fails, and every connection the client opens is
SMC-R (``smcr stats``), with a connection kept alive and with one per request.

It runs ``bench/web_servers.py`` (briefly), the benchmark a user reruns for the figures:
so the benchmark is checked to work, and its checks are the test's.  The versions are
pinned in ``pyproject.toml`` (the ``test`` extra)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "web_servers.py"


@pytest.mark.slow
def test_gunicorn_and_uvicorn_serve_every_request_intact_over_smc_r() -> None:
    pytest.importorskip("gunicorn")  # (the test extra installs both; CI fails on a skip)
    pytest.importorskip("uvicorn")
    res = subprocess.run([sys.executable, str(BENCH), "--seconds", "1", "--reps", "1",
                          "--threads", "4", "--json"], capture_output=True, text=True,
                         timeout=600, check=False)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads(res.stdout.strip().splitlines()[-1])
    assert {(r["server"], r["mode"]) for r in results} == {
        (s, m) for s in ("gunicorn", "uvicorn") for m in ("keepalive", "new")}
    for r in results:
        assert r["problems"] == [], r
        smc = r["smcr"][0]
        assert smc["requests"] > 0 and smc["errors"] == smc["bad_bodies"] == 0, r
        assert r["smc_connections"] == smc["connections"] > 0 and r["smc_fallbacks"] == 0, r
        assert r["plain"][0]["requests"] > 0, r
