#!/usr/bin/env bash
# Runs the whole smcr test suite: lint (ruff), types (mypy), the documentation (Sphinx,
# warnings as errors, and its doctests), then every test, slow ones included (the
# packaging tests among them: wheel and sdist built and installed in fresh venvs).
# Does the set-up first if install.sh has not run yet.
# Extra arguments go to pytest (e.g. `./run-tests.sh -m "not slow"`); the 30 slowest tests
# are listed at the end, to show where the run's time goes.
set -euo pipefail
cd "$(dirname "$0")"
SMCR_NO_DEMO=1 ./install.sh
.venv/bin/ruff check src tests bench docs setup.py
.venv/bin/mypy
.venv/bin/python -m sphinx -W -n -q -E -b html docs docs/_build/html
.venv/bin/python -m sphinx -W -n -q -b doctest docs docs/_build/doctest
exec .venv/bin/python -m pytest --durations=30 "$@"
