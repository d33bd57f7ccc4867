"""Bad input never reaches a stack trace: valid objects of every kind, corrupted by hypothesis
(wrong types, missing and stray fields, extreme sizes and strings), sent to the real API server
with the operator's webhooks.

Invariants, for every object: no 5xx; a refusal says what to fix in words (a field, a rule),
never a Python error; the operator stays up and logs no traceback; every admitted
RollbackRequest reaches a final phase or carries a condition that says why not.

``make test`` sends at least 200 objects; ``make fuzz`` sends at least 2,000
(``REVERSI_FUZZ_EXAMPLES``). The counts (refused / admitted by kind) are printed at the end and
written to ``<cluster logs>/fuzz-counts.json``.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import sys
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client.rest import ApiException

from tests.helpers import wait_for

G, V = "reversi.dev", "v1alpha1"
pytestmark = pytest.mark.cluster
EXAMPLES = int(os.environ.get("REVERSI_FUZZ_EXAMPLES", "240"))
KINDS = ("toolmanifests", "runs", "runsteps", "rollbackrequests", "halts", "clusterhalts")
#: what a Python error looks like in a message: none may reach a client
PYTHON_ERROR = re.compile(r"Traceback|object has no attribute|unhashable type|KeyError|TypeError|IndexError|"
                          r"AttributeError|validation error for|object is not|NoneType|pydantic|\.py\"?, line")
#: what a refusal that says what to fix mentions: a field path or the rule it applies
SAYS_WHAT = re.compile(r"spec|metadata|Invalid value|Required value|Unsupported value|must|field|is invalid|"
                       r"not found|limit|kill switch|principal|step|name", re.IGNORECASE)

_names = itertools.count()


def _base(kind: str, ns: str, name: str, tool_cmd: list[str]) -> dict:
    """A valid object of ``kind`` (the operator would admit it)."""
    meta: dict[str, Any] = {"name": name} if kind == "clusterhalts" else {"name": name, "namespace": ns}
    kinds = {"toolmanifests": "ToolManifest", "runs": "Run", "runsteps": "RunStep",
             "rollbackrequests": "RollbackRequest",
             "halts": "Halt", "clusterhalts": "ClusterHalt"}
    specs: dict[str, dict] = {
        "toolmanifests": {"runners": [{"name": "tools", "image": "registry.example/t:1", "command": tool_cmd,
                                       "deadlineSeconds": 30}],
                          "tools": [{"name": "svc.read", "effect": "read"},
                                    {"name": "svc.write", "effect": "write", "idempotencyKey": "$args.id",
                                     "requires": ["svc.read"],
                                     "compensation": {"tool": "svc.undo", "kind": "inverse",
                                                      "args": {"id": "$result.id"}, "runner": "tools",
                                                      "residue": ["a log line"]},
                                     "verification": {"tool": "svc.get", "args": {"id": "$result.id"},
                                                      "expect": {"gone": True}, "retries": 2, "backoffMs": 10,
                                                      "runner": "tools"}}]},
        "runs": {"mode": "enforce", "scope": {"actor": "fuzz", "tenant": "t", "environment": "test"},
                 "manifestRef": {"name": "fuzz"}},
        "runsteps": {"runRef": {"name": "base-run"}, "index": 0, "tool": "svc.read", "args": {"id": "a"},
                     "outcome": "succeeded", "result": {"id": "a"}},
        "rollbackrequests": {"runRef": {"name": "base-run"}, "dryRun": False, "retries": 2,
                             "backoff": {"baseMs": 10, "maxMs": 20}, "parallelism": 2, "deadlineSeconds": 60,
                             "approveCompensations": False},
        "halts": {"reason": "fuzz", "by": "fuzz", "scope": {"tool": "nothing.matches.this", "actor": "nobody"}},
        "clusterhalts": {"reason": "fuzz", "by": "fuzz",
                         "scope": {"tool": "nothing.matches.this", "namespace": "no-such-namespace"}},
    }
    return {"apiVersion": f"{G}/{V}", "kind": kinds[kind], "metadata": meta, "spec": copy.deepcopy(specs[kind])}


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into ``node`` (dict keys and list positions), the root included."""
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, prefix + (i,))
    return out


ODD_VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1.5, -(10**20), 10**20, "", " ", "\x00", "é" * 3, "$args.", "$result",
                     "*", "\\", [], [None], {}, {"x": 1}, {"": ""}, [{"x": {"y": []}}]]),
    st.text(min_size=0, max_size=40),
    st.integers(),
    st.builds(lambda n: "x" * n, st.sampled_from([300, 5000, 70_000])),
    st.lists(st.integers(), max_size=40),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=4),
)


