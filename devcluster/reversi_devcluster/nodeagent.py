"""A node agent that stands in for a kubelet on the local control plane.

It registers one Ready Node, binds every unscheduled pod to it (through the ``binding``
subresource: no scheduler runs), and runs each container of those pods **as a local process**:

- **The image is ignored.** ``command`` + ``args`` run on this machine with the agent's own
  ``PATH`` and ``PYTHONPATH``; a container without ``command`` cannot run and fails with
  reason ``CommandRequired``. ``securityContext`` (user, capabilities, read-only root) and
  resource limits are not enforced; probes are not run (a running container is ready).
- env from ``value``, ``secretKeyRef``, ``configMapKeyRef``, ``fieldRef``,
  ``resourceFieldRef`` and ``envFrom``, with kubelet's ``$(VAR)`` expansion (``$$`` escapes);
  ``KUBERNETES_SERVICE_HOST``/``PORT`` point at the API server on loopback.
- Secret, ConfigMap, emptyDir, downwardAPI and projected volumes (service-account tokens from
  the TokenRequest API) appear at their ``mountPath`` inside a private mount namespace per
  container (``unshare --mount``; needs root), see :mod:`reversi_devcluster.launcher`.
- ``terminationMessagePath`` is honoured (4096-byte cap; ``FallbackToLogsOnError`` uses the
  last 80 lines / 2048 bytes of the log), and ``workingDir``.
- Pod status (phase, conditions, per-container state with exit code, reason, times,
  restart count) is reported so the real Job controller drives Jobs to Complete or Failed.
  Pods share the host's network: their IP is the host's non-loopback address (EndpointSlices
  refuse loopback ones), so Services such as a webhook Service reach them.
  ``restartPolicy`` Always/OnFailure restart with exponential backoff; a pod's
  ``activeDeadlineSeconds`` is enforced.
- Deleting a pod kills its processes (SIGTERM, then SIGKILL after the grace period) and then
  finishes the deletion; stopping the agent kills every pod process it started.
- Container logs are served over HTTPS (client certificates from the cluster CA) at kubelet's
  ``/containerLogs/{namespace}/{pod}/{container}`` so ``kubectl logs`` works (``follow``,
  ``tailLines``, ``limitBytes``, ``previous``), also for containers an earlier agent process ran.
- A restarted agent (its state folder kept) kills the pod processes its predecessor left and
  reports the pods that may have started, never running one twice: a container whose exit its
  predecessor recorded (``<container>.exit.json``, written before the status is sent) as it
  ended, the others lost (``Failed``, reason ``NodeAgentRestarted``, containers
  ``ContainerStatusUnknown`` with exit code 137). Status writes are retried until the API server
  takes them.

Pods run concurrently, one thread per pod and one per container process.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import http.server
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("reversi.nodeagent")

TERMINATION_MESSAGE_CAP = 4096
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubelet's ``$(VAR)`` expansion: known names are replaced, ``$$`` becomes ``$``,
    unknown references stay as written."""

    def repl(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(repl, text)


def start_ticks(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``: no wall
    clock, so a clock step cannot move it); raises ``OSError`` if it is gone."""
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[19])


def started_at(pid: int) -> float:
    """When process ``pid`` started (epoch seconds), from /proc; raises ``OSError`` if it is gone."""
    with open("/proc/stat") as fh:
        boot = next(int(line.split()[1]) for line in fh if line.startswith("btime"))
    return boot + start_ticks(pid) / os.sysconf("SC_CLK_TCK")


def _ticks_or_zero(pid: int) -> int:
    """:func:`start_ticks` of ``pid``, or 0 when it is already gone."""
    try:
        return start_ticks(pid)
    except OSError:
        return 0


def _group_running(pgid: int) -> bool:
    """Whether a process of process group ``pgid`` exists and has not yet exited (a zombie has)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except OSError:
            continue
        if int(pgrp) == pgid and state not in ("Z", "X"):
            return True
    return False


def host_ip() -> str:
    """This machine's primary non-loopback IPv4 address (pods run on the host's network), or
    127.0.0.1 when it has none. EndpointSlices refuse loopback addresses, so Services (e.g. a
    webhook Service) need a routable pod IP. No packet is sent: a UDP connect picks the route."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("10.255.255.255", 1))
            address = sock.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    return address if not address.startswith("127.") else "127.0.0.1"



def python_path() -> str:
    """``PYTHONPATH`` for the node agent and the processes it runs as containers: the folders that
    hold the ``reversi`` package and this one (both run from the checkout)."""
    spec = importlib.util.find_spec("reversi")
    roots = [Path(spec.origin).resolve().parents[1]] if spec and spec.origin else []
    roots.append(Path(__file__).resolve().parents[1])
    return os.pathsep.join(dict.fromkeys(str(r) for r in roots))


class ConfigError(Exception):
    """A container's configuration cannot be built yet (missing Secret, ConfigMap, key)."""


class ContainerRun:
    """One container of a pod: its process, restarts and reported state."""

    def __init__(self, spec: dict, init: bool):
        self.spec = spec
        self.name = spec["name"]
        self.init = init
        self.proc: subprocess.Popen | None = None
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict = {}
        self.restart_count = 0
        self.started_at: str | None = None

    def status(self, pod_uid: str) -> dict:
        running = "running" in self.state
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "containerID": f"reversi://{pod_uid}/{self.name}",
            "ready": running and not self.init,
            "started": running,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }


