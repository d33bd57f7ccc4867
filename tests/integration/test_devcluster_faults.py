"""Faults of the local control plane give clear errors and leave no process behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from reversi_devcluster import build
from reversi_devcluster.cluster import COMPONENTS, Cluster, ClusterError, ClusterSettings
from reversi_devcluster.localop import free_port

pytestmark = pytest.mark.cluster


def _second_cluster(tmp_path: Path, **extra) -> Cluster:
    """A cluster in its own folder on free ports, beside the session's cluster."""
    return Cluster(ClusterSettings(
        cluster_dir=tmp_path / "cluster", apiserver_port=free_port(), etcd_port=free_port(),
        etcd_peer_port=free_port(), kubelet_port=free_port(), start_timeout=60, **extra))


def _no_process_left(c: Cluster) -> None:
    for comp in COMPONENTS:
        assert not c.paths.pid(comp).exists(), f"{comp} pid file left behind"
    out = subprocess.run(["pgrep", "-f", str(c.paths.root)], capture_output=True, text=True)
    assert out.stdout.strip() == "", f"processes left behind: {out.stdout}"


def test_a_port_in_use_names_the_component_and_the_port(tmp_path, cluster):
    c = _second_cluster(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", c.settings.apiserver_port))
        sock.listen()
        with pytest.raises(ClusterError) as err:
            c.up(log=lambda *_: None)
    assert f"kube-apiserver: port {c.settings.apiserver_port} on 127.0.0.1 is in use" in str(err.value)
    _no_process_left(c)


def test_a_component_that_dies_at_start_is_named_with_its_log(tmp_path, cluster):
    c = _second_cluster(tmp_path, apiserver_extra_args=["--no-such-flag"])
    with pytest.raises(ClusterError) as err:
        c.up(log=lambda *_: None)
    message = str(err.value)
    assert message.startswith("kube-apiserver exited during start-up")
    assert str(c.paths.log("kube-apiserver")) in message
    assert "unknown flag: --no-such-flag" in message
    _no_process_left(c)


def test_a_component_that_dies_later_shows_in_status_and_down_cleans_up(tmp_path, cluster):
    c = _second_cluster(tmp_path)
    c.up(log=lambda *_: None)
    try:
        kcm = c.status()["kube-controller-manager"]["pid"]
        os.kill(kcm, 9)
        env = {**os.environ, "REVERSI_CLUSTER_DIR": str(c.paths.root),
               "REVERSI_APISERVER_PORT": str(c.settings.apiserver_port)}
        out = subprocess.run([sys.executable, "-m", "reversi_devcluster.cli", "status"],
                             capture_output=True, text=True, env=env, timeout=30)
        assert out.returncode == 1
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("kube-controller-manager"))
        assert "stopped" in line and str(c.paths.log("kube-controller-manager")) in line
    finally:
        c.down(quiet=True)
    _no_process_left(c)


