"""The layout (README.md#layout): the engine (and the models) import neither Kubernetes nor kopf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODULES = [
    "reversi.conditions",
    "reversi.models",
    "reversi.crdgen",
    "reversi.engine",
    "reversi.engine.templates",
    "reversi.engine.graph",
    "reversi.engine.plan",
    "reversi.engine.keys",
    "reversi.engine.schedule",
    "reversi.engine.verify",
    "reversi.engine.backoff",
    "reversi.engine.report",
]


def test_engine_and_models_import_no_kubernetes_or_kopf():
    code = (
        "import importlib, json, sys\n"
        f"for name in {MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'kopf', 'aiohttp', 'urllib3'))\n"
        "print(json.dumps(bad))\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "operator") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_engine_imports_only_models_conditions_and_the_standard_library():
    """The engine's own modules, the models, the condition vocabulary (reversi.conditions: names
    and reasons of the API, standard library only) and the standard library."""
    engine = ROOT / "operator" / "reversi" / "engine"
    allowed = ("from ..models", "from .. import conditions", "from ..conditions")
    for path in engine.glob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")) and not stripped.startswith("from __future__"):
                if stripped.startswith("from ."):
                    assert not stripped.startswith("from ..") or stripped.startswith(allowed), \
                        f"{path.name}: {stripped}"
                else:
                    module = stripped.split()[1].split(".")[0]
                    assert module in sys.stdlib_module_names, f"{path.name}: {stripped}"