class PodWorker(threading.Thread):
    """Runs one pod to completion (or until it is deleted)."""

    def __init__(self, agent: NodeAgent, pod: dict):
        super().__init__(daemon=True, name=f"pod-{pod['metadata']['namespace']}/{pod['metadata']['name']}")
        self.agent = agent
        self.pod = pod
        self.meta = pod["metadata"]
        self.uid = self.meta["uid"]
        self.dir = agent.state_dir / "pods" / self.uid
        self.stop = threading.Event()
        self.lock = threading.Lock()
        spec = pod["spec"]
        self.init_runs = [ContainerRun(c, True) for c in spec.get("initContainers") or []]
        self.runs = [ContainerRun(c, False) for c in spec.get("containers") or []]
        self.phase = "Pending"
        self.reason: str | None = None
        self.message: str | None = None
        self.start_time = now()
        self.conditions: dict[str, dict] = {}

    # ----- status -----------------------------------------------------------------------

    def _set_condition(self, ctype: str, ok: bool, reason: str | None = None) -> None:
        status = "True" if ok else "False"
        old = self.conditions.get(ctype)
        if old and old["status"] == status:
            return
        cond = {"type": ctype, "status": status, "lastTransitionTime": now(), "lastProbeTime": None}
        if reason:
            cond["reason"] = reason
        self.conditions[ctype] = cond

    def report(self) -> None:
        """Write the pod's status through the ``status`` subresource, as it is when written.

        Retried (every 0.5 s, doubling to 5 s) until the API server takes it, the pod is gone
        (404) or the agent stops: a status lost while the API server is down would leave the pod
        ``Running`` for good, and its Job to fail on its deadline although the container exited 0.
        Each try sends the status as it is then, so a retry never overwrites a newer one."""
        wait = 0.5
        while True:
            try:
                self.agent.core.patch_namespaced_pod_status(
                    self.meta["name"], self.meta["namespace"], {"status": self._status()}, _request_timeout=10
                )
                return
            except ApiException as err:
                if err.status == 404:
                    return
                problem = f"HTTP {err.status} {err.reason}"
            except Exception as err:  # noqa: BLE001 - the API server is unreachable: try again
                problem = f"{type(err).__name__}: {err}"
            log.warning("status of %s/%s not written (%s); retrying in %.1fs",
                        self.meta["namespace"], self.meta["name"], problem, wait)
            if self.agent.stopping.wait(wait):
                return
            wait = min(wait * 2, 5.0)

    def _status(self) -> dict:
        with self.lock:
            inits_done = all(
                "terminated" in r.state and r.state["terminated"]["exitCode"] == 0
                for r in self.init_runs
            )
            all_running = bool(self.runs) and all("running" in r.state for r in self.runs)
            self._set_condition("PodScheduled", True)
            self._set_condition("Initialized", inits_done, None if inits_done else "ContainersNotInitialized")
            self._set_condition("ContainersReady", all_running, None if all_running else "ContainersNotReady")
            self._set_condition("Ready", all_running, None if all_running else "ContainersNotReady")
            status = {
                "phase": self.phase,
                "hostIP": self.agent.pod_ip,
                "hostIPs": [{"ip": self.agent.pod_ip}],
                "podIP": self.agent.pod_ip,
                "podIPs": [{"ip": self.agent.pod_ip}],
                "startTime": self.start_time,
                "conditions": list(self.conditions.values()),
                "containerStatuses": [r.status(self.uid) for r in self.runs],
            }
            if self.init_runs:
                status["initContainerStatuses"] = [r.status(self.uid) for r in self.init_runs]
            if self.reason:
                status["reason"] = self.reason
            if self.message:
                status["message"] = self.message
        return status

    # ----- the pod's life ---------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception:  # a pod must never take the agent down
            log.exception("pod %s/%s failed in the node agent", self.meta["namespace"], self.meta["name"])
            self.phase, self.reason, self.message = "Failed", "NodeAgentError", "see node-agent log"
            self.report()
        finally:
            self.agent.worker_done(self)

    def _run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.report()
        deadline = self.pod["spec"].get("activeDeadlineSeconds")
        self.deadline_at = time.monotonic() + deadline if deadline else None
        while not self.stop.is_set():
            try:
                volumes = self._prepare_volumes()
                break
            except ConfigError as err:
                for r in self.init_runs + self.runs:
                    r.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}}
                self.report()
                if self.stop.wait(2):
                    return
        for r in self.init_runs:
            if not self._run_container(r, volumes, restart_policy="OnFailure"
                                       if self.pod["spec"].get("restartPolicy") != "Never" else "Never"):
                self.phase = "Failed"
                self.report()
                return
        if self.stop.is_set():
            return
        self.phase = "Running"
        threads = [threading.Thread(target=self._run_container, args=(r, volumes), daemon=True)
                   for r in self.runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.stop.is_set() and self.phase == "Running":
            return
        codes = [r.state.get("terminated", {}).get("exitCode", 1) for r in self.runs]
        if self.phase == "Running":
            self.phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"
        self.report()

    def _deadline_passed(self) -> bool:
        return self.deadline_at is not None and time.monotonic() > self.deadline_at

    def _run_container(self, r: ContainerRun, volumes: dict, restart_policy: str | None = None) -> bool:
        """Run ``r`` until it ends for good; return True when it finally exited 0."""
        policy = restart_policy or self.pod["spec"].get("restartPolicy", "Always")
        backoff = 1.0
        while not self.stop.is_set():
            try:
                argv, env, mounts = self._container_config(r, volumes)
            except ConfigError as err:
                r.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}}
                self.report()
                if self.stop.wait(2):
                    return False
                continue
            code = self._start_and_wait(r, argv, env, mounts)
            if self._deadline_passed():
                self.phase, self.reason = "Failed", "DeadlineExceeded"
                self.message = "Pod was active on the node longer than the specified deadline"
                self.stop.set()
                self.report()
                return False
            if self.stop.is_set():
                return code == 0
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                return code == 0
            # restart with backoff, like kubelet's CrashLoopBackOff (shorter steps)
            r.last_state, r.restart_count = r.state, r.restart_count + 1
            r.state = {"waiting": {"reason": "CrashLoopBackOff",
                                   "message": f"back-off {backoff:.0f}s restarting failed container"}}
            self.report()
            if self.stop.wait(backoff):
                return False
            backoff = min(backoff * 2, 60.0)
        return False

    def _log_path(self, r: ContainerRun, restart: int | None = None) -> Path:
        return self.dir / f"{r.name}-{r.restart_count if restart is None else restart}.log"

    def _start_and_wait(self, r: ContainerRun, argv: list[str], env: dict, mounts: list[dict]) -> int:
        tmsg = self.dir / f"{r.name}.termination-log"
        tmsg.write_text("")
        tpath = r.spec.get("terminationMessagePath") or "/dev/termination-log"
        spec = {"argv": argv, "env": env, "workingDir": r.spec.get("workingDir"),
                "mounts": mounts + [{"source": str(tmsg), "target": tpath, "readOnly": False}],
                "expose": self._needed_host_paths(argv, env, mounts)}
        spec_file = self.dir / f"{r.name}.spec.json"
        spec_file.write_text(json.dumps(spec))
        logf = self._log_path(r).open("ab")
        cmd = ["unshare", "--mount", "--propagation", "private", "--",
               sys.executable, "-m", "reversi_devcluster.launcher", str(spec_file)]
        launcher_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                        "PYTHONPATH": self.agent.package_root}
        with self.lock:
            if self.stop.is_set():
                return 137
            r.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                      env=launcher_env)
            # the pid and its start in ticks since boot: together they name this process alone
            (self.dir / f"{r.name}.pid").write_text(f"{r.proc.pid} {_ticks_or_zero(r.proc.pid)}")
            r.started_at = now()
            r.state = {"running": {"startedAt": r.started_at}}
        self.report()
        while True:
            try:
                code = r.proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if self._deadline_passed():
                    self.kill(grace=float(self.pod["spec"].get("terminationGracePeriodSeconds") or 1))
        logf.close()
        (self.dir / f"{r.name}.pid").unlink(missing_ok=True)
        if code < 0:  # killed by a signal: report like a container runtime (128 + signal)
            code = 128 - code
        message = tmsg.read_bytes()[:TERMINATION_MESSAGE_CAP].decode(errors="replace")
        if not message and code != 0 and r.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = self._log_path(r).read_bytes().splitlines()[-FALLBACK_LINES:]
            message = b"\n".join(lines)[-FALLBACK_BYTES:].decode(errors="replace")
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                      "startedAt": r.started_at, "finishedAt": now(),
                      "containerID": f"reversi://{self.uid}/{r.name}"}
        if code == 137 and self.stop.is_set():
            terminated["reason"] = "Killed" if not self._deadline_passed() else "DeadlineExceeded"
        if message:
            terminated["message"] = message
        r.state = {"terminated": terminated}
        # kept on disk before it is reported, as a container runtime keeps an exited container: an
        # agent restarted before the API server took the status still reports the true exit code
        (self.dir / f"{r.name}.exit.json").write_text(json.dumps(terminated))
        self.report()
        return code

    def _needed_host_paths(self, argv: list[str], env: dict, mounts: list[dict]) -> list[str]:
        """Host folders the process needs that a volume mount would hide: for each needed path
        (program, absolute-path arguments, PYTHONPATH) under a mount target, the folder right
        below that target (so a virtualenv or checkout stays whole)."""
        needed = [shutil.which(argv[0], path=env.get("PATH")) or argv[0] if argv else ""]
        needed += [a for a in argv[1:] if a.startswith("/")]
        needed += [p for p in env.get("PYTHONPATH", "").split(":") if p]
        out = []
        for target in (m["target"].rstrip("/") for m in mounts):
            for path in needed:
                if target and path.startswith(target + "/"):
                    first = path[len(target) + 1:].split("/", 1)[0]
                    out.append(f"{target}/{first}")
        return sorted(set(out))

    def kill(self, grace: float) -> None:
        """Stop every process of the pod: SIGTERM, then SIGKILL after ``grace`` seconds."""
        with self.lock:
            self.stop.set()
            procs = [r.proc for r in self.init_runs + self.runs if r.proc and r.proc.poll() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + (grace if sig == signal.SIGTERM else 5)
            while time.monotonic() < end and any(p.poll() is None for p in procs):
                time.sleep(0.05)

    # ----- configuration ----------------------------------------------------------------

    def _get_secret(self, name: str, optional: bool = False) -> dict[str, bytes] | None:
        try:
            s = self.agent.core.read_namespaced_secret(name, self.meta["namespace"], _request_timeout=10)
        except ApiException as err:
            if err.status == 404:
                if optional:
                    return None
                raise ConfigError(f'secret "{name}" not found') from err
            raise ConfigError(f'secret "{name}" not read: HTTP {err.status} {err.reason}') from err
        except Exception as err:
            raise ConfigError(f'secret "{name}" not read: {type(err).__name__}') from err
        return {k: base64.b64decode(v) for k, v in (s.data or {}).items()}

    def _get_configmap(self, name: str, optional: bool = False) -> dict[str, bytes] | None:
        try:
            cm = self.agent.core.read_namespaced_config_map(name, self.meta["namespace"], _request_timeout=10)
        except ApiException as err:
            if err.status == 404:
                if optional:
                    return None
                raise ConfigError(f'configmap "{name}" not found') from err
            raise ConfigError(f'configmap "{name}" not read: HTTP {err.status} {err.reason}') from err
        except Exception as err:
            raise ConfigError(f'configmap "{name}" not read: {type(err).__name__}') from err
        data = {k: v.encode() for k, v in (cm.data or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
        return data

    def _field(self, path: str) -> str:
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return (self.meta.get(m.group(1)) or {}).get(m.group(2), "")
        values = {
            "metadata.name": self.meta["name"],
            "metadata.namespace": self.meta["namespace"],
            "metadata.uid": self.uid,
            "spec.nodeName": self.agent.node_name,
            "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", ""),
            "status.hostIP": self.agent.pod_ip,
            "status.podIP": self.agent.pod_ip,
        }
        if path not in values:
            raise ConfigError(f"unsupported fieldRef {path!r}")
        return values[path]

    def _resource_field(self, container: dict, ref: dict) -> str:
        res = container.get("resources") or {}
        kind, _, name = ref["resource"].partition(".")
        value = (res.get(kind) or {}).get(name)
        if value is None:
            value = {"cpu": "2", "memory": str(24 * 1024**3), "ephemeral-storage": "0"}.get(name, "0")
        return str(value)

    def _write_items(self, target: Path, data: dict[str, bytes], items: list | None, mode: int | None) -> None:
        target.mkdir(parents=True, exist_ok=True)
        chosen = [(i["key"], i["path"], i.get("mode")) for i in items] if items else [(k, k, None) for k in data]
        for key, rel, item_mode in chosen:
            if key not in data:
                raise ConfigError(f"key {key!r} not found")
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[key])
            path.chmod(item_mode or mode or 0o644)

    def _prepare_volumes(self) -> dict[str, Path]:
        out = {}
        for vol in self.pod["spec"].get("volumes") or []:
            target = self.dir / "volumes" / vol["name"]
            if "emptyDir" in vol:
                target.mkdir(parents=True, exist_ok=True)
            elif "secret" in vol:
                src = vol["secret"]
                data = self._get_secret(src["secretName"], src.get("optional", False)) or {}
                self._write_items(target, data, src.get("items"), src.get("defaultMode"))
            elif "configMap" in vol:
                src = vol["configMap"]
                data = self._get_configmap(src["name"], src.get("optional", False)) or {}
                self._write_items(target, data, src.get("items"), src.get("defaultMode"))
            elif "downwardAPI" in vol:
                self._downward(target, vol["downwardAPI"].get("items") or [])
            elif "projected" in vol:
                self._projected(target, vol["projected"])
            else:
                raise ConfigError(f"volume {vol['name']!r}: only secret, configMap, emptyDir, "
                                  "downwardAPI and projected volumes are supported by the node agent")
            out[vol["name"]] = target
        return out

    def _downward(self, target: Path, items: list) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for item in items:
            if "fieldRef" in item:
                (target / item["path"]).write_text(self._field(item["fieldRef"]["fieldPath"]))

    def _projected(self, target: Path, proj: dict) -> None:
        target.mkdir(parents=True, exist_ok=True)
        mode = proj.get("defaultMode")
        for src in proj.get("sources") or []:
            if "serviceAccountToken" in src:
                tok = src["serviceAccountToken"]
                body = {"spec": {
                    "audiences": [tok["audience"]] if tok.get("audience") else None,
                    "expirationSeconds": tok.get("expirationSeconds", 3607),
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                       "name": self.meta["name"], "uid": self.uid},
                }}
                resp = self.agent.core.create_namespaced_service_account_token(
                    self.pod["spec"].get("serviceAccountName") or "default", self.meta["namespace"], body)
                (target / tok["path"]).write_text(resp.status.token)
            elif "configMap" in src:
                s = src["configMap"]
                data = self._get_configmap(s["name"], s.get("optional", False)) or {}
                self._write_items(target, data, s.get("items"), mode)
            elif "secret" in src:
                s = src["secret"]
                data = self._get_secret(s["name"], s.get("optional", False)) or {}
                self._write_items(target, data, s.get("items"), mode)
            elif "downwardAPI" in src:
                self._downward(target, src["downwardAPI"].get("items") or [])

    def _container_config(self, r: ContainerRun, volumes: dict[str, Path]) -> tuple[list, dict, list]:
        c = r.spec
        env: dict[str, str] = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": "/root" if os.geteuid() == 0 else os.environ.get("HOME", "/"),
            "HOSTNAME": self.meta["name"],
            "PYTHONPATH": self.agent.package_root,
            "KUBERNETES_SERVICE_HOST": self.agent.apiserver_host,
            "KUBERNETES_SERVICE_PORT": str(self.agent.apiserver_port),
        }
        for src in c.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "secretRef" in src:
                data = self._get_secret(src["secretRef"]["name"], src["secretRef"].get("optional", False))
            else:
                ref = src["configMapRef"]
                data = self._get_configmap(ref["name"], ref.get("optional", False))
            for k, v in (data or {}).items():
                env[prefix + k] = v.decode(errors="replace")
        for e in c.get("env") or []:
            if "valueFrom" not in e or e["valueFrom"] is None:
                env[e["name"]] = expand(e.get("value") or "", env)
                continue
            value = self._env_from(c, e["valueFrom"])
            if value is not None:
                env[e["name"]] = value
        command = c.get("command") or []
        if not command:
            raise ConfigError("the node agent ignores images, so a container needs `command` (CommandRequired)")
        argv = [expand(a, env) for a in command + (c.get("args") or [])]
        mounts = []
        for vm in c.get("volumeMounts") or []:
            if vm["name"] not in volumes:
                raise ConfigError(f"volumeMount {vm['name']!r} names no volume of the pod")
            src = volumes[vm["name"]]
            if vm.get("subPath"):
                src = src / vm["subPath"]
            mounts.append({"source": str(src), "target": vm["mountPath"], "readOnly": bool(vm.get("readOnly"))})
        return argv, env, mounts

    def _env_from(self, c: dict, vf: dict) -> str | None:
        """One ``valueFrom`` of a container's env: a Secret's or ConfigMap's key, a field of the
        pod, a resource of the container; None for an optional key that is missing. Raises
        :class:`ConfigError` for a missing key that is not optional."""
        for source, kind, get in (("secretKeyRef", "Secret", self._get_secret),
                                  ("configMapKeyRef", "ConfigMap", self._get_configmap)):
            if vf.get(source):
                ref = vf[source]
                data = get(ref["name"], ref.get("optional", False))
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        return None
                    raise ConfigError(f"couldn't find key {ref['key']} in {kind} "
                                      f"{self.meta['namespace']}/{ref['name']}")
                return data[ref["key"]].decode(errors="replace")
        if vf.get("fieldRef"):
            return self._field(vf["fieldRef"]["fieldPath"])
        if vf.get("resourceFieldRef"):
            return self._resource_field(c, vf["resourceFieldRef"])
        return None


