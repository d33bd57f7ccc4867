"""``kubectl-reversi``: the kubectl plugin entry point (``kubectl reversi ...``), and
``kubectl_complete-reversi``, the program kubectl 1.26+ runs to complete ``kubectl reversi``.

The commands live in :mod:`reversi.cli.main`; this module is what pip's console scripts and
``python -m reversi.entrypoints.plugin`` run.
"""

from __future__ import annotations

import sys

from ..cli.completion import kubectl_complete
from ..cli.main import cli, main


def complete_main(argv: list[str] | None = None) -> None:
    """``kubectl_complete-reversi ARGS... WORD``: the candidates for WORD after ``kubectl reversi
    ARGS...``, one per line, then cobra's directive line (:func:`reversi.cli.completion.kubectl_complete`)."""
    print(kubectl_complete(cli, sys.argv[1:] if argv is None else argv))


__all__ = ["cli", "complete_main", "main"]

if __name__ == "__main__":
    main()
