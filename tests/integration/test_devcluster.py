"""The local control plane is a real Kubernetes: Jobs, Secrets, logs, CEL and RBAC work."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from reversi_devcluster import build
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster


def _job(name: str, script: str, **pod_extra) -> dict:
    container = {"name": "main", "image": "busybox", "command": ["sh", "-c", script]}
    container.update(pod_extra.pop("container", {}))
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "containers": [container], **pod_extra}}},
    }


def _job_condition(batch, ns, name):
    job = batch.read_namespaced_job_status(name, ns)
    for cond in job.status.conditions or []:
        if cond.type in ("Complete", "Failed") and cond.status == "True":
            return cond.type
    return None


def _job_pod(core, ns, name):
    pods = core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
    return pods[0] if pods else None


def test_job_that_exits_zero_becomes_complete(admin_api, namespace):
    batch = client.BatchV1Api(admin_api)
    batch.create_namespaced_job(namespace, _job("ok", "echo hello; exit 0"))
    assert wait_for(lambda: _job_condition(batch, namespace, "ok"), what="job ok to finish") == "Complete"


def test_job_that_exits_three_fails_with_exit_code_in_pod_status(admin_api, namespace):
    batch, core = client.BatchV1Api(admin_api), client.CoreV1Api(admin_api)
    batch.create_namespaced_job(namespace, _job("bad", "exit 3"))
    assert wait_for(lambda: _job_condition(batch, namespace, "bad"), what="job bad to finish") == "Failed"
    pod = _job_pod(core, namespace, "bad")
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == 3
    assert term.reason == "Error"


def test_secret_env_and_mounted_secret_file_reach_the_process(admin_api, namespace):
    batch, core = client.BatchV1Api(admin_api), client.CoreV1Api(admin_api)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "creds"},
                                              "stringData": {"token": "s3cret-value"}})
    script = 'printf "%s|%s" "$TOKEN" "$(cat /etc/creds/token)" > /dev/termination-log'
    job = _job("secret", script,
               container={"env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}],
                          "volumeMounts": [{"name": "creds", "mountPath": "/etc/creds", "readOnly": True}]},
               volumes=[{"name": "creds", "secret": {"secretName": "creds"}}])
    batch.create_namespaced_job(namespace, job)
    assert wait_for(lambda: _job_condition(batch, namespace, "secret")) == "Complete"
    term = _job_pod(core, namespace, "secret").status.container_statuses[0].state.terminated
    assert term.message == "s3cret-value|s3cret-value"
    assert not os.path.exists("/etc/creds/token"), "the mount must stay private to the pod"


def test_env_expansion_fieldref_and_working_dir(admin_api, namespace):
    batch, core = client.BatchV1Api(admin_api), client.CoreV1Api(admin_api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "cfg"}, "data": {"COLOR": "blue"}})
    workdir = f"/tmp/reversi-wd-{uuid.uuid4().hex[:6]}"
    script = 'printf "%s|%s|%s|%s" "$GREETING" "$POD_NS" "$CFG_COLOR" "$(pwd)" > /dev/termination-log'
    job = _job("env", script, container={
        "workingDir": workdir,
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [{"name": "NAME", "value": "world"},
                {"name": "GREETING", "value": "hello $(NAME) $$(NAME)"},
                {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]})
    batch.create_namespaced_job(namespace, job)
    assert wait_for(lambda: _job_condition(batch, namespace, "env")) == "Complete"
    term = _job_pod(core, namespace, "env").status.container_statuses[0].state.terminated
    assert term.message == f"hello world $(NAME)|{namespace}|blue|{workdir}"


def test_termination_message_is_in_pod_status(admin_api, namespace):
    batch, core = client.BatchV1Api(admin_api), client.CoreV1Api(admin_api)
    batch.create_namespaced_job(namespace,
                                _job("msg", "echo 'refund refused: charge is disputed' > /dev/termination-log; exit 1"))
    assert wait_for(lambda: _job_condition(batch, namespace, "msg")) == "Failed"
    term = _job_pod(core, namespace, "msg").status.container_statuses[0].state.terminated
    assert term.message.strip() == "refund refused: charge is disputed"


def test_fallback_to_logs_on_error_uses_the_log_tail(admin_api, namespace):
    batch, core = client.BatchV1Api(admin_api), client.CoreV1Api(admin_api)
    job = _job("fallback", "echo first; echo 'last words'; exit 4",
               container={"terminationMessagePolicy": "FallbackToLogsOnError"})
    batch.create_namespaced_job(namespace, job)
    assert wait_for(lambda: _job_condition(batch, namespace, "fallback")) == "Failed"
    term = _job_pod(core, namespace, "fallback").status.container_statuses[0].state.terminated
    assert term.message.strip().endswith("last words")


def test_kubectl_logs_shows_the_process_stdout(admin_api, namespace, cluster):
    batch, core = client.BatchV1Api(admin_api), client.CoreV1Api(admin_api)
    batch.create_namespaced_job(namespace, _job("logs", "echo line-one; echo line-two"))
    wait_for(lambda: _job_condition(batch, namespace, "logs"))
    pod = _job_pod(core, namespace, "logs").metadata.name
    out = subprocess.run(
        [str(build.binary("kubernetes", "kubectl")), "--kubeconfig", str(cluster.paths.admin_kubeconfig),
         "-n", namespace, "logs", pod], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["line-one", "line-two"]


def test_deleting_the_pod_of_a_running_job_kills_the_process(admin_api, namespace):
    batch, core = client.BatchV1Api(admin_api), client.CoreV1Api(admin_api)
    pidfile = f"/tmp/reversi-kill-{uuid.uuid4().hex[:8]}.pid"
    # "$$" is kubelet's escape for "$", so the shell sees "echo $$".
    batch.create_namespaced_job(namespace, _job("sleeper", f"echo $$$$ > {pidfile}; exec sleep 300"))
    pid = int(wait_for(lambda: os.path.exists(pidfile) and open(pidfile).read().strip(), what="pid file"))
    os.kill(pid, 0)  # running
    pod = wait_for(lambda: _job_pod(core, namespace, "sleeper"))
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=1)

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead too
            return fh.read().split(")")[-1].split()[0] == "Z"

    assert wait_for(gone, timeout=30, what=f"process {pid} to be killed")
    os.unlink(pidfile)


CEL_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.reversi.dev"},
    "spec": {"group": "test.reversi.dev", "scope": "Namespaced",
             "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "properties": {"spec": {
                     "type": "object",
                     "x-kubernetes-validations": [{"rule": "self.min <= self.max",
                                                   "message": "min must not exceed max"}],
                     "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}}}}}}}]},
}


def test_crd_cel_rule_refuses_a_bad_object_with_its_message(admin_api, namespace):
    ext = client.ApiextensionsV1Api(admin_api)
    try:
        ext.create_custom_resource_definition(CEL_CRD)
    except ApiException as err:
        assert err.status == 409
    custom = client.CustomObjectsApi(admin_api)

    def established():
        crd = ext.read_custom_resource_definition("widgets.test.reversi.dev")
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for(established, what="CRD established")
    good = {"apiVersion": "test.reversi.dev/v1", "kind": "Widget", "metadata": {"name": "good"},
            "spec": {"min": 1, "max": 2}}
    wait_for(lambda: _try_create(custom, namespace, good), what="CRD served")
    bad = {**good, "metadata": {"name": "bad"}, "spec": {"min": 5, "max": 2}}
    with pytest.raises(ApiException) as err:
        custom.create_namespaced_custom_object("test.reversi.dev", "v1", namespace, "widgets", bad)
    assert err.value.status == 422
    assert "min must not exceed max" in err.value.body


def _try_create(custom, ns, obj):
    try:
        custom.create_namespaced_custom_object("test.reversi.dev", "v1", ns, "widgets", obj)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise


def test_a_user_without_permissions_is_refused_by_rbac(cluster, namespace):
    nobody = config.new_client_from_config(config_file=str(cluster.kubeconfig_for("nobody")))
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(nobody).list_namespaced_pod(namespace)
    assert err.value.status == 403
    assert 'User "nobody" cannot list resource "pods"' in json.loads(err.value.body)["message"]
