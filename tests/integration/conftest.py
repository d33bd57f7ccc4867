"""Fixtures for the operator's integration tests on the local control plane.

- ``crds``: the project's CRDs, applied once and Established;
- ``downstream``: the demo's payments/inventory/email server (real state, idempotency keys,
  fault injection) on loopback; compensator and reader Jobs reach it through ``DOWNSTREAM_URL``;
- ``operator``: ``reversi-operator`` as a real process (an :class:`OperatorProcess` that tests may
  kill and restart), logging to ``<cluster logs>/operator.log``;
- ``rv``: a small API for tests: manifests, runs, requests, waiting for phases.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from reversi.adapters import apicalls as calls
from reversi.adapters import closed_runs
from reversi.adapters.journal import list_objects, run_at_open, step_body
from reversi_devcluster.localop import OperatorProcess, apply_crds, remove_webhook_configurations
from reversi.models.runstep import step_name
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "demo" / "downstream" / "tool.py"
GROUP, VERSION = "reversi.dev", "v1alpha1"


@pytest.fixture(scope="session")
def crds(cluster, admin_api):
    """Apply ``crds/*.yaml`` and wait until every CRD is Established."""
    return apply_crds(admin_api)


class Downstream:
    """The demo's downstream server, for tests: state, faults, resets."""

    def __init__(self, url: str, proc: subprocess.Popen):
        self.url = url
        self.proc = proc

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def post(self, path: str, body: dict) -> Any:
        return self._call("POST", path, body)

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    def state(self) -> dict:
        return self.get("/_state")

    def fault(self, path_prefix: str, mode: str, times: int = 1, delay_s: float = 3) -> None:
        self.post("/_faults", {"path_prefix": path_prefix, "mode": mode, "times": times, "delay_s": delay_s})

    def calls(self, path_prefix: str, since: float = 0.0) -> list[dict]:
        """Successful POSTs under ``path_prefix`` since ``since`` that really had an effect (no replays)."""
        return [c for c in self.state().get("calls", [])
                if c["path"].startswith(path_prefix) and not c["replayed"] and c["at"] >= since]


@pytest.fixture(scope="session")
def downstream(tmp_path_factory):
    state = tmp_path_factory.mktemp("downstream") / "state.json"
    proc = subprocess.Popen([sys.executable, str(REPO / "demo" / "downstream" / "server.py"), "--port", "0",
                             "--state", str(state), "--quiet"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on "), line
    yield Downstream(line.split()[-1], proc)
    proc.terminate()
    proc.wait(timeout=10)


#: the integration tests' operator once this process started it (see :func:`integration_operator_paused`)
_STARTED: list[OperatorProcess] = []


@contextlib.contextmanager
def integration_operator_paused(admin_api: client.ApiClient) -> Iterator[None]:
    """Stop the integration tests' operator for the body, when this process runs it, with the
    webhook configurations it registered, and start it again afterwards (it registers them
    again). A chart release's operator must be the only one at work: two operators would work
    the same requests. Under pytest-xdist a worker may run integration tests before chart tests."""
    running = [op for op in _STARTED if op.alive()]
    for op in running:
        op.stop()
    if running:
        remove_webhook_configurations(admin_api)
    try:
        yield
    finally:
        for op in running:
            op.start()


def _recorded_calls_served(api: client.ApiClient) -> bool:
    """Whether the API server admits a recorded call by its policies yet: a dry run of one (of a
    run no rollback closed, a tool no halt names) is admitted. For up to 30 s after the CRDs and
    policies are installed together it is refused as "not served yet"
    (:func:`reversi.adapters.apicalls.not_yet_served`); any other refusal is raised."""
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, "default", "runsteps", closed_runs.probe_body("default", "served-probe", "0"),
            dry_run="All")
    except ApiException as err:
        if calls.not_yet_served(err):
            return False
        raise
    return True


@pytest.fixture(scope="session")
def operator(cluster, crds, admin_api):
    """The operator, running as a real process against the local control plane."""
    metrics_port = int(os.environ.get("REVERSI_TEST_METRICS_PORT", "18089"))
    webhook_port = int(os.environ.get("REVERSI_TEST_WEBHOOK_PORT", str(metrics_port + 1000)))
    # a request for a Run that does not exist waits this long (default 300 s) before it fails
    os.environ.setdefault("REVERSI_RUN_WAIT_SECONDS", "8")
    op = OperatorProcess(cluster.paths.admin_kubeconfig, cluster.paths.logs / "operator.log",
                         metrics_port=metrics_port, webhook_port=webhook_port,
                         admission_metrics_port=metrics_port + 1)  # and + 2: one per admission replica
    op.start()
    _STARTED.append(op)
    wait_for(lambda: _recorded_calls_served(admin_api), timeout=90, interval=0.5,
             what="the API server to serve the recorded call's policies (a new CRD param kind: within 30 s)")
    yield op
    op.stop()
    remove_webhook_configurations(admin_api)


def manifest_body(downstream_url: str, *, reader: bool = True, expect: dict | None = None,
                  capture_needs_approval: bool = True, extra_tools: list[dict] | None = None,
                  reader_command: list[str] | None = None, reader_deadline_seconds: int = 60,
                  charge_read_backoff_ms: int = 200) -> dict:
    """The test ToolManifest: payments (charge, capture), inventory (reserve), email, reads.

    Every compensator and reader runs ``demo/downstream/tool.py`` against ``downstream_url``.
    ``reader_command`` gives the charge's read-back a runner of its own (``odd-reader``, with
    ``reader_deadline_seconds``); ``charge_read_backoff_ms`` is that read-back's ``backoffMs``.
    """
    runner = {"name": "tools", "image": "registry.example/reversi-demo-tools:1",
              "command": [sys.executable, str(TOOL)],
              "env": [{"name": "DOWNSTREAM_URL", "value": downstream_url}], "deadlineSeconds": 60}
    runners = [runner]
    if reader_command:
        runners.append({**runner, "name": "odd-reader", "command": reader_command,
                        "deadlineSeconds": reader_deadline_seconds})
    verify_runner = ("odd-reader" if reader_command else "tools") if reader else None
    tools = [
        {"name": "payments.get_customer", "effect": "read"},
        {"name": "payments.create_charge", "effect": "write", "idempotencyKey": "$args.order_id",
         "compensation": {"tool": "payments.refund", "kind": "compensation",
                          "args": {"charge_id": "$result.id", "amount": "$args.amount"},
                          "residue": ["the charge stays visible on the customer's statement"], "runner": "tools"},
         "verification": {"tool": "payments.get_charge", "args": {"charge_id": "$result.id"},
                          "expect": expect or {"refunded": True}, "retries": 2, "backoffMs": charge_read_backoff_ms,
                          **({"runner": verify_runner} if verify_runner else {})}},
        {"name": "payments.capture", "effect": "write", "requires": ["payments.create_charge"],
         "compensation": {"tool": "payments.void_capture", "kind": "inverse", "args": {"capture_id": "$result.id"},
                          "requiresApproval": capture_needs_approval, "runner": "tools"},
         "verification": {"tool": "payments.get_capture", "args": {"capture_id": "$result.id"},
                          "expect": {"status": "voided"}, "retries": 2, "backoffMs": 200, "runner": "tools"}},
        {"name": "inventory.reserve", "effect": "write",
         "compensation": {"tool": "inventory.release", "kind": "inverse", "args": {"reservation_id": "$result.id"},
                          "runner": "tools"},
         "verification": {"tool": "inventory.get_reservation", "args": {"reservation_id": "$result.id"},
                          "expect": {"status": "released"}, "retries": 2, "backoffMs": 200, "runner": "tools"}},
        {"name": "email.send", "effect": "irreversible", "residue": ["the customer has read the email"]},
    ]
    tools += extra_tools or []
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ToolManifest", "metadata": {"name": "payments"},
            "spec": {"runners": runners, "tools": tools}}


#: how long RV.create repeats a write refused as not served yet (the API server's discovery: 30 s)
SERVED = calls.Policy(attempts=100, first_wait=0.1, max_wait=1.0, deadline=40.0)


class RV:
    """Test helpers for Reversi objects in one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str, downstream: Downstream):
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.ns = namespace
        self.downstream = downstream
        self.manifest: dict | None = None
        self.started = time.time()

    def create(self, plural: str, body: dict) -> dict:
        """Create ``body``; a write the API server refused as "not served yet" (the recorded
        call's policies resolving their param kinds again after a chart release's went: up to 30 s)
        is repeated, as the SDK repeats it."""
        created = calls.create(self.custom, plural, body, self.ns, policy=SERVED)
        assert created is not None
        return created

    def get(self, plural: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, plural, name)

    def patch(self, plural: str, name: str, body: Any) -> dict:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, plural, name, body)

    def apply_manifest(self, **kwargs: Any) -> dict:
        body = manifest_body(self.downstream.url, **kwargs)
        self.manifest = self.create("toolmanifests", body)
        return self.manifest

    def snapshot(self, tool: str) -> dict | None:
        assert self.manifest is not None, "apply_manifest first"
        return next((t for t in self.manifest["spec"]["tools"] if t["name"] == tool), None)

    def step(self, index: int, tool: str, args: dict, result: dict | None = None, outcome: str = "succeeded",
             depends_on: list[int] | None = None) -> dict:
        step: dict[str, Any] = {"index": index, "tool": tool, "args": args, "outcome": outcome}
        if result is not None:
            step["result"] = result
        if depends_on:
            step["dependsOn"] = depends_on
        snap = self.snapshot(tool)
        if snap is not None:
            step["snapshot"] = snap
        return step

    def run(self, name: str, steps: list[dict], resolutions: list[dict] | None = None, mode: str = "enforce",
            recorded: bool = True) -> dict:
        """Open the Run ``name`` and record ``steps`` as its RunSteps (in order), then settle
        ``resolutions`` (``{step, status, result?, note}``) on their steps. Returns the Run.

        Each step is recorded as the SDK records a call, on the path users take: a recorded call
        (``spec.runAtOpen``, the Run as read at open) that the API server's policies admit and
        stamp (docs/concepts.md#the-recorded-calls-contract-rule-by-rule), with its outcome. Only
        a step that carries a snapshot other than the manifest's entry (a record from an older
        manifest), or a Run opened with no manifest to pin, crosses the admission webhook; so does
        every step with ``recorded=False`` (a client that sends no ``runAtOpen``)."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Run", "metadata": {"name": name},
                "spec": {"mode": mode, "scope": {"actor": "test-agent"}, "manifestRef": {"name": "payments"}}}
        run = self.create("runs", body)
        at_open = run_at_open(run) if recorded else None
        for step in steps:
            spec = dict(step)
            current = self.snapshot(spec["tool"]) if self.manifest is not None else None
            if at_open is not None and self.manifest is not None and spec.get("snapshot") == current:
                spec.pop("snapshot", None)
                spec["runAtOpen"] = at_open
            self.create("runsteps", step_body(self.ns, name, spec))
        for res in resolutions or []:
            self.resolve(name, res["step"], **{k: v for k, v in res.items() if k != "step"})
        return run

    def inline_run(self, name: str, steps: list[dict], resolutions: list[dict] | None = None,
                   mode: str = "enforce") -> dict:
        """A Run with an inline journal, as Reversi 0.1 recorded it (the operator moves it into RunSteps)."""
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Run", "metadata": {"name": name},
                "spec": {"mode": mode, "scope": {"actor": "test-agent"}, "manifestRef": {"name": "payments"},
                         "steps": steps, "resolutions": resolutions or []}}
        return self.create("runs", body)

    def resolve(self, run: str, step: int, **resolution: Any) -> dict:
        """Settle step ``step`` of ``run``: its RunStep's ``spec.resolution``."""
        return self.patch("runsteps", step_name(run, step), {"spec": {"resolution": resolution}})

    def steps(self, run: str) -> list[dict]:
        """The RunSteps of ``run``, by index."""
        return list_objects(self.custom, self.ns, run)

    def undo(self, run: str) -> list[dict]:
        """The undo state of every step of ``run`` a rollback touched (each RunStep's ``status.undo``)."""
        return [s["status"]["undo"] for s in self.steps(run) if (s.get("status") or {}).get("undo")]

    def request(self, name: str, run: str, **spec: Any) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RollbackRequest", "metadata": {"name": name},
                "spec": {"runRef": {"name": run}, **spec}}
        return self.create("rollbackrequests", body)

    def wait_phase(self, name: str, *phases: str, timeout: float = 120) -> dict:
        def check():
            obj = self.get("rollbackrequests", name)
            return obj if (obj.get("status") or {}).get("phase") in phases else None

        try:
            return wait_for(check, timeout=timeout, what=f"RollbackRequest {name} to reach {phases}")
        except AssertionError:
            obj = self.get("rollbackrequests", name)
            status = json.dumps(obj.get("status"), indent=1)[:4000]
            raise AssertionError(f"RollbackRequest {name} is {status}") from None

    def step_status(self, request: dict, step: int) -> dict:
        return next(e for e in request["status"]["steps"] if e["step"] == step)

    def condition(self, entry: dict, ctype: str) -> dict:
        return next(c for c in entry["conditions"] if c["type"] == ctype)

    def secret_env(self, job, name: str) -> str:
        """The value the Job's container gets in variable ``name`` from a Secret (a calls Secret
        holds several steps' calls: the Job names its key)."""
        ref = next(e.value_from.secret_key_ref for e in job.spec.template.spec.containers[0].env if e.name == name)
        return base64.b64decode(self.core.read_namespaced_secret(ref.name, self.ns).data[ref.key]).decode()

    # downstream helpers: real calls, as the agent made them
    def charge(self, order_id: str, amount: int = 700) -> dict:
        return self.downstream.post("/payments/charges", {"order_id": order_id, "amount": amount, "customer": "cus_9"})

    def capture(self, charge_id: str) -> dict:
        return self.downstream.post("/payments/captures", {"charge_id": charge_id})

    def reserve(self, order_id: str, sku: str = "sku-mug") -> dict:
        return self.downstream.post("/inventory/reservations", {"sku": sku, "qty": 1, "order_id": order_id})


@pytest.fixture
def rv(admin_api, namespace, downstream, operator):
    """Helpers for one test's namespace, with the operator and downstream running (downstream
    reset to its seed state: no faults left over from another test)."""
    downstream.post("/_reset", {})
    if not operator.alive():  # say so once, rather than let every test fail on its webhooks
        pytest.fail(f"the test operator is not running (exit code {operator.proc.returncode}); read {operator.log}")
    return RV(admin_api, namespace, downstream)
