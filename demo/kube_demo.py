"""The Kubernetes demo (``make demo-kube``): an SRE agent's plain kubectl writes recorded at admission, a person's
edit since, and a rollback that restores, refuses and names what it cannot undo, checked against the cluster.

1. sets up on the real node: the local control plane with kubelet and containerd, the operator installed by its
   Helm chart with its image, and a namespace that enforces the restricted Pod Security Standard holding a
   Deployment ``web`` (the demo image, behind a Service ``web``), a ConfigMap ``settings`` and a bound
   PersistentVolumeClaim ``data``; the built-in kube family's ToolManifest, its runner's ServiceAccount and
   Role, and the recorder's read rights (docs/operations.md#the-recorders-rights);
2. the agent, a ServiceAccount ``sre-agent`` using plain kubectl (demo/kube_agent.sh: no Reversi code), opens
   a Run that records its own writes (``spec.record``), then scales ``web`` to 0, patches ``settings``,
   deletes the Service and deletes the claim; kubectl prints Reversi's warning for each recorded write;
3. a person edits ``settings`` since;
4. a RollbackRequest undoes the run: the Deployment and the Service are restored (its pods Ready again), the
   ConfigMap is refused with the person's change shown, the claim's data is named irreversible;
5. the demo reads the cluster itself and compares it with the report, object by object.

Exit status: 0 when the report and the cluster agree, 1 when they do not, 2 when the demo could not run (it
needs a real node: this machine must be able to run kubelet and containerd).

    python demo/kube_demo.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from reversi.adapters.journal import list_objects  # noqa: E402
from reversi.engine import kube  # noqa: E402
from reversi_devcluster import build, images  # noqa: E402
from reversi_devcluster.cluster import Cluster, ClusterError, ClusterSettings  # noqa: E402

from demo import on_real_node  # noqa: E402

G, V = "reversi.dev", "v1alpha1"
NS = "reversi-demo-kube"
RUN = "remediation-42"
AGENT = "sre-agent"
RUNNER = "kube-undo"
PERSON_MODE = "debug-by-alice"
#: the agent's own rights: what it changes, and opening its Run (nothing of Reversi's SDK)
AGENT_RULES = [
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "patch", "create"]},
    {"apiGroups": [""], "resources": ["services", "persistentvolumeclaims"], "verbs": ["get", "list", "delete"]},
    {"apiGroups": [G], "resources": ["runs"], "verbs": ["get", "create"]},
]
#: the runner restores what the agent changes (docs/operations.md#the-kube-runners-rights)
RUNNER_RULES = [
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "create", "update", "delete"]},
    {"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["get", "create", "update", "delete"]},
    {"apiGroups": [G], "resources": ["runs", "runsteps"], "verbs": ["get"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"], "verbs": ["create"]},
]
#: the recorder reads what it records (docs/operations.md#the-recorders-rights)
RECORDER_RULES = [
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["configmaps", "services", "persistentvolumeclaims"],
     "verbs": ["get", "list", "watch"]},
]


def title(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _grant(api: client.ApiClient, name: str, rules: list[dict], account: str, account_ns: str = NS) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(NS, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(NS, {
        "metadata": {"name": name}, "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_ns}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})


class KubeDemo:
    def __init__(self) -> None:
        self.cluster = Cluster(ClusterSettings(real_node=True))
        self.started_cluster = False
        self.work = Path(tempfile.mkdtemp(prefix="reversi-demo-kube-"))
        self.kubectl = str(build.binary("kubernetes", "kubectl"))

    # ------------------------------------------------------------------------------------------- setting up

    def up(self) -> None:
        if not self.cluster.is_running():
            self.cluster.up(log=lambda m: build.progress(m.strip()))
            self.started_cluster = True
        self.admin = config.new_client_from_config(config_file=str(self.cluster.paths.admin_kubeconfig))
        took = on_real_node.install_chart(self.admin, self.cluster.paths.admin_kubeconfig,
                                          {"operator": {"tickSeconds": 0.5}})
        build.progress(f"operator installed by its Helm chart in {on_real_node.SYSTEM_NS} in {took:.0f}s")
        on_real_node.recreate_namespace(self.admin, NS, on_real_node.RESTRICTED)
        on_real_node.deploy_service(self.admin, NS, "web", None, 8080)
        core = client.CoreV1Api(self.admin)
        core.create_namespaced_config_map(NS, {"metadata": {"name": "settings"}, "data": {"mode": "normal"}})
        self._claim()
        for account in (AGENT, RUNNER):
            core.create_namespaced_service_account(NS, {"metadata": {"name": account}})
        _grant(self.admin, AGENT, AGENT_RULES, AGENT)
        _grant(self.admin, RUNNER, RUNNER_RULES, RUNNER)
        _grant(self.admin, "reversi-recorder", RECORDER_RULES, f"{on_real_node.RELEASE}-admission",
               on_real_node.SYSTEM_NS)
        client.CustomObjectsApi(self.admin).create_namespaced_custom_object(G, V, NS, "toolmanifests", {
            "apiVersion": f"{G}/{V}", "kind": "ToolManifest", "metadata": {"name": "kube"},
            "spec": {"runners": [kube.runner_entry(images.OPERATOR_IMAGE, RUNNER)], "tools": kube.manifest_tools()}})
        self.agent_kubeconfig = self._kubeconfig(AGENT)
        self.before = self._live()
        build.progress(f"namespace {NS}: Deployment web (ready), Service web, ConfigMap settings, PVC data (bound); "
                       f"ToolManifest kube (runner {images.OPERATOR_IMAGE} as {RUNNER}); ServiceAccount {AGENT}")

    def _claim(self) -> None:
        """A PersistentVolumeClaim ``data`` bound to a hostPath volume made for it."""
        core = client.CoreV1Api(self.admin)
        volume = f"{NS}-data"
        try:
            core.delete_persistent_volume(volume)
        except ApiException:
            pass
        while True:
            try:
                core.read_persistent_volume(volume)
                time.sleep(0.2)
            except ApiException:
                break
        core.create_persistent_volume({
            "metadata": {"name": volume},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(self.work / "data")},
                     "claimRef": {"namespace": NS, "name": "data"}}})
        core.create_namespaced_persistent_volume_claim(NS, {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": volume,
                     "resources": {"requests": {"storage": "1Mi"}}}})
        self._until(lambda: core.read_namespaced_persistent_volume_claim("data", NS).status.phase == "Bound", 60,
                    "the claim data to be bound")

    def _kubeconfig(self, account: str) -> Path:
        token = client.CoreV1Api(self.admin).create_namespaced_service_account_token(
            account, NS, {"spec": {"expirationSeconds": 3600}}).status.token
        path = self.work / f"{account}.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": account,
            "clusters": [{"name": "local", "cluster": {"server": self.cluster.server,
                                                       "certificate-authority": str(self.cluster.ca.cert)}}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": account, "context": {"cluster": "local", "user": account, "namespace": NS}}]}))
        path.chmod(0o600)
        return path

    @staticmethod
    def _until(check: Any, seconds: float, what: str) -> Any:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            time.sleep(0.25)
        raise RuntimeError(f"waited {seconds:.0f}s for {what}")

    def _agent_kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([self.kubectl, "--kubeconfig", str(self.agent_kubeconfig), "-n", NS, *args],
                              input=stdin, text=True, capture_output=True, timeout=60)

    # ---------------------------------------------------------------------------------------------- the story

    def agent(self) -> None:
        title(f"The agent ({AGENT}, plain kubectl) opens Run {RUN}, which records its own writes")
        run = {"apiVersion": f"{G}/{V}", "kind": "Run", "metadata": {"name": RUN},
               "spec": {"manifestRef": {"name": "kube"}, "record": {"serviceAccount": AGENT}}}
        made = self._agent_kubectl("create", "-f", "-", stdin=json.dumps(run))
        if made.returncode != 0:
            raise RuntimeError(f"the agent could not open its Run: {made.stderr.strip()}")
        print(f"  {made.stdout.strip()}  (spec.record.serviceAccount: {AGENT})")

        def in_force() -> bool:  # a server-side dry run is answered with Reversi's warning once it records
            probe = self._agent_kubectl("create", "configmap", "probe", "--dry-run=server", "-o", "name")
            return "records your writes" in probe.stderr

        self._until(in_force, 30, "the API server to send the agent's writes to the recording webhook")
        print("  the API server now sends the agent's writes to Reversi's recording webhook (and no one else's)")
        title("The agent remediates: demo/kube_agent.sh")
        out = subprocess.run(["sh", str(REPO / "demo/kube_agent.sh")], text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=120,
                             env={**os.environ, "KUBECONFIG": str(self.agent_kubeconfig), "NS": NS,
                                  "PATH": f"{Path(self.kubectl).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
        print("\n".join("  " + line for line in out.stdout.splitlines()), flush=True)
        if out.returncode != 0:
            raise RuntimeError("the agent's kubectl failed (its output is above)")
        steps = self._until(lambda: (lambda s: s if len(s) == 4 and all(x["outcome"] != "intended" for x in s)
                                     else None)(self.steps()), 30, "the four recorded writes settled")
        print(f"  Run {RUN}'s steps, recorded at admission and settled from what the API server stored:")
        for step in steps:
            ref = step["args"]["ref"]
            print(f"    {step['index']}  {step['tool']:<26} {ref['kind'] + ' ' + ref['name']:<32} {step['outcome']}")

    def steps(self) -> list[dict]:
        return [o["spec"] for o in list_objects(client.CustomObjectsApi(self.admin), NS, RUN)]

    def person(self) -> None:
        title("A person edits the same ConfigMap since (kubectl edit, as themselves)")
        client.CoreV1Api(self.admin).patch_namespaced_config_map("settings", NS, {"data": {"mode": PERSON_MODE}})
        print(f"  settings.data.mode: maintenance -> {PERSON_MODE}")

    def rollback(self) -> dict:
        title(f"The platform engineer rolls Run {RUN} back (kubectl apply of a RollbackRequest)")
        custom = client.CustomObjectsApi(self.admin)
        custom.create_namespaced_custom_object(G, V, NS, "rollbackrequests", {
            "apiVersion": f"{G}/{V}", "kind": "RollbackRequest", "metadata": {"name": "undo-42"},
            "spec": {"runRef": {"name": RUN}}})
        req = self._until(lambda: (lambda r: r if (r.get("status") or {}).get("phase") in (
            "Succeeded", "Incomplete", "Failed") else None)(
            custom.get_namespaced_custom_object(G, V, NS, "rollbackrequests", "undo-42")), 300,
            f"RollbackRequest undo-42 to finish (see the operator's pod in {on_real_node.SYSTEM_NS})")
        out = subprocess.run([sys.executable, "-m", "reversi.entrypoints.plugin", "--kubeconfig",
                              str(self.cluster.paths.admin_kubeconfig), "-n", NS, "describe", "undo-42"], text=True,
                             capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO / "operator")}, timeout=60)
        title(f"The report: {req['status']['phase']}")
        print("\n".join("  " + line for line in (out.stdout + out.stderr).splitlines()))
        return req

    # ------------------------------------------------------------------------------------------ the truth

    def _live(self) -> dict[str, Any]:
        apps, core = client.AppsV1Api(self.admin), client.CoreV1Api(self.admin)

        def read(fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except ApiException as err:
                if err.status == 404:
                    return None
                raise

        web, svc = read(apps.read_namespaced_deployment, "web", NS), read(core.read_namespaced_service, "web", NS)
        settings = read(core.read_namespaced_config_map, "settings", NS)
        claim = read(core.read_namespaced_persistent_volume_claim, "data", NS)
        return {"replicas": web.spec.replicas if web else None,
                "ready": (web.status.ready_replicas or 0) if web else 0,
                "service": ([(p.port, p.target_port, p.protocol) for p in svc.spec.ports], svc.spec.selector)
                if svc else None,
                "mode": (settings.data or {}).get("mode") if settings else None,
                "claim": claim is not None and not claim.metadata.deletion_timestamp}

    def check_truth(self, req: dict) -> int:
        title("The cluster itself: does it agree with the report?")
        report = req["status"]["report"]
        compensated = set(report.get("compensated", []))
        conflict = {c["step"]: c["reason"] for c in report.get("conflict", [])}
        unrecoverable = {u["step"] for u in report.get("unrecoverable", [])}
        residue = {r["step"] for r in report.get("residue", [])}
        by_tool = {s["tool"]: s["index"] for s in self.steps()}
        want = self.before["replicas"]
        if by_tool.get(kube.SCALE) in compensated:  # restored: its pods come back Ready
            self._until(lambda: self._live()["ready"] >= want, 180, f"web's {want} pod(s) Ready again")
        live = self._live()
        rows = [
            ("scale web to 0", kube.SCALE, by_tool.get(kube.SCALE) in compensated,
             live["replicas"] == want and live["ready"] >= want,
             f"replicas {live['replicas']}, {live['ready']} Ready (before: {want})"),
            ("delete Service web", kube.DELETE, by_tool.get(kube.DELETE) in compensated,
             live["service"] == self.before["service"], f"ports and selector {live['service']}"),
            ("patch ConfigMap settings", kube.PATCH,
             by_tool.get(kube.PATCH) in conflict and PERSON_MODE in conflict.get(by_tool.get(kube.PATCH), ""),
             live["mode"] == PERSON_MODE, f"mode {live['mode']!r} (the person's, left alone)"),
            ("delete PVC data", kube.DELETE_VOLUME_CLAIM,
             by_tool.get(kube.DELETE_VOLUME_CLAIM) in unrecoverable | residue, not live["claim"],
             "no claim: its data is not restored"),
        ]
        disagreements = 0
        for what, tool, said, shown, detail in rows:
            verdict = "agrees" if said and shown else "DISAGREES"
            disagreements += verdict != "agrees"
            print(f"  step {by_tool.get(tool)}  {what:<26} report: {'as expected' if said else 'NOT as expected':<16} "
                  f"cluster: {detail:<48} {verdict}")
        if disagreements:
            print(f"\n{disagreements} disagreement(s) between the report and the cluster")
            return 1
        print("\nThe report and the cluster agree.")
        return 0

    def down(self) -> None:
        if self.started_cluster:
            self.cluster.down(quiet=True)
        elif hasattr(self, "admin"):
            on_real_node.uninstall_chart(self.cluster.paths.admin_kubeconfig, self.admin)


def main() -> int:
    started = time.monotonic()
    try:
        on_real_node.choose_node("real")
    except ClusterError as err:
        print(f"demo failed: {err}; make demo-kube needs a real node (kubelet and containerd)", file=sys.stderr)
        return 2
    demo = KubeDemo()
    try:
        title("Setting up: the real node, the operator by its chart, a namespace for the agent")
        demo.up()
        set_up = time.monotonic() - started
        demo.agent()
        demo.person()
        verdict = demo.check_truth(demo.rollback())
        print(f"\nOn the real node {demo.cluster.node_name} (kubelet, containerd), in "
              f"{on_real_node.clock(time.monotonic() - started)} (setting up: {on_real_node.clock(set_up)}).")
        return verdict
    except (ClusterError, build.BuildError, images.ImageError, RuntimeError, ApiException) as err:
        print(f"\ndemo failed: {err}", file=sys.stderr)
        return 2
    finally:
        demo.down()


if __name__ == "__main__":
    sys.exit(main())