@st.composite
def corrupted(draw, kind: str) -> tuple[dict, str]:
    """A valid object of ``kind`` with one corruption: (object, what was done)."""
    obj = _base(kind, "NS", "NAME", ["CMD"])
    spec = obj["spec"]
    paths = _paths(spec)
    path = draw(st.sampled_from(paths))
    action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "stray", "root"]))
    if action == "root":
        obj["spec"] = draw(ODD_VALUES)
        return obj, f"spec = {obj['spec']!r:.60}"
    parent: Any = spec
    for key in path[:-1]:
        parent = parent[key]
    if not path:
        stray = draw(st.text(min_size=1, max_size=12))
        spec[stray] = draw(ODD_VALUES)
        return obj, f"spec.{stray} added"
    last = path[-1]
    if action == "delete":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
        return obj, f"spec.{'.'.join(map(str, path))} deleted"
    if action == "stray" and isinstance(parent, dict):
        stray = draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in parent))
        parent[stray] = draw(ODD_VALUES)
        return obj, f"spec.{'.'.join(map(str, path[:-1] + (stray,)))} added"
    parent[last] = draw(ODD_VALUES)
    return obj, f"spec.{'.'.join(map(str, path))} = {parent[last]!r:.60}"


class FuzzLog:
    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.admitted_requests: list[str] = []
        self.failures: list[str] = []


#: each admission replica's log size when the fuzz started (a traceback after it is a finding)
admission_sizes: dict = {}


@pytest.fixture(scope="module")
def fuzz_env(admin_api, cluster, operator, downstream, crds):
    """One namespace for the whole fuzz run, a valid manifest and Run to refer to."""
    from kubernetes import client

    from reversi.adapters.journal import step_body

    core = client.CoreV1Api(admin_api)
    custom = client.CustomObjectsApi(admin_api)
    ns = f"fuzz-{os.getpid()}"
    core.create_namespace({"metadata": {"name": ns, "labels": {"reversi.dev/test": "true"}}})
    tool_cmd = [sys.executable, "-c", "print('{}')"]
    custom.create_namespaced_custom_object(G, V, ns, "toolmanifests", _base("toolmanifests", ns, "fuzz", tool_cmd))
    run = _base("runs", ns, "base-run", tool_cmd)
    custom.create_namespaced_custom_object(G, V, ns, "runs", run)
    custom.create_namespaced_custom_object(G, V, ns, "runsteps", step_body(ns, "base-run", {
        "index": 0, "tool": "svc.read", "args": {"id": "a"}, "outcome": "succeeded", "result": {"id": "a"}}))
    log_size = operator.log.stat().st_size if operator.log.exists() else 0
    admission_sizes.update({r.log: r.log.stat().st_size if r.log.exists() else 0 for r in operator.admission.replicas})
    record = FuzzLog()
    yield ns, custom, tool_cmd, record, operator, log_size
    summary = {kind: {"admitted": record.counts[(kind, "admitted")], "refused": record.counts[(kind, "refused")]}
               for kind in KINDS}
    print("\nfuzz counts:", json.dumps(summary))
    (cluster.paths.logs / "fuzz-counts.json").write_text(json.dumps(summary, indent=1))
    core.delete_namespace(ns, propagation_policy="Background")


def _send(custom, ns: str, kind: str, obj: dict) -> tuple[str, str]:
    """Create ``obj``; returns ("admitted", "") or ("refused", message). A 5xx raises AssertionError."""
    try:
        if kind == "clusterhalts":
            custom.create_cluster_custom_object(G, V, kind, obj)
            custom.delete_cluster_custom_object(G, V, kind, obj["metadata"]["name"])  # never leave one in force
        else:
            custom.create_namespaced_custom_object(G, V, ns, kind, obj)
        return "admitted", ""
    except ApiException as err:
        try:
            message = json.loads(err.body).get("message", "")
        except (TypeError, ValueError):
            message = str(err.body)
        assert err.status < 500, f"{kind}: HTTP {err.status}: {message}"
        return "refused", message


def _prepare(custom, ns: str, kind: str, obj: dict, tool_cmd: list[str]) -> dict:
    """Fill in the namespace and names; a RunStep gets a fresh Run of its own (a valid step would
    be admitted: step 0 of an open run)."""
    name = f"fz-{next(_names)}"
    obj["metadata"] = {"name": name} if kind == "clusterhalts" else {"name": name, "namespace": ns}
    obj = json.loads(json.dumps(obj).replace('"NS"', json.dumps(ns)).replace('"CMD"', json.dumps(tool_cmd[0])))
    if kind == "runsteps" and isinstance(obj.get("spec"), dict):
        run = f"fr-{next(_names)}"
        custom.create_namespaced_custom_object(G, V, ns, "runs", _base("runs", ns, run, tool_cmd))
        if isinstance(obj["spec"].get("runRef"), dict) and obj["spec"]["runRef"].get("name") == "base-run":
            obj["spec"]["runRef"]["name"] = run
        index = obj["spec"].get("index")
        valid = isinstance(index, int) and not isinstance(index, bool) and 0 <= index < 10**5
        obj["metadata"]["name"] = f"{run}-{index:05d}" if valid else name
    return obj