def test_a_build_that_fails_names_the_component_and_its_log(tmp_path, monkeypatch):
    pins = tmp_path / "pins.toml"
    etcd = build.load_pins()["etcd"]["version"]
    pins.write_text(build.PINS_FILE.read_text().replace(f'version = "{etcd}"', 'version = "v3.6.999"'))
    monkeypatch.setenv("REVERSI_PINS", str(pins))
    monkeypatch.setenv("REVERSI_CACHE", str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "reversi_devcluster.cli", "build", "etcd"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "building etcd (resolve modules) failed" in out.stderr
    assert str(tmp_path / "cache" / "etcd-v3.6.999" / "build.log") in out.stderr


def test_volumes_work_when_the_cluster_folder_is_under_tmp(tmp_path, cluster):
    """A pod's emptyDir at /tmp must not hide its other volumes when they live under /tmp."""
    from kubernetes import client, config

    from tests.helpers import wait_for

    assert str(tmp_path).startswith("/tmp/")
    c = _second_cluster(tmp_path)
    c.up(log=lambda *_: None)
    try:
        api = config.new_client_from_config(config_file=str(c.paths.admin_kubeconfig))
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        wait_for(lambda: _exists(core.read_namespaced_service_account, "default", "default"), what="default SA")
        core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
        # the program itself lives under /tmp too (a checkout or virtualenv there): the emptyDir
        # at /tmp must not hide it
        script = tmp_path / "job.sh"
        script.write_text("cat /secret/k > /dev/termination-log; touch /tmp/ok\n")
        batch.create_namespaced_job("default",
                                    {"metadata": {"name": "tmpjob"}, "spec": {"backoffLimit": 0, "template": {
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "x", "command": ["sh", str(script)],
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "s", "mountPath": "/secret"}]}],
                "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "s", "secret": {"secretName": "s"}}]}}}})

        def done():
            job = batch.read_namespaced_job_status("tmpjob", "default")
            return next((x.type for x in job.status.conditions or []
                         if x.status == "True" and x.type in ("Complete", "Failed")), None)

        verdict = wait_for(done, what="the job to finish")
        pod = core.list_namespaced_pod("default", label_selector="job-name=tmpjob").items[0]
        assert verdict == "Complete", pod.status.container_statuses
        assert pod.status.container_statuses[0].state.terminated.message == "v"
    finally:
        c.down(quiet=True)


def _exists(read, *args):
    from kubernetes.client.rest import ApiException

    try:
        read(*args)
        return True
    except ApiException:
        return False


def test_restarted_components_keep_the_cluster_state_and_a_restarted_node_agent_never_reruns_a_pod(tmp_path, cluster):
    """Cluster.restart SIGKILLs components and starts them on the same state: etcd's objects
    survive; the node agent kills what its predecessor left running, marks that pod Failed
    (NodeAgentRestarted, its container ContainerStatusUnknown 137) so its Job fails instead of
    running it twice, still serves the log of a pod that finished before the restart, and reports
    the true exit of a container that ended while the API server was down."""
    from kubernetes import client, config

    from tests.helpers import wait_for

    c = _second_cluster(tmp_path)
    c.up(log=lambda *_: None)
    try:
        api = config.new_client_from_config(config_file=str(c.paths.admin_kubeconfig))
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        wait_for(lambda: _exists(core.read_namespaced_service_account, "default", "default"), what="default SA")
        core.create_namespaced_config_map("default", {"metadata": {"name": "kept"}, "data": {"k": "v"}})
        marks = tmp_path / "marks"

        def job(name: str, script: str) -> None:
            batch.create_namespaced_job("default", {"metadata": {"name": name}, "spec": {
                "backoffLimit": 0, "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x",
                                                                    "command": ["sh", "-c", script]}]}}}})

        def verdict(name: str):
            conds = batch.read_namespaced_job_status(name, "default").status.conditions or []
            return next((x.type for x in conds if x.status == "True" and x.type in ("Complete", "Failed")), None)

        def pod_of(name: str):
            pods = core.list_namespaced_pod("default", label_selector=f"job-name={name}").items
            return pods[0] if len(pods) == 1 else None

        job("done", "echo hello from before")
        assert wait_for(lambda: verdict("done"), what="the first Job") == "Complete"
        job("long", f"echo $$$$ >> {marks}; sleep 60")  # $$ is an escaped $ for kubelet
        wait_for(lambda: marks.exists() and marks.read_text().strip()
                 and (pod_of("long") and pod_of("long").status.phase == "Running"), what="the long pod running")
        pid = int(marks.read_text().split()[0])

        took = c.restart(["node-agent"], log=lambda *_: None)
        assert took < 30
        assert not _alive_pid(pid), "the pod's process outlived the restart"
        assert wait_for(lambda: verdict("long"), what="the long Job to end") == "Failed"
        pod = pod_of("long")
        assert pod.status.reason == "NodeAgentRestarted"
        term = pod.status.container_statuses[0].state.terminated
        assert (term.exit_code, term.reason) == (137, "ContainerStatusUnknown")
        assert marks.read_text().split() == [str(pid)], "the pod ran again"
        log = core.read_namespaced_pod_log(pod_of("done").metadata.name, "default", container="main")
        assert log.strip() == "hello from before"

        # a container that exits while the API server is down, its agent killed before the status
        # is written: the restarted agent reports the exit it recorded (as a runtime keeps an exited
        # container), so the Job completes instead of failing as lost, and nothing runs twice
        go = tmp_path / "go"
        job("quiet", f"while [ ! -e {go} ]; do sleep 0.1; done; echo quiet >> {marks}")
        wait_for(lambda: pod_of("quiet") and pod_of("quiet").status.phase == "Running", what="the quiet pod running")
        uid = pod_of("quiet").metadata.uid
        c._stop("kube-apiserver", kill=True)
        go.touch()
        wait_for(lambda: (c.paths.node / "pods" / uid / "main.exit.json").exists(), what="the quiet container's exit")
        c._stop("node-agent", kill=True)
        c.start_stopped(["kube-apiserver", "node-agent"], log=lambda *_: None)
        assert wait_for(lambda: verdict("quiet"), what="the quiet Job to end") == "Complete"
        term = pod_of("quiet").status.container_statuses[0].state.terminated
        assert (term.exit_code, term.reason) == (0, "Completed")
        assert marks.read_text().split().count("quiet") == 1, "the quiet pod ran again"

        c.restart(["etcd", "kube-apiserver"], log=lambda *_: None)
        assert core.read_namespaced_config_map("kept", "default").data == {"k": "v"}
        assert c.is_running()
        assert c.start_stopped(log=lambda *_: None) == []
    finally:
        c.down(quiet=True)
    _no_process_left(c)


def _alive_pid(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def test_up_of_a_running_cluster_restarts_a_node_agent_of_another_checkout(tmp_path, cluster, monkeypatch):
    """A cluster left running by another checkout (its node agent's PYTHONPATH) is reused, but its
    node agent is restarted, so containers run this checkout's code; one of this checkout is kept."""
    from reversi_devcluster import nodeagent

    c = _second_cluster(tmp_path)
    c.up(log=lambda *_: None)
    try:
        pid = c.paths.pid("node-agent").read_text().split()[0]
        c.up(log=lambda *_: None)
        assert c.paths.pid("node-agent").read_text().split()[0] == pid, "the same checkout's agent is kept"
        monkeypatch.setattr(nodeagent, "python_path", lambda: str(tmp_path / "another-checkout"))
        said = []
        c.up(log=said.append)
        assert c.paths.pid("node-agent").read_text().split()[0] != pid
        assert any("not this checkout: restarting it" in line for line in said), said
        c.up(log=lambda *_: None)  # now it runs "another-checkout": kept
    finally:
        c.down(quiet=True)
