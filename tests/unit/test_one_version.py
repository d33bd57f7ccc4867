"""One version, written once: pyproject.toml's ``version`` is the package's (``reversi.__version__``,
what ``kubectl reversi version`` and the MCP servers report), the chart's ``appVersion`` (its
default image tag), and the version the CHANGELOG says the package, the chart and the image are."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

import reversi

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_the_chart_and_the_changelog_name_one_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts/reversi/Chart.yaml").read_text())
    assert chart["appVersion"] == version, "bump charts/reversi/Chart.yaml appVersion with pyproject.toml's version"
    assert reversi.__version__ in (version, "0+unknown"), "reinstall the package (pip install -e .)"
    assert f"`{version}`" in (ROOT / "CHANGELOG.md").read_text()


def test_no_module_writes_a_version_of_its_own():
    pattern = re.compile(r"""version\s*=\s*["']\d+\.\d+\.\d+["']""")
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "operator/reversi").rglob("*.py")
             if pattern.search(p.read_text())]
    assert found == [], f"use reversi.__version__ instead: {found}"