@pytest.mark.parametrize("kind", KINDS)
def test_the_uncorrupted_objects_are_admitted(fuzz_env, kind):
    """The fuzz starts from valid objects: were they refused, every corruption would be refused
    for the wrong reason."""
    ns, custom, tool_cmd, record, _, _ = fuzz_env
    obj = _prepare(custom, ns, kind, _base(kind, "NS", "NAME", ["CMD"]), tool_cmd)
    verdict, message = _send(custom, ns, kind, obj)
    assert verdict == "admitted", f"{kind}: {message}"
    if kind == "rollbackrequests":
        record.admitted_requests.append(obj["metadata"]["name"])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False,
          database=None)
@given(data=st.data())
def test_malformed_objects_are_refused_with_a_clear_message_and_never_a_stack_trace(fuzz_env, data):
    ns, custom, tool_cmd, record, operator, _ = fuzz_env
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    obj, what = data.draw(corrupted(kind), label="corruption")
    obj = _prepare(custom, ns, kind, obj, tool_cmd)
    verdict, message = _send(custom, ns, kind, obj)
    record.counts[(kind, verdict)] += 1
    if verdict == "refused":
        assert message.strip(), f"{kind} ({what}): refused without a message"
        assert not PYTHON_ERROR.search(message), f"{kind} ({what}): a Python error reached the client: {message}"
        assert SAYS_WHAT.search(message), f"{kind} ({what}): the refusal does not say what to fix: {message}"
    elif kind == "rollbackrequests":
        record.admitted_requests.append(obj["metadata"]["name"])
    assert operator.alive(), f"the operator died on {kind} ({what}); see {operator.log}"
    assert operator.admission.alive(), f"an admission replica died on {kind} ({what}); see {operator.admission.log}"


def test_after_the_fuzz_the_operator_is_up_and_every_admitted_request_says_where_it_stands(fuzz_env):
    ns, custom, _, record, operator, log_size = fuzz_env
    assert operator.alive(), f"the operator died during the fuzz; see {operator.log}"
    text = operator.log.read_text(errors="replace")[log_size:]
    assert "Traceback" not in text, f"the operator logged a traceback during the fuzz: see {operator.log}"
    for replica in operator.admission.replicas:  # the webhooks answered every malformed object
        assert replica.alive(), f"an admission replica died during the fuzz; see {replica.log}"
        assert "Traceback" not in replica.log.read_text(errors="replace")[admission_sizes.get(replica.log, 0):], \
            f"an admission replica logged a traceback during the fuzz: see {replica.log}"
    for name in record.admitted_requests:
        def settled(name=name):
            obj = custom.get_namespaced_custom_object(G, V, ns, "rollbackrequests", name)
            status = obj.get("status") or {}
            final = status.get("phase") in ("Succeeded", "Incomplete", "Failed", "Planned")
            explained = any(c.get("reason") for c in status.get("conditions") or [])
            return (final or explained) or None

        wait_for(settled, timeout=60, what=f"admitted RollbackRequest {ns}/{name} to say where it stands")
    total = sum(record.counts.values())
    assert total >= min(EXAMPLES, 200), f"only {total} objects were sent"


@pytest.mark.parametrize("kind, spec, field", [
    ("rollbackrequests", {"runRef": {"name": "base-run"}, "approvals": [{"step": {"x": 1}}]}, "spec.approvals.0.step"),
    ("rollbackrequests", " ", "spec: must be an object"),
    ("runs", {"manifestRef": {"name": 1.5}}, "spec.manifestRef.name"),
    ("runsteps", {"runRef": {"name": "base-run"}, "index": {}, "tool": "svc.read", "outcome": "succeeded"},
     "spec.index"),
    ("rollbackrequests", {"runRef": {"name": "no%such/run"}}, "spec.runRef.name"),
])
def test_the_inputs_that_once_gave_a_stack_trace_are_refused_by_field(fuzz_env, kind, spec, field):
    """Each of these once came back as HTTP 500 with a Python exception as the message."""
    ns, custom, tool_cmd, _, _, _ = fuzz_env
    obj = _base(kind, ns, f"fx-{next(_names)}", tool_cmd)
    obj["spec"] = spec
    verdict, message = _send(custom, ns, kind, obj)
    assert verdict == "refused" and field in message, message
    assert not PYTHON_ERROR.search(message), message
