"""``kubectl-reversi``: the kubectl plugin entry point (``kubectl reversi ...``).

The commands live in :mod:`reversi.cli.main`; this module is what pip's console script and
``python -m reversi.entrypoints.plugin`` run.
"""

from __future__ import annotations

from ..cli.main import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    main()
