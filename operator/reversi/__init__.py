"""Reversi: a Kubernetes operator that undoes the side effects of automated runs and says
honestly what it could not undo.

``__version__`` is the installed package's version, written once in pyproject.toml (the chart's
``appVersion`` follows it: tests/unit/test_one_version.py)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("reversi")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
