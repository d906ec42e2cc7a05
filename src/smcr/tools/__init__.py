"""Tools behind the ``smcr`` command that are not part of the protocol stack."""
