"""Planning benchmark: time to plan runs of 1,000 and 10,000 steps (a run may hold up to 100,000 steps).

    PYTHONPATH=operator python benchmarks/plan_bench.py [--repeat 7]

The runs use ten tools in a ``requires`` chain (t1 requires t0, t2 requires t1, ...), explicit
``dependsOn`` on the previous step for every third step, 2% uncertain and 1% irreversible steps
(so deferrals happen) and 5% read steps. Reported: the median of ``--repeat`` runs of
``build_plan`` (graph included), plus model validation, one scheduling pass and the report, and
the 10k/1k ratio of planning (near 10 means linear; the algorithm is O(n + edges), see
``reversi.engine.graph``, and the cyclic collector is paused while a plan is built, see
``reversi.engine.gcpause``; what is left above 10 is memory: a 10,000-step run and its plan,
about 20 MB of the plan alone, do not fit in the CPU's caches as a 1,000-step one does).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from reversi.engine import (  # noqa: E402
    build_graph,
    build_plan,
    build_report,
    initial_progress,
    ready_steps,
    snapshot_id,
)
from reversi.models import RunSpec  # noqa: E402

TOOLS = 10


def tool_entry(k: int, effect: str) -> dict:
    entry: dict = {"name": f"svc.t{k}", "effect": effect, "requires": [f"svc.t{k - 1}"] if k else []}
    if effect == "write":
        entry["compensation"] = {
            "tool": f"svc.undo_t{k}",
            "kind": "inverse",
            "args": {"id": "$result.id", "owner": "$args.owner", "fixed": True},
            "runner": "cli",
        }
        entry["verification"] = {"tool": f"svc.get_t{k}", "args": {"id": "$result.id"}, "expect": {"gone": True},
                                 "runner": "cli"}
    if effect == "irreversible":
        entry["residue"] = ["a message was sent"]
    return entry


def make_run(n: int, seed: int = 1) -> dict:
    """A run spec (wire dict) of ``n`` steps; each distinct manifest entry is stored once in
    ``spec.snapshots`` and named by ``step.snapshotId`` (the form long runs should use)."""
    rng = random.Random(seed)
    writes = [tool_entry(k, "write") for k in range(TOOLS)]
    shared: dict[str, dict] = {}
    steps = []
    for i in range(n):
        k = i % TOOLS
        roll = rng.random()
        snapshot = writes[k]
        outcome = "succeeded"
        if roll < 0.01:
            snapshot = tool_entry(k, "irreversible")
        elif roll < 0.06:
            snapshot = tool_entry(k, "read")
        elif roll < 0.08:
            outcome = "uncertain"
        step = {
            "index": i,
            "tool": snapshot["name"],
            "args": {"owner": f"o{i}", "n": i},
            "outcome": outcome,
            "dependsOn": [i - 1] if i and i % 3 == 0 else [],
        }
        sid = snapshot_id(snapshot)
        shared.setdefault(sid, dict(snapshot, id=sid))
        step["snapshotId"] = sid
        if outcome == "succeeded":
            step["result"] = {"id": f"r{i}"}
        steps.append(step)
    return {"mode": "enforce", "manifestRef": {"name": "bench"}, "steps": steps, "snapshots": list(shared.values())}


def median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    plan_times = {}
    for n in (1_000, 10_000):
        raw = make_run(n)
        validate = median_seconds(lambda raw=raw: RunSpec.model_validate(raw), max(3, args.repeat // 2))
        spec = RunSpec.model_validate(raw)
        plan_s = median_seconds(lambda spec=spec: build_plan(spec, None, run_id="bench-uid"), args.repeat)
        graph = build_graph(spec)
        plan = build_plan(spec, None, run_id="bench-uid", graph=graph)
        progress = initial_progress(plan)
        schedule_s = median_seconds(lambda plan=plan, graph=graph, progress=progress:
                                    ready_steps(plan, graph, progress, parallelism=8), args.repeat)
        report_s = median_seconds(lambda plan=plan: build_report(plan, {}), args.repeat)
        size_kib = len(json.dumps(raw, separators=(",", ":"))) / 1024
        kinds: dict[str, int] = {}
        for action in plan.actions:
            kinds[action.kind] = kinds.get(action.kind, 0) + 1
        plan_times[n] = plan_s
        print(
            f"{n:>6} steps: plan {plan_s * 1000:8.1f} ms (median of {args.repeat})  "
            f"validate {validate * 1000:7.1f} ms  schedule {schedule_s * 1000:6.1f} ms  "
            f"report {report_s * 1000:6.1f} ms  "
            f"spec {size_kib:6.0f} KiB  kinds {dict(sorted(kinds.items()))}"
        )
    ratio = plan_times[10_000] / plan_times[1_000]
    print(f"ratio 10k/1k: {ratio:.1f} (10 = linear)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
