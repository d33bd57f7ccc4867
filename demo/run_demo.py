"""Reversi's main job on real input, end to end (README command 1: ``make demo``).

1. starts what is missing: the local control plane (built from pinned sources on first use), the
   CRDs, the operator (with its admission webhooks) and a downstream system with real state
   (payments and inventory with idempotency keys, and an email outbox);
2. a checkout agent (demo/agent.py) makes eight real calls, each recorded through the SDK as a
   RunStep of Run order-4711 — a read, a charge, a reservation that depends on it, a capture whose
   undo needs approval, a call that times out, an irreversible email, another read and a shipping
   fee;
3. an on-call engineer (a different user, with the ``approve`` permission) settles the timed-out
   call with a resolution, looks at the plan (dry run), asks for the rollback and approves the
   capture's undo when the request waits for it; progress is shown live;
4. the report is printed, then the downstream system is read directly: everything the report
   calls compensated must really be undone, and what it calls unrecoverable must still be there.

Exit status: 0 when the report and the downstream truth agree, 1 when they do not, 2 when the demo
could not run (the message names the component and its log).

    python demo/run_demo.py           # the whole story; stops what it started
    python demo/run_demo.py --keep    # leaves the cluster, operator and downstream running to try it yourself
    python demo/run_demo.py --stop    # stops what --keep left running (and its webhook configurations)
    python demo/run_demo.py --node agent   # on the node agent even where a real node can run

Where the machine can run containers (root and cgroups with the memory controller; the node's
Debian packages are installed first where they are missing and apt-get can: see
reversi_devcluster.realnode.make_ready), everything runs on a real node: the operator is installed
by its Helm chart with its image, in a namespace that enforces the restricted Pod Security
Standard; the downstream system is a Deployment of the demo image behind a Service, which the
compensator and reader Jobs (containers of the demo image) reach by its name through the cluster
DNS. Elsewhere the demo says why in one line (and what to run) and runs on the node agent: the
operator and the downstream as local processes, the Jobs' commands as local processes too. Every
setup stage that takes more than a few seconds prints a progress line with the time since the
start; the demo ends with its time and the node it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path
from string import Template

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from reversi.rbac import RECORD  # noqa: E402
from reversi.adapters.journal import list_objects  # noqa: E402
from reversi_devcluster import build, images  # noqa: E402
from reversi_devcluster.cluster import Cluster, ClusterError, ClusterSettings  # noqa: E402
from reversi_devcluster.localop import (  # noqa: E402
    OperatorProcess,
    apply_crds,
    free_port,
    remove_webhook_configurations,
)
from reversi.models.runstep import LABEL_RUN, step_name  # noqa: E402

from demo import on_real_node  # noqa: E402

G, V = "reversi.dev", "v1alpha1"
NS = "reversi-demo"
RUN = "order-4711"
ROLES = {
    # the agent records its run and nothing more: the least rights of an agent, written once in
    # operator/reversi/rbac.py (the chart's <fullname>-record role is generated from the same
    # rules). It may not roll its run back: a failed run is the on-call engineer's to undo.
    "checkout-agent": [dict(rule) for rule in RECORD],
    # on call reads runs and their steps (plan, describe, export) and settles steps (patch a
    # RunStep's spec.resolution); rolling back and approving are rights on rollbackrequests
    "oncall": [
        {"apiGroups": [G], "resources": ["runs"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [G], "resources": ["runsteps"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [G], "resources": ["rollbackrequests"],
         "verbs": ["get", "list", "watch", "create", "patch", "approve"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
    ],
}


#: The walkthrough the demo prints at the end of ``--keep`` (README "Walkthrough", line for line;
#: tests/unit/test_walkthrough.py checks it): ``{downstream}`` is this run's downstream URL.
WALKTHROUGH = [
    ('eval "$(reversi-devcluster env)"', "KUBECONFIG and the pinned kubectl for the local control plane"),
    ("python demo/agent.py --namespace reversi-demo --run my-run --order o-4712 --downstream {downstream}",
     "a new run: eight calls"),
    ("kubectl get runsteps -l reversi.dev/run=my-run -n reversi-demo", "its steps: one RunStep per call"),
    ("kubectl reversi plan my-run -n reversi-demo", "what a rollback would do (exit 2: not fully reversible)"),
    ("kubectl reversi rollback my-run -n reversi-demo --name undo-my-run --wait",
     "undo it with live progress; exit 2 while an undo waits for approval"),
    ("kubectl reversi approve undo-my-run -n reversi-demo --all", 'approving needs the RBAC verb "approve"'),
    ("kubectl reversi describe run my-run -n reversi-demo", "the report: undone, unchecked, impossible, what next"),
    ("python demo/run_demo.py --stop && reversi-devcluster down",
     "when you are done (with the same REVERSI_* settings, if you set any)"),
]


def walkthrough(downstream: str) -> list[str]:
    """The walkthrough's lines, filled in: ``command   # comment``, comments aligned."""
    commands = [(cmd.format(downstream=downstream), note) for cmd, note in WALKTHROUGH]
    width = max(len(cmd) for cmd, _ in commands if len(cmd) <= 72)
    return [f"{cmd:<{width}}  # {note}" if len(cmd) <= width else f"{cmd}  # {note}" for cmd, note in commands]


