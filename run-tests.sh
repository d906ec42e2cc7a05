#!/usr/bin/env bash
# Runs the whole smcr test suite: lint (ruff), types (mypy), then every test,
# slow ones included.  Does the set-up first if install.sh has not run yet.
# Extra arguments go to pytest (e.g. `./run-tests.sh -m "not slow"`).
set -euo pipefail
cd "$(dirname "$0")"
SMCR_NO_DEMO=1 ./install.sh
.venv/bin/ruff check src tests bench setup.py
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
