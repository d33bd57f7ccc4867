"""``kubectl reversi logs REQUEST [--step N] [--reader] [--tail N]``: the logs of the compensator
(or reader) Jobs of a RollbackRequest, read from their pods with the CoreV1 API.

The Jobs are found by their labels (docs/concepts.md#the-job-contract: ``reversi.dev/run-uid``,
``reversi.dev/role``, ``reversi.dev/step``, ``reversi.dev/attempt``, ``reversi.dev/read``,
``reversi.dev/request-uid``), their pods by the Job controller's ``job-name`` label, never by
guessing names; which Job a step shows is :func:`reversi.cli.views.jobs_by_step`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..adapters import apicalls as calls
from ..adapters.jobs import LABEL_ROLE, LABEL_RUN_UID, LABEL_STEP
from . import views
from .api import CliError, Connection
from .common import complete_names, conn, global_options, out, remark

REQUEST_PREFIXES = ("rollbackrequest/", "rollbackrequests/", "rbr/", "rollbackrequest.reversi.dev/",
                    "rollbackrequests.reversi.dev/")


def _metadata(obj: Any) -> dict[str, Any]:
    """A typed Job or pod's metadata as :func:`views.jobs_by_step` and :func:`views.pod_of_job` read it."""
    meta = obj.metadata
    return {"name": meta.name, "labels": meta.labels or {}, "annotations": meta.annotations or {},
            "created": meta.creation_timestamp.isoformat() if meta.creation_timestamp else ""}


def _list(c: Connection, method: Any, what: str, selector: str) -> list[dict[str, Any]]:
    try:
        found, _ = calls.list_all(method, c.namespace, label_selector=selector)
    except ApiException as err:
        raise c.api_error(err, f"listing the {what} of namespace {c.namespace}") from err
    return [_metadata(o) for o in found]


def read_log(c: Connection, pod: str, container: str, tail: int | None) -> tuple[str | None, str]:
    """The log of ``container`` of ``pod`` (its last ``tail`` lines), or ``None`` and why not
    (one line: not started yet, or gone with its pod or node). Other refusals raise :class:`CliError`."""
    kwargs: dict[str, Any] = {"container": container}
    if tail is not None:
        kwargs["tail_lines"] = tail
    try:
        return calls.call(c.core.read_namespaced_pod_log, pod, c.namespace, **kwargs), ""
    except ApiException as err:
        if err.status == 404:
            return None, f"the logs of pod {pod} are gone (its pod or its node was removed)"
        if err.status == 400:  # e.g. ContainerCreating: the kubelet has nothing to serve yet
            return None, f"pod {pod} has no logs yet: {calls.api_message(err)}"
        raise c.api_error(err, f"reading the logs of pod {c.namespace}/{pod}") from err


@click.command("logs", help="The logs of the compensator Job of each step of a RollbackRequest (--reader: of its "
                            "reader Job, the read-back), each under a line naming its step and Job; --step N: that "
                            "step's log alone. A Job is the last attempt the request started (or, for a step it did "
                            "not run, the run's last); logs last as long as the Job is kept (ttlSecondsAfterFinished).")
@click.argument("request", shell_complete=complete_names("rollbackrequests"))
@click.option("--step", type=click.IntRange(min=0), default=None, help="Only this step (its log alone, no heading).")
@click.option("--reader", is_flag=True, help="The reader Job's log (the read-back) instead of the compensator's.")
@click.option("--tail", type=click.IntRange(min=0), default=None, metavar="N",
              help="Only the last N lines of each log.")
@global_options
def logs(request: str, step: int | None, reader: bool, tail: int | None) -> int:
    c = conn()
    lowered = request.lower()
    name = request[len(next((p for p in REQUEST_PREFIXES if lowered.startswith(p)), "")):]
    req = c.get("rollbackrequests", name, missing=f"list them with kubectl get rollbackrequests -n {c.namespace}")
    where = f"RollbackRequest {c.namespace}/{name}"
    run_name = ((req.get("spec") or {}).get("runRef") or {}).get("name") or ""
    run = c.get("runs", run_name) if run_name else None
    if run is None:  # the Run owns the Jobs: they went with it
        raise CliError(f"{where}: its Run {c.namespace}/{run_name} is gone, and its Jobs with it (a Run owns its "
                       "Jobs); nothing to show")
    role = "reader" if reader else "compensator"
    selector = f"{LABEL_RUN_UID}={run['metadata']['uid']},{LABEL_ROLE}={role}"
    if step is not None:
        selector += f",{LABEL_STEP}={step}"
    jobs = views.jobs_by_step(_list(c, client.BatchV1Api(c.api).list_namespaced_job, "Jobs", selector),
                              req["metadata"].get("uid"))
    entries = {e.get("step"): e for e in (req.get("status") or {}).get("steps") or []}
    if step is not None:
        return _one_step(c, where, step, role, jobs.get(step), selector, tail)
    steps = sorted({s for s in entries if isinstance(s, int)} | set(jobs))
    if not steps:
        phase = (req.get("status") or {}).get("phase") or "Pending"
        remark(f"{where} ({phase}) has started no {role} Job: no step of it was undone"
               + (" and read back" if reader else ""))
        return 0
    pods = _list(c, c.core.list_namespaced_pod, "pods", selector) if jobs else []
    for index, s in enumerate(steps):
        entry = entries.get(s) or {}
        tool = entry.get("compensationTool") if not reader else entry.get("tool")
        out(("\n" if index else "") + views.logs_heading(s, tool, jobs.get(s), name))
        out(_log_text(c, s, role, jobs.get(s), pods, tail))
    return 0


def _one_step(c: Connection, where: str, step: int, role: str, job: Mapping[str, Any] | None, selector: str,
              tail: int | None) -> int:
    """``logs --step N``: the log alone on stdout; no Job, no pod or no log is an error line."""
    if job is None:
        raise CliError(f"step {step} of {where} has no {role} Job (not started yet, or deleted after its "
                       "ttlSecondsAfterFinished); see its stage with kubectl reversi describe")
    pods = _list(c, c.core.list_namespaced_pod, "pods", selector)
    pod = views.pod_of_job(pods, job["name"])
    if pod is None:
        raise CliError(f"Job {c.namespace}/{job['name']} (step {step}) has no pod (not scheduled yet, or removed)")
    text, why = read_log(c, pod["name"], role, tail)
    if text is None:
        raise CliError(why)
    click.echo(text, nl=not text.endswith("\n"))
    return 0


def _log_text(c: Connection, step: int, role: str, job: Mapping[str, Any] | None, pods: list[dict[str, Any]],
              tail: int | None) -> str:
    """One step's log for ``logs`` without ``--step``, or the one line that says why there is none."""
    if job is None:
        return f"(no {role} Job for step {step}: not started yet, or deleted after its ttlSecondsAfterFinished)"
    pod = views.pod_of_job(pods, job["name"])
    if pod is None:
        return f"(Job {job['name']} has no pod: not scheduled yet, or removed)"
    text, why = read_log(c, pod["name"], role, tail)
    if text is None:
        return f"({why})"
    return text.rstrip("\n") if text.strip() else "(the log is empty)"
