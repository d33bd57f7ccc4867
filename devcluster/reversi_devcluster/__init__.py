"""Reversi's local control plane for development (tests, demo, benchmarks); never part of the operator.

It uses the ``reversi`` package of the same checkout (its certificates and webhook table), which is
installed first: ``pip install -e .`` then ``pip install -e ./devcluster`` (``make install`` does both).
"""

import importlib.util

def _has_reversi() -> bool:
    """Whether this checkout's ``reversi`` is importable (another project of that name is not it)."""
    try:
        return importlib.util.find_spec("reversi.certs") is not None
    except ImportError:  # no reversi at all
        return False


if not _has_reversi():  # one line, not a traceback, for a half-done install
    raise SystemExit("reversi-devcluster needs the reversi package of this checkout: run pip install -e . "
                     "(or make install) in the checkout first")