def title(text: str) -> None:
    print(f"\n== {text}", flush=True)


class Demo:
    def __init__(self, keep: bool, real: bool = False):
        self.keep = keep
        self.real = real
        self.cluster = Cluster(ClusterSettings(real_node=real))
        self.started_cluster = False
        self.operator: OperatorProcess | None = None
        self.downstream: subprocess.Popen | None = None
        self.downstream_url = ""
        self.work = Path(tempfile.mkdtemp(prefix="reversi-demo-"))

    # ----- setting up ---------------------------------------------------------------------

    def setup(self) -> None:
        title("Setting up: local control plane, CRDs, operator, downstream system")
        if not self.cluster.is_running():
            self.cluster.up(log=build.progress)  # each stage with the time since the demo started
            self.started_cluster = True
        else:
            refuse_a_second_demo(self.cluster)
            print(f"  using the running control plane at {self.cluster.server}")
        self.admin = config.new_client_from_config(config_file=str(self.cluster.paths.admin_kubeconfig))
        if self.real:
            build.progress(f"installing the operator with its Helm chart (release {on_real_node.RELEASE})")
            took = on_real_node.install_chart(self.admin, self.cluster.paths.admin_kubeconfig)
            print(f"  operator installed by its Helm chart (release {on_real_node.RELEASE} in "
                  f"{on_real_node.SYSTEM_NS}, "
                  f"image {images.OPERATOR_IMAGE}, restricted Pod Security) in {took:.0f}s")
        else:
            apply_crds(self.admin)
            print("  CRDs installed")
            log = self.cluster.paths.logs / "demo-operator.log"
            metrics_port, webhook_port = free_port(), free_port()
            self.operator = OperatorProcess(self.cluster.paths.admin_kubeconfig, log, metrics_port=metrics_port,
                                            webhook_port=webhook_port)
            self.operator.start()
            print(f"  operator running (webhooks on :{webhook_port}, metrics on :{metrics_port}; log: {log})")
        on_real_node.recreate_namespace(self.admin, NS, on_real_node.RESTRICTED if self.real else {})
        if self.real:
            build.progress("deploying the downstream system (a Deployment of the demo image)")
            self.downstream_url = on_real_node.deploy_downstream(self.admin, NS)
        else:
            self.downstream = subprocess.Popen(
                [sys.executable, str(REPO / "demo/downstream/server.py"), "--port", "0", "--state",
                 str(self.work / "downstream.json"), "--quiet"], stdout=subprocess.PIPE, text=True)
            line = self.downstream.stdout.readline().strip()
            if not line.startswith("listening on "):
                raise RuntimeError(f"downstream server did not start: {line!r}")
            self.downstream_url = line.split()[-1]
        print(f"  downstream system (payments, inventory, email) at {self.downstream_url}"
              + (f"; compensators and readers reach it by name: {on_real_node.downstream_by_name(NS)}"
                 if self.real else ""))
        rbac = client.RbacAuthorizationV1Api(self.admin)
        self.users = {}
        for user, rules in ROLES.items():
            rbac.create_namespaced_role(NS, {"metadata": {"name": user}, "rules": rules})
            rbac.create_namespaced_role_binding(NS, {
                "metadata": {"name": user},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
            self.users[user] = self.cluster.kubeconfig_for(user)
        print(f"  namespace {NS}: users checkout-agent (records runs) and oncall (rolls back, approves)")
        # on a real node the compensators and readers reach the downstream by its Service's name (the
        # cluster DNS), as users write their runners; on the node agent they run here, by its address
        where = ({"IMAGE": images.DEMO_IMAGE, "PYTHON": on_real_node.TOOL_COMMAND[0],
                  "TOOL": on_real_node.TOOL_COMMAND[1], "DOWNSTREAM_URL": on_real_node.downstream_by_name(NS)}
                 if self.real
                 else {"IMAGE": "ghcr.io/reversi-dev/demo-tools:0.1.0", "PYTHON": sys.executable,
                       "TOOL": str(REPO / "demo/downstream/tool.py"), "DOWNSTREAM_URL": self.downstream_url})
        manifest = Template((REPO / "demo/manifest.yaml").read_text()).safe_substitute(**where)
        self.manifest_file = self.work / "manifest.yaml"
        self.manifest_file.write_text(manifest)
        body = yaml.safe_load(manifest)
        client.CustomObjectsApi(self.admin).create_namespaced_custom_object(G, V, NS, "toolmanifests", body)
        print("  ToolManifest shop-tools: how each tool is undone and checked")
        self.oncall = client.CustomObjectsApi(config.new_client_from_config(config_file=str(self.users["oncall"])))

    def shop(self, method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(self.downstream_url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    # ----- the story ------------------------------------------------------------------------

    def agent(self) -> None:
        title("The checkout agent makes its calls (each recorded as a RunStep of Run order-4711)")
        # The mug reservation (the first) answers at once; the poster reservation (the second)
        # answers after 3s, so the agent's 1s timeout fires while the reservation really happens.
        self.shop("POST", "/_faults", {"path_prefix": "/inventory/reservations", "mode": "timeout",
                                        "skip": 1, "times": 1, "delay_s": 3})
        out = subprocess.run([sys.executable, str(REPO / "demo/agent.py"), "--namespace", NS, "--run", RUN,
                              "--downstream", self.downstream_url, "--kubeconfig", str(self.users["checkout-agent"])],
                             env={**os.environ, "PYTHONPATH": str(REPO / "operator")}, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        print(out.stdout, end="", flush=True)
        if out.returncode != 0:
            raise RuntimeError("the agent failed (its output is above)")
        run = self.get("runs", RUN)
        steps = self.steps()
        print(f"  Run {RUN}: {len(steps)} steps (RunSteps {step_name(RUN, 0)} ...), principal "
              f"{run['spec']['principal']} (stamped by the API server from the agent's identity)")
        for s in steps:
            print(f"    {s['spec']['index']}  {s['spec']['tool']:<24} {s['spec']['outcome']}")
        print(f"  list them with: kubectl get runsteps -l {LABEL_RUN}={RUN} -n {NS}")

    def get(self, plural: str, name: str) -> dict:
        return client.CustomObjectsApi(self.admin).get_namespaced_custom_object(G, V, NS, plural, name)

    def steps(self) -> list[dict]:
        """The run's RunSteps, by index (one paged LIST by the run's label)."""
        return list_objects(client.CustomObjectsApi(self.admin), NS, RUN)

    def resolve(self) -> None:
        title("On call: settle the timed-out call (rule 7)")
        reservations = self.shop("GET", "/_state")["reservations"].values()
        poster = next(r for r in reservations if r["sku"] == "sku-poster")
        print(f"  the inventory system shows the poster reservation happened: {poster['id']} ({poster['status']})")
        self.plugin("resolve", RUN, "4", "--status", "succeeded", "--result", json.dumps({"id": poster["id"]}),
                    "--note", "found in the inventory admin: the reservation went through")
        res = self.get("runsteps", step_name(RUN, 4))["spec"]["resolution"]
        print(f"  step 4 resolved as {res['status']} by {res['actor']} (stamped by the API server on "
              f"RunStep {step_name(RUN, 4)})")

    def plan(self) -> None:
        title("The plan (computed from the run's RunSteps; a dry run changes nothing)")
        mine = json.loads(self.plugin("plan", RUN, "-o", "json", show=False))
        self.plugin("plan", RUN)
        self.request("order-4711-plan", dryRun=True)
        req = self.wait("order-4711-plan", {"Planned", "Failed"})
        plan = req["status"]["plan"]
        kinds = {a["step"]: a["kind"] for a in mine["actions"]}
        differ = [a["step"] for a in plan["actions"] if kinds.get(a["step"]) != a["kind"]]
        if differ or plan["fullyReversible"] != mine["fullyReversible"]:
            raise RuntimeError(f"kubectl reversi plan and the operator's dry run disagree on step(s) {differ}")
        print(f"  the operator's dry run (RollbackRequest order-4711-plan) plans the same; fully reversible: "
              f"{plan['fullyReversible']} (the email cannot be unsent)")

    def request(self, name: str, **spec) -> None:
        self.oncall.create_namespaced_custom_object(G, V, NS, "rollbackrequests", {
            "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": name},
            "spec": {"runRef": {"name": RUN}, **spec}})

    def wait(self, name: str, phases: set[str], timeout: float = 300, on_change=None,
             seen: dict[int, str] | None = None) -> dict:
        deadline = time.monotonic() + timeout
        seen = {} if seen is None else seen
        while time.monotonic() < deadline:
            req = self.get("rollbackrequests", name)
            status = req.get("status") or {}
            for entry in status.get("steps") or []:
                stage = entry.get("stage", "")
                if seen.get(entry["step"]) != stage:
                    seen[entry["step"]] = stage
                    if on_change:
                        on_change(req, entry)
            if status.get("phase") in phases:
                return req
            time.sleep(0.5)
        raise RuntimeError(f"RollbackRequest {name} did not reach {phases} in {timeout:.0f}s; "
                           f"see {self.operator.log if self.operator else 'the operator log'}")

    def rollback(self) -> dict:
        title("Roll back Run order-4711")
        self.request("order-4711-undo", parallelism=2)

        def show(req, entry):
            status = req["status"]
            print(f"  [{status.get('progress', '?'):>5}] step {entry['step']} {entry.get('tool', '')}: "
                  f"{entry.get('stage')}" + (f" (attempt {entry['attempts']})" if entry.get("attempts") else ""),
                  flush=True)

        seen: dict[int, str] = {}
        req = self.wait("order-4711-undo", {"AwaitingApproval", "Succeeded", "Incomplete", "Failed"}, on_change=show,
                        seen=seen)
        if req["status"]["phase"] == "AwaitingApproval":
            waiting = req["status"]["report"]["awaitingApproval"]
            print(f"  waiting for approval of steps {waiting}: on call approves (RBAC verb approve)")
            self.plugin("approve", "order-4711-undo", *[a for s in waiting for a in ("--step", str(s))])
            req = self.wait("order-4711-undo", {"Succeeded", "Incomplete", "Failed"}, on_change=show, seen=seen)
        return req

    def plugin(self, *args: str, show: bool = True) -> str:
        """Run ``kubectl reversi`` as the on-call engineer; print (unless not ``show``) and
        return its output."""
        out = subprocess.run([sys.executable, "-m", "reversi.entrypoints.plugin", "--kubeconfig",
                              str(self.users["oncall"]), "-n", NS, *args], text=True, capture_output=True,
                             env={**os.environ, "PYTHONPATH": str(REPO / "operator")}, timeout=60)
        shown = "$ kubectl reversi " + " ".join(a if " " not in a else repr(a) for a in args)
        if show:
            print(f"  {shown}")
            for line in (out.stdout + out.stderr).splitlines():
                print(f"    {line}")
        if out.returncode not in (0, 2):
            raise RuntimeError(f"kubectl reversi {args[0]} failed: {out.stderr.strip()}")
        return out.stdout

    def report(self, req: dict) -> None:
        title(f"The report: {req['status']['phase']}")
        self.plugin("describe", "order-4711-undo")
        return
        report = req["status"]["report"]
        for bucket in ("compensated", "unverified", "skipped", "unresolved", "unmanifested", "awaitingApproval"):
            if report.get(bucket):
                print(f"  {bucket:<17} {report[bucket]}")
        for f in report.get("failed", []):
            print(f"  failed            step {f['step']}: {f['error']}")
        for u in report.get("unrecoverable", []):
            print(f"  unrecoverable     step {u['step']}: {u['reason']}")
        for d in report.get("deferred", []):
            print(f"  deferred          step {d['step']} blocked by {d['blockedBy']}")
        for r in report.get("residue", []):
            print(f"  residue           step {r['step']} ({r['type']}): {r['text']}")
        print(f"  complete: {report['complete']}")

    def check_truth(self, req: dict) -> int:
        title("Downstream truth: is what the report calls undone really undone?")
        steps = {s["spec"]["index"]: s["spec"] for s in self.steps()}
        results = {i: (s.get("resolution") or {}).get("result") for i, s in steps.items()}
        report = req["status"]["report"]
        state = self.shop("GET", "/_state")
        disagreements = 0
        undone = set(report.get("compensated", [])) | set(report.get("unverified", []))
        for index, step in sorted(steps.items()):
            result = results.get(index) or step.get("result") or {}
            tool = step["tool"]
            if tool == "payments.create_charge":
                truth = "refunded" if state["charges"][result["id"]]["refunded"] else "still charged"
                really_undone = truth == "refunded"
            elif tool == "payments.capture":
                truth = state["captures"][result["id"]]["status"]
                really_undone = truth == "voided"
            elif tool == "inventory.reserve":
                truth = state["reservations"][result["id"]]["status"]
                really_undone = truth == "released"
            elif tool == "email.send":
                sent = any(m["id"] == result.get("id") for m in state["outbox"])
                truth = "in the customer's inbox" if sent else "not sent"
                really_undone = not sent
            else:
                continue
            claimed = index in undone
            verdict = "agrees" if claimed == really_undone else "DISAGREES"
            disagreements += verdict != "agrees"
            print(f"  step {index} {tool:<24} report: {'undone' if claimed else 'not undone':<11} "
                  f"downstream: {truth:<24} {verdict}")
        if disagreements:
            print(f"\n{disagreements} disagreement(s) between the report and the downstream systems")
            return 1
        print("\nThe report and the downstream systems agree.")
        return 0

    # ----- tearing down -----------------------------------------------------------------------

    def teardown(self) -> None:
        kept = self.operator is not None or (self.real and bool(self.downstream_url))
        if self.keep and kept:  # (refused before it started: nothing to keep)
            admission = self.operator.admission if self.operator else None
            state = {"operator": self.operator.proc.pid if self.operator and self.operator.proc else None,
                     # the admission servers run in sessions of their own: the operator's group is not theirs
                     **{f"admission-{i}": r.proc.pid for i, r in enumerate(admission.replicas if admission else [])
                        if r.proc},
                     "downstream": self.downstream.pid if self.downstream else None, "work": str(self.work),
                     "chart": self.real}
            STATE_FILE(self.cluster).write_text(json.dumps(state))
            print("\n== Try it yourself (everything is still running): the README walkthrough, filled in")
            for line in walkthrough(self.downstream_url):
                print(f"  {line}")
            moved = sorted(k for k in os.environ if k.startswith("REVERSI_"))
            if moved:
                print(f"  (this shell sets {', '.join(moved)}: keep them set for every line above)")
            print(f"  The demo's ToolManifest, filled in for this machine: {self.manifest_file}")
            return
        if self.operator:
            self.operator.stop()
            if not self.started_cluster:  # a cluster we leave running must accept writes again
                remove_webhook_configurations(self.admin)
        if self.real and not self.started_cluster and self.cluster.is_running():
            uninstall_chart(self.cluster)
        if self.downstream:
            self.downstream.terminate()
        if self.started_cluster:
            self.cluster.down(quiet=True)
        shutil.rmtree(self.work, ignore_errors=True)


def uninstall_chart(cluster: Cluster) -> None:
    admin = config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))
    on_real_node.uninstall_chart(cluster.paths.admin_kubeconfig, admin)


def STATE_FILE(cluster: Cluster) -> Path:
    return cluster.paths.root / "demo-processes.json"


class DemoRunning(RuntimeError):
    """A demo that ``--keep`` left running still runs on this cluster."""


def refuse_a_second_demo(cluster: Cluster) -> None:
    """Raise :class:`DemoRunning` when a ``--keep`` demo's operator still runs on ``cluster``: a
    second demo would recreate its namespace (deleting the runs tried there) and, at its end,
    remove the webhook configurations the kept operator serves, so halts would stop refusing
    calls. A state file whose operator is gone is stale and removed."""
    path = STATE_FILE(cluster)
    if not path.exists():
        return
    left = json.loads(path.read_text())
    if left.get("chart"):
        raise DemoRunning(f"a demo started with --keep is still installed on this cluster (release "
                          f"{on_real_node.RELEASE} in {on_real_node.SYSTEM_NS}); stop it first: "
                          "python demo/run_demo.py --stop")
    pid = left.get("operator")
    try:
        if pid:
            os.kill(pid, 0)
            raise DemoRunning(f"a demo started with --keep is still running on this cluster (operator pid {pid}); "
                              "stop it first: python demo/run_demo.py --stop")
    except ProcessLookupError:
        pass
    path.unlink(missing_ok=True)


def stop() -> int:
    """Stop the operator and downstream a ``--keep`` run left, and remove its webhook configurations
    (on a real node: uninstall the chart's release)."""
    cluster = Cluster()
    path = STATE_FILE(cluster)
    if not path.exists():
        print("nothing to stop: no demo left running (python demo/run_demo.py --keep starts one)")
        return 0
    import signal

    left = json.loads(path.read_text())
    work = left.pop("work", None)
    if left.pop("chart", False):
        cluster = Cluster(ClusterSettings(real_node=True))
        if cluster.is_running():
            uninstall_chart(cluster)
            print(f"uninstalled the demo's release {on_real_node.RELEASE} (namespace {on_real_node.SYSTEM_NS})")
    for name, pid in left.items():
        if not pid:
            continue
        try:
            if name == "operator" or name.startswith("admission-"):  # each leads a process group of its own
                os.killpg(pid, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGTERM)
            print(f"stopped the demo's {name} (pid {pid})")
        except ProcessLookupError:
            pass
    path.unlink()
    if work and Path(work).is_dir() and Path(work).name.startswith("reversi-demo-"):
        shutil.rmtree(work, ignore_errors=True)
        print(f"removed the demo's temp folder {work}")
    if cluster.is_running():
        remove_webhook_configurations(config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig)))
        print("removed the demo operator's webhook configurations")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", action="store_true", help="leave the cluster, operator and downstream running")
    p.add_argument("--stop", action="store_true", help="stop what --keep left running")
    p.add_argument("--node", choices=("auto", "real", "agent"), default=os.environ.get("REVERSI_DEMO_NODE", "auto"),
                   help="where pods run: a real node (containers of images built here), the node agent, or "
                        "auto (a real node where this machine can run one; default, or $REVERSI_DEMO_NODE)")
    args = p.parse_args()
    if args.stop:
        return stop()
    try:
        demo = Demo(args.keep, real=on_real_node.choose_node(args.node))
    except ClusterError as err:
        print(f"demo failed: {err}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        demo.setup()
        set_up = time.monotonic() - started
        demo.agent()
        demo.resolve()
        demo.plan()
        req = demo.rollback()
        demo.report(req)
        verdict = demo.check_truth(req)
        print(f"\nOn {'a real node (kubelet, containerd)' if demo.real else 'the node agent'}, in "
              f"{on_real_node.clock(time.monotonic() - started)} (setting up: {on_real_node.clock(set_up)}).")
        return verdict
    except (ClusterError, build.BuildError, images.ImageError, RuntimeError) as err:
        print(f"\ndemo failed: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - an API refusal or a bug: one line here, the traceback in a log
        log = Path(tempfile.gettempdir()) / "reversi-demo-failure.log"
        log.write_text(traceback.format_exc())
        print(f"\ndemo failed: {one_line(err)} (traceback in {log})", file=sys.stderr)
        return 2
    finally:
        demo.teardown()


def one_line(err: BaseException) -> str:
    """``err`` as one line: an API refusal as its status and the server's message, else its first line."""
    if isinstance(err, ApiException):
        try:
            message = json.loads(err.body or "{}").get("message") or err.reason
        except ValueError:
            message = err.reason
        return f"the API server answered {err.status}: {message}"
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


if __name__ == "__main__":
    sys.exit(main())
