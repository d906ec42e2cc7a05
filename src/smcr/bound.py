"""Standard-library functions that the compiled modules call on every message, bound once.

In a module compiled by mypyc, ``time.monotonic()`` looks ``monotonic`` up in the ``time``
module on every call (a generic attribute look-up: about 125 instructions, a dozen times
per round trip), and so is a builtin that mypyc has no primitive for (``memoryview``),
in ``builtins``.  A ``Final`` name of a compiled module is a C static instead, which the
other compiled modules read directly.  So the compiled modules call these names, not the
modules' attributes.  (A test that replaces ``time.monotonic`` does not reach them: none
does; patch the name here, before the modules that use it are imported, if one must.)
"""

from __future__ import annotations

import threading
import time
from typing import Final

monotonic: Final = time.monotonic
"""``time.monotonic``."""
get_ident: Final = threading.get_ident
"""``threading.get_ident``."""
memview: Final = memoryview
"""``memoryview`` (a builtin that mypyc has no primitive for)."""