class LogHandler(http.server.BaseHTTPRequestHandler):
    """Serves ``/containerLogs/{ns}/{pod}/{container}`` and ``/healthz`` for the API server."""

    agent: NodeAgent

    def log_message(self, fmt, *args):  # quieter than the default stderr line per request
        log.debug("kubelet api: " + fmt, *args)

    def do_GET(self):  # http.server's naming
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        parts = [p for p in url.path.split("/") if p]
        if parts == ["healthz"]:
            return self._send(200, b"ok")
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._send(404, b"not found")
        _, ns, pod, container = parts
        found = self.agent.find_log(ns, pod, container, previous=query.get("previous", ["false"])[0] == "true")
        if found is None:
            return self._send(404, f"no logs for {ns}/{pod}/{container}".encode())
        path, _worker, run = found
        data = path.read_bytes()
        if "tailLines" in query:
            n = int(query["tailLines"][0])
            data = b"".join(data.splitlines(keepends=True)[-n:]) if n > 0 else b""
        limit = int(query["limitBytes"][0]) if "limitBytes" in query else None
        if limit is not None:
            data = data[:limit]
        follow = query.get("follow", ["false"])[0] == "true"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if not follow:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if follow:
            sent = path.stat().st_size if "tailLines" not in query else len(path.read_bytes())
            while True:
                alive = run is not None and run.proc is not None and run.proc.poll() is None
                size = path.stat().st_size
                if size > sent:
                    with path.open("rb") as fh:
                        fh.seek(sent)
                        chunk = fh.read(size - sent)
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    sent = size
                if not alive and size <= sent:
                    break
                time.sleep(0.2)

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class ThreadingHTTPSServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class NodeAgent:
    """Registers the node, binds pods to it, runs them, serves their logs."""

    def __init__(self, api: client.ApiClient, node_name: str, state_dir: Path, port: int,
                 apiserver_host: str, apiserver_port: int):
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.state_dir = state_dir
        self.port = port
        self.apiserver_host = apiserver_host
        self.apiserver_port = apiserver_port
        self.package_root = python_path()
        self.pod_ip = host_ip()
        #: this process's boot id (``status.nodeInfo.bootID``, as a kubelet's changes with each boot):
        #: whoever restarts the agent knows the new one is up once the node shows another id
        self.boot_id = f"reversi-{os.getpid()}-{time.time_ns()}"
        self.workers: dict[str, PodWorker] = {}
        self.finished: set[str] = set()
        self.finished_workers: dict[tuple[str, str], PodWorker] = {}
        self.deleting: set[str] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    # ----- node ---------------------------------------------------------------------------

    def register(self) -> None:
        """Create (or refresh) the Node object and mark it Ready."""
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node_name, "labels": {
                "kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "node.reversi.dev/agent": "true"}},
        }
        try:
            self.core.create_node(body)
        except ApiException as err:
            if err.status != 409:
                raise
        self.heartbeat()

    def heartbeat(self) -> None:
        t = now()
        cond = lambda typ, st, reason, msg: {  # noqa: E731
            "type": typ, "status": st, "reason": reason, "message": msg,
            "lastHeartbeatTime": t, "lastTransitionTime": t}
        status = {
            "conditions": [
                cond("Ready", "True", "KubeletReady", "reversi node agent is posting ready status"),
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": self.node_name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "capacity": {"cpu": "2", "memory": "24Gi", "pods": "500"},
            "allocatable": {"cpu": "2", "memory": "24Gi", "pods": "500"},
            "nodeInfo": {
                "machineID": "reversi", "systemUUID": "reversi", "bootID": self.boot_id,
                "kernelVersion": os.uname().release, "osImage": "reversi node agent",
                "containerRuntimeVersion": "reversi://local-process",
                "kubeletVersion": "v0.0.0-reversi", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
            },
        }
        self.core.patch_node_status(self.node_name, {"status": status})

    def _heartbeat_loop(self) -> None:
        while not self.stopping.wait(20):
            try:
                self.heartbeat()
            except Exception as err:  # noqa: BLE001
                log.warning("node heartbeat failed: %s", err)

    # ----- pods ---------------------------------------------------------------------------

    def bind(self, pod: dict) -> None:
        meta = pod["metadata"]
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=meta["name"], uid=meta["uid"]),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node_name),
        )
        try:
            # The generated client cannot parse this reply: skip decoding.
            self.core.create_namespaced_pod_binding(meta["name"], meta["namespace"], body,
                                                    _preload_content=False)
        except ApiException as err:
            if err.status not in (404, 409):
                log.warning("binding %s/%s: %s", meta["namespace"], meta["name"], err.reason)

    def handle(self, event_type: str, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        if event_type == "DELETED":
            worker = self.workers.get(uid)
            if worker:
                threading.Thread(target=worker.kill, args=(0.0,), daemon=True).start()
            return
        if not spec.get("nodeName"):
            scheduler = spec.get("schedulerName", "default-scheduler")
            if not meta.get("deletionTimestamp") and scheduler == "default-scheduler":
                self.bind(pod)
            return
        if spec["nodeName"] != self.node_name:
            return
        if meta.get("deletionTimestamp"):
            with self.lock:
                if uid in self.deleting:
                    return
                self.deleting.add(uid)
            threading.Thread(target=self._delete, args=(pod,), daemon=True).start()
            return
        with self.lock:
            if uid in self.workers or uid in self.finished:
                return
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                self.finished.add(uid)
                return
            if phase == "Running" or self.started_before(uid):
                # Started by an earlier agent process that is gone: never run it twice (a container
                # may start before its pod's status says Running).
                self.finished.add(uid)
                threading.Thread(target=self._orphaned, args=(pod,), daemon=True).start()
                return
            worker = PodWorker(self, pod)
            self.workers[uid] = worker
        worker.start()

    def started_before(self, uid: str) -> bool:
        """Whether an earlier agent process may have started a container of pod ``uid``: it
        writes the container's spec file just before starting it."""
        return any((self.state_dir / "pods" / uid).glob("*.spec.json"))

    def _orphaned(self, pod: dict) -> None:
        """Report a pod an earlier agent process ran, which is never run again. A container whose
        exit that process recorded (``<container>.exit.json``, written before its status was sent)
        is reported terminated as it ended, as kubelet reports an exited container its runtime
        kept; the others terminated with exit code 137 and reason ``ContainerStatusUnknown``, as
        kubelet reports containers it lost. Phase ``Succeeded`` when every container exited 0, else
        ``Failed`` (reason ``NodeAgentRestarted`` when one was lost). Retried until written (or
        the pod is gone)."""
        meta = pod["metadata"]
        at = now()
        lost = {"exitCode": 137, "reason": "ContainerStatusUnknown", "finishedAt": at,
                "message": "The container could not be located when the pod was terminated"}
        folder = self.state_dir / "pods" / meta["uid"]
        statuses, codes, lost_any = [], [], False
        for c in pod["spec"].get("containers") or []:
            try:
                terminated = json.loads((folder / f"{c['name']}.exit.json").read_text())
            except (OSError, ValueError):
                terminated, lost_any = dict(lost), True
            codes.append(terminated.get("exitCode", 137))
            statuses.append({"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                             "started": False, "restartCount": 0, "state": {"terminated": terminated},
                             "lastState": {}})
        status: dict = {"phase": "Succeeded" if codes and all(code == 0 for code in codes) else "Failed",
                        "containerStatuses": statuses}
        if lost_any:
            status.update(reason="NodeAgentRestarted",
                          message="the node agent restarted while this pod ran; it is not run again")
        body = {"status": status}
        wait = 0.5
        while not self.stopping.is_set():
            try:
                self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body, _request_timeout=10)
                return
            except ApiException as err:
                if err.status == 404:
                    return
            except Exception:  # noqa: BLE001 - the API server is unreachable: try again
                pass
            self.stopping.wait(wait)
            wait = min(wait * 2, 5.0)

    def _delete(self, pod: dict) -> None:
        meta = pod["metadata"]
        worker = self.workers.get(meta["uid"])
        if worker:
            grace = meta.get("deletionGracePeriodSeconds")
            worker.kill(float(grace if grace is not None else 30))
            worker.join(timeout=10)
        try:
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0,
                                            preconditions=client.V1Preconditions(uid=meta["uid"])))
        except ApiException as err:
            if err.status not in (404, 409):
                log.warning("finishing deletion of %s/%s: %s", meta["namespace"], meta["name"], err.reason)

    def worker_done(self, worker: PodWorker) -> None:
        with self.lock:
            self.workers.pop(worker.uid, None)
            self.finished.add(worker.uid)
            self.finished_workers[(worker.meta["namespace"], worker.meta["name"])] = worker

    def find_log(self, ns: str, name: str, container: str, previous: bool):
        candidates = [w for w in list(self.workers.values()) if w.meta["namespace"] == ns and w.meta["name"] == name]
        if not candidates and (ns, name) in self.finished_workers:
            candidates = [self.finished_workers[(ns, name)]]
        for w in candidates:
            for r in w.init_runs + w.runs:
                if r.name == container:
                    restart = r.restart_count - 1 if previous else r.restart_count
                    if restart < 0:
                        return None
                    path = w._log_path(r, restart)
                    return (path, w, r) if path.exists() else None
        if not candidates:
            return self._earlier_log(ns, name, container, previous)
        return None

    def _earlier_log(self, ns: str, name: str, container: str, previous: bool):
        """The log of a container an earlier agent process ran (it is on disk, in the pod's
        folder, until the pod is deleted, as kubelet keeps an exited container's log)."""
        try:
            uid = self.core.read_namespaced_pod(name, ns, _request_timeout=10).metadata.uid
        except Exception:  # noqa: BLE001 - no such pod, or the API is away: no log
            return None
        runs = []
        for path in (self.state_dir / "pods" / uid).glob(f"{container}-*.log"):
            number = path.name[len(container) + 1:-len(".log")]
            if number.isdigit():
                runs.append((int(number), path))
        runs.sort()
        if not runs or (previous and len(runs) < 2):
            return None
        return runs[-2 if previous else -1][1], None, None

    def watch_pods(self) -> None:
        """List and watch all pods forever, re-listing after errors or expired versions."""
        while not self.stopping.is_set():
            try:
                listing = self.core.list_pod_for_all_namespaces(_preload_content=False)
                data = json.loads(listing.data)
                for pod in data["items"]:
                    self.handle("ADDED", pod)
                rv = data["metadata"]["resourceVersion"]
                w = watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces, resource_version=rv,
                                   timeout_seconds=300, _preload_content=False,
                                   allow_watch_bookmarks=False):
                    obj = ev["raw_object"]
                    if ev["type"] == "ERROR":
                        break
                    self.handle(ev["type"], obj)
                    if self.stopping.is_set():
                        break
            except Exception as err:  # noqa: BLE001 - reconnect on anything
                if not self.stopping.is_set():
                    log.warning("pod watch: %s; re-listing", err)
                    time.sleep(1)

    def kill_stale(self) -> None:
        """Kill processes left by an earlier agent process (pid files in the state folder: ``<pid>
        <start ticks>``) — only the process the file names, the pid with that start in ticks since
        boot, so a pid the system has since given to another process is left alone whatever the
        wall clock did meanwhile (a file of an older agent holds the pid alone: the process is
        then taken as its own when it started before the file was written). Returns once each
        killed process group has ended (a SIGKILL lands when the process is next scheduled, later on a
        loaded machine), or after 10 s."""
        killed = []
        for pidfile in (self.state_dir / "pods").glob("*/*.pid"):
            try:
                pid, *ticks = (int(x) for x in pidfile.read_text().split())
                same = (start_ticks(pid) == ticks[0]) if ticks and ticks[0] else \
                    started_at(pid) <= pidfile.stat().st_mtime + 1.0
                if same:
                    os.killpg(pid, signal.SIGKILL)
                    killed.append(pid)
            except (ValueError, OSError):
                pass
            pidfile.unlink(missing_ok=True)
        end = time.monotonic() + 10
        while killed and time.monotonic() < end:
            killed = [pid for pid in killed if _group_running(pid)]
            time.sleep(0.05)

    def shutdown(self) -> None:
        self.stopping.set()
        workers = list(self.workers.values())
        threads = [threading.Thread(target=w.kill, args=(2.0,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def serve_logs(self, cert: str, key: str, client_ca: str) -> ThreadingHTTPSServer:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
        handler = type("Handler", (LogHandler,), {"agent": self})
        server = ThreadingHTTPSServer(("127.0.0.1", self.port), handler)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True, name="kubelet-api").start()
        return server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Reversi's stand-in kubelet for the local control plane.")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--node-name", default="reversi-node")
    p.add_argument("--state-dir", required=True, type=Path)
    p.add_argument("--port", type=int, default=20250)
    p.add_argument("--tls-cert", required=True)
    p.add_argument("--tls-key", required=True)
    p.add_argument("--client-ca", required=True)
    p.add_argument("--apiserver-host", default="127.0.0.1")
    p.add_argument("--apiserver-port", type=int, required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if shutil.which("unshare") is None:
        log.error("the node agent needs `unshare` (util-linux) for per-pod mount namespaces")
        return 1
    api = config.new_client_from_config(config_file=args.kubeconfig)
    agent = NodeAgent(api, args.node_name, args.state_dir, args.port,
                      args.apiserver_host, args.apiserver_port)
    (args.state_dir / "pods").mkdir(parents=True, exist_ok=True)
    agent.kill_stale()

    def on_term(signum, frame):
        agent.shutdown()
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    agent.serve_logs(args.tls_cert, args.tls_key, args.client_ca)
    agent.register()
    log.info("node %s registered; kubelet API on 127.0.0.1:%d", args.node_name, args.port)
    threading.Thread(target=agent._heartbeat_loop, daemon=True, name="heartbeat").start()
    agent.watch_pods()
    return 0


if __name__ == "__main__":
    sys.exit(main())
