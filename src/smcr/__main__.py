"""``python -m smcr``: the same as the ``smcr`` console script."""

from smcr.cli import main

raise SystemExit(main())
