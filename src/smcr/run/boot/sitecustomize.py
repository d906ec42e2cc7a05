"""Started by ``site`` in every Python interpreter under ``smcr run`` (see smcr.run).

Installs smcr, then runs the ``sitecustomize`` this interpreter would have run
without us (the next one on ``sys.path``).  Never stops the program: if smcr
cannot be imported here (another Python version, a broken install), the
program runs without it, with a line on standard error.
"""

import os
import sys


def _smcr() -> None:
    if os.environ.get("SMCR_RUN") != "1":
        return
    try:
        from smcr.run import install  # noqa: PLC0415 - only when asked for

        install(boot=True)
    except Exception as exc:  # the program must start whatever happens
        print(f"smcr run: not active in this interpreter: {exc!r}", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        path = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(path):
            import importlib.util  # noqa: PLC0415 - milliseconds, and seldom needed

            spec = importlib.util.spec_from_file_location("_smcr_chained_sitecustomize", path)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_smcr()
_chain()
