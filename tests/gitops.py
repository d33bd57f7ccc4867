"""How GitOps tools judge Reversi's objects, with their own code: kstatus (sigs.k8s.io/cli-utils,
the pinned ``kstatus-check`` built into the cache) and the chart's Argo CD health checks (Lua, run
with lupa, as Argo CD runs them: the object in the global ``obj``, the chunk returns ``hs``).

Fixtures captured from the local control plane live in tests/unit/fixtures/phases/: one JSON
file per kind and phase, ``{"object": ..., "kstatus": ..., "argocd": ...}`` with the expected
verdicts. tests/integration/test_gitops_status.py writes them again when
``REVERSI_CAPTURE_FIXTURES=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ARGOCD_SNIPPET = REPO / "charts" / "reversi" / "files" / "argocd" / "argocd-health.yaml"
FIXTURES = REPO / "tests" / "unit" / "fixtures" / "phases"
HEALTH_KEY = "resource.customizations.health.reversi.dev_{kind}"


def kstatus_binary() -> Path:
    from reversi_devcluster.build import binary

    return binary("cli-utils", "kstatus-check")


def kstatus(objects: list[dict]) -> list[dict]:
    """kstatus verdicts (``{"kind", "namespace", "name", "status", "message"}``) of ``objects``,
    computed by sigs.k8s.io/cli-utils. Raises ``AssertionError`` when the checker is not built
    or fails."""
    path = kstatus_binary()
    assert os.access(path, os.X_OK), f"{path} is not built; run `reversi-devcluster build --all` (make test does)"
    proc = subprocess.run([str(path)], input=json.dumps({"items": objects}), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def health_checks() -> dict[str, str]:
    """The chart's Argo CD health checks: kind -> Lua source."""
    data = yaml.safe_load(ARGOCD_SNIPPET.read_text())["data"]
    prefix = HEALTH_KEY.format(kind="")
    return {key[len(prefix):]: lua for key, lua in data.items()}


def argocd_health(obj: dict, checks: dict[str, str] | None = None) -> dict:
    """``{"status", "message"}`` of ``obj`` by the chart's Argo CD health check for its kind."""
    import lupa

    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(json.loads(json.dumps(obj)), recursive=True)
    hs = lua.execute((checks or health_checks())[obj["kind"]])
    return {"status": hs["status"], "message": hs["message"]}
