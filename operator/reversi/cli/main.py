"""``kubectl reversi``: plan, start, follow and settle rollbacks; halt new calls; export the record.

    kubectl reversi [--kubeconfig PATH] [--context NAME] [-n NAMESPACE] COMMAND ... [-o FORMAT]

    plan RUN                          what undoing RUN would do (computed locally; exit 2: not fully reversible)
    rollback RUN [--wait] ...         create a RollbackRequest (exit 2 with --wait: not complete)
    describe REQUEST | run/RUN | run RUN   the report of a request, and what to do next
    logs REQUEST [--step N] [--reader] [--tail N]   the logs of its compensator (or reader) Jobs
    resolve RUN STEP --status ...     settle an intended or uncertain step
    approve REQUEST --step N | --all  approve compensations that need it
    deny REQUEST --step N --note T    deny a compensation that awaits approval (it is not undone)
    cancel REQUEST                    stop a rollback: nothing new starts, running Jobs finish, the Run is released
    halt add|list|lift                refuse new calls (Halt, ClusterHalt)
    kill-switch on|off|status         refuse every new call everywhere
    check [--pre]                     what is wrong with a cluster before an install, or with an install
    export RUN                        the journal, undo state and transitions as JSON lines
    archive list|show                 Runs retention deleted, from the archive in PostgreSQL
    version [--client]                this plugin's schema version and each installed CRD's
    completion bash|zsh|fish          the shell completion script (kubectl 1.26+: kubectl_complete-reversi)

``-o/--output`` as kubectl's (:mod:`reversi.cli.output`): ``json`` and ``yaml`` with the API's
camelCase keys, ``name`` (``rollbackrequest.reversi.dev/NAME``), ``wide``; each command takes the
formats that fit it (plan, describe, rollback, halt list, archive list and show: all four;
kill-switch status: json, yaml, name; version and check: json, yaml). A hidden ``--json`` is the
deprecated alias of ``-o json`` (on each of them but check).

The global options also work after the command (``kubectl reversi plan order-9 -n shop``).
Errors are one line on stderr (``error: ...``) and exit 1, a missing optional extra and an
unexpected exception included (``REVERSI_DEBUG=1`` shows the traceback of the latter).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import string
import sys
import time
from typing import Any
from collections.abc import Callable

import click
from kubernetes.client.rest import ApiException

from ..adapters.journal import JournalError, inline_moved, load
from ..adapters.run_tree import node_of, root_of
from ..engine.nested_runs import Node, subtree
from ..models.run import LABEL_ROOT
from ..engine import admission as rules
from ..engine.graph import InvalidRun, build_graph
from ..engine.journal import Journal
from ..engine.gcpause import no_cyclic_gc
from ..engine.plan import build_plan
from ..models.halt import pattern_problem
from ..models.rollbackrequest import Plan, run_ref_name
from ..models.run import UNKNOWN_OUTCOMES
from ..models.runstep import LABEL_RUN, MAX_RUN_STEPS, step_name
from . import output as formats
from . import views
from .check import check as check_command
from ..adapters import apicalls as calls
from .api import API_VERSION, CliError, Connection, check_name, refused, retry_conflicts, server_message
from .completion import COMPLETE_VAR, completion as completion_command
from .logs import logs as logs_command
from .common import (META as _META, SERVERS_SEEN as _server_seen, complete_names, conn, global_options, now, out,
                     output_of, missing_module, output_option, print_document, remark)

RUN_NAMES = complete_names("runs")  # shell completion of a RUN argument
REQUEST_NAMES = complete_names("rollbackrequests")

KILL_SWITCH = "reversi-kill-switch"
POLL_SECONDS = 1.0
PENDING_HINT_SECONDS = 15.0  # rollback --wait: say so when no operator has taken the request by then


# ------------------------------------------------------------------------------------ group


GROUP_HELP = """Plan, start, follow and settle rollbacks of Reversi Runs; halt new calls; export the record.

Exit codes: 0 done (plan: fully reversible; rollback --wait: complete or planned; describe: the
report was shown, whatever its verdict), 1 an error (one line on stderr), 2 plan: not fully
reversible, or rollback --wait: not complete (or waiting for approval).

The global options also work after the command: kubectl reversi plan order-9 -n shop"""


@click.group(help=GROUP_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@global_options
def cli() -> None:
    pass


cli.add_command(check_command)


# -------------------------------------------------------------------------------------- plan


def load_run(c: Connection, name: str) -> dict:
    return c.get("runs", name, missing=f"check the name with kubectl get runs -n {c.namespace}")


def journal_of(c: Connection, run: dict) -> Journal:
    """The run's journal: its RunSteps (one paged LIST by the run's label, never a GET per step)
    merged with the inline journal of a Run of Reversi 0.1 that the operator has not moved yet."""
    name = run["metadata"]["name"]
    try:
        found = load(c.custom, run)
    except ApiException as err:
        raise c.steps_error(err, c.namespace, name) from err
    except JournalError as err:
        raise CliError(f"{err}; fix it (is this plugin older than the operator?)") from err
    if found.missing:
        raise CliError(f"{found.gap_message(f'{c.namespace}/{name}')}; "
                       f"see them with kubectl get runsteps -l {LABEL_RUN}={name} -n {c.namespace}")
    return found


def plan_of(c: Connection, run: dict) -> Plan:
    """The plan of undoing ``run`` now (pure engine), against its recorded undo state."""
    with no_cyclic_gc():
        found = journal_of(c, run)
        try:
            return build_plan(found.spec, found.undo, run_id=run["metadata"]["uid"], graph=build_graph(found.spec),
                              now=time.time())  # a step past its undo window shows as expired
        except InvalidRun as err:
            raise CliError(f"Run {c.namespace}/{run['metadata']['name']} cannot be planned: {err}") from err


@cli.command(help="What undoing RUN would do, computed locally (with its child runs, if any). "
             "Exit 2 when it is not fully reversible.")
@click.argument("run", shell_complete=RUN_NAMES)
@output_option(*formats.FORMATS, what="the plan")
@global_options
def plan(run: str, output: str | None) -> int:
    fmt = output_of(output)
    c = conn()
    obj = load_run(c, run)
    with no_cyclic_gc():
        p = plan_of(c, obj)
        tree = child_tree(c, obj)
        # nested runs: the tree is fully reversible only when every run in it is
        children = {name: plan_of(c, load_run(c, name)) for name in tree if name != run} if tree.get(run) else {}
        blocking = sorted(name for name, cp in children.items() if not cp.fully_reversible)
        whole = p.fully_reversible and not blocking
        if fmt in formats.DOCUMENT_FORMATS:
            doc = views.plan_doc(p, run_id=obj["metadata"].get("uid"))
            if children:
                doc["runs"] = [{"run": run, "steps": len(p.actions), "fullyReversible": p.fully_reversible}] + [
                    {"run": name, "steps": len(cp.actions), "fullyReversible": cp.fully_reversible}
                    for name, cp in sorted(children.items())]
                doc["fullyReversible"] = whole
            print_document(doc, fmt)
        elif fmt == "name":  # the run and the runs below it, as a rollback of it would undo them
            out(formats.names("Run", [run, *sorted(children)]))
        else:
            out(f"Plan for Run {c.namespace}/{run} ({len(p.actions)} steps):")
            out(views.plan_table(p, wide=fmt == "wide") if p.actions else "  no steps recorded")
            out("")
            out(views.plan_verdict(p, run, c.namespace))
            if children:
                out("")
                out("\n".join(views.tree_lines(run, {**{n: len(cp.actions) for n, cp in children.items()},
                                                     run: len(p.actions)}, tree)))
                if blocking:
                    out(f"Not fully reversible below this run: {', '.join(blocking)} "
                        f"(kubectl reversi plan {blocking[0]} {views.ns_flag(c.namespace)} shows why).")
    return 0 if whole else 2


def child_tree(c: Connection, run_obj: dict) -> dict[str, list[Node]]:
    """The runs below ``run_obj`` (nested runs): one LIST by the ``reversi.dev/root`` label."""
    root = root_of(run_obj)
    try:
        items = calls.list_objects(c.custom, "runs", c.namespace, label_selector=f"{LABEL_ROOT}={root}")
    except ApiException as err:
        raise c.api_error(err, f"listing the child runs of Run {c.namespace}/{run_obj['metadata']['name']}", "runs",
                          c.namespace) from err
    return subtree([node_of(o) for o in items], run_obj["metadata"]["name"])


# ---------------------------------------------------------------------------------- rollback


def request_name(run: str) -> str:
    """``<run>-undo-<5 random letters and digits>``, at most 253 characters."""
    suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
    return f"{run[: 253 - 11].rstrip('-.')}-undo-{suffix}"


@cli.command(help="Undo RUN: create a RollbackRequest and print its name.")
@click.argument("run", shell_complete=RUN_NAMES)
@click.option("--name", default=None, help="Name of the request (default: <run>-undo-<random>).")
@click.option("--dry-run", is_flag=True, help="Only plan; nothing is undone.")
@click.option("--approve-compensations", is_flag=True,
              help="Approve every compensation that requires approval (needs the RBAC verb approve).")
@click.option("--retries", type=click.IntRange(1, 10), default=None, help="Attempts per compensation (1-10).")
@click.option("--parallelism", type=click.IntRange(1, 32), default=None, help="Compensations at once (1-32).")
@click.option("--wait", is_flag=True, help="Follow the request until it ends; exit 2 when it is not complete.")
@click.option("--timeout", type=click.FloatRange(min=0), default=0, show_default=True,
              help="With --wait: give up after this many seconds (0: no limit); exit 1.")
@click.option("--approval-grace", type=click.FloatRange(min=0), default=5.0, hidden=True,
              help="With --wait: seconds AwaitingApproval must last before giving up.")
@output_option(*formats.FORMATS, what="the request: json and yaml (with --wait) print only its final report, "
               "with the API's field names, and progress goes to stderr; name prints rollbackrequest.reversi.dev/NAME; "
               "wide (with --wait) shows more columns")
@click.option("--require-verification", is_flag=True,
              help="Count an undo whose tool declares no read-back as unverified (incomplete).")
@click.option("--force", "forced", type=click.IntRange(min=0), multiple=True, metavar="STEP",
              help="Undo STEP even when its compensation's precondition no longer holds (spec.force; repeatable; "
              "needs the RBAC verb force on rollbackrequests).")
@click.option("--compensation-deadline", type=click.IntRange(1, 7 * 86400), default=None, metavar="SECONDS",
              help="Start no compensation-kind undo later than this after the request starts "
              "(spec.compensationDeadlineSeconds; inverses are not limited).")
@global_options
def rollback(run: str, name: str | None, dry_run: bool, approve_compensations: bool, retries: int | None,
             parallelism: int | None, wait: bool, timeout: float, approval_grace: float, output: str | None,
             require_verification: bool, forced: tuple[int, ...], compensation_deadline: int | None) -> int:
    fmt = output_of(output)
    if fmt in formats.DOCUMENT_FORMATS and not wait:
        raise CliError(f"-o {fmt} needs --wait (the report is printed when the request ends)")
    c = conn()
    load_run(c, run)
    name = name or request_name(run)
    spec: dict[str, Any] = {"runRef": {"name": run}, "dryRun": dry_run, "approveCompensations": approve_compensations}
    if retries is not None:
        spec["retries"] = retries
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if require_verification:
        spec["requireVerification"] = True
    if forced:
        spec["force"] = [{"step": s} for s in sorted(set(forced))]  # actor and forcedAt come from admission
    if compensation_deadline is not None:
        spec["compensationDeadlineSeconds"] = compensation_deadline
    body = {"apiVersion": API_VERSION, "kind": "RollbackRequest",
            "metadata": {"name": name, "namespace": c.namespace}, "spec": spec}
    c.create("rollbackrequests", body)
    if fmt == "name":
        out(formats.object_name("RollbackRequest", name))
    else:
        (remark if fmt in formats.DOCUMENT_FORMATS else out)(name)
    if not wait:
        remark(f"RollbackRequest {c.namespace}/{name} created; follow it with "
             f"kubectl reversi describe {name} -n {c.namespace}")
        return 0
    return follow(c, name, timeout, approval_grace, fmt)


def follow(c: Connection, name: str, timeout: float, approval_grace: float, fmt: str | None = None) -> int:
    """Print progress of a request until its phase is final (or it waits for approval for
    ``approval_grace`` seconds), then the describe view. ``fmt`` ``json`` or ``yaml``: progress
    and the view on stderr, then only the report (:func:`views.report_doc`) on stdout; ``name``:
    everything on stderr; ``wide``: the view with more columns. Returns the exit code: 0 complete
    (a dry run: fully reversible), 2 not complete (a dry run: not fully reversible), 1 an error."""
    emit = remark if fmt in (*formats.DOCUMENT_FORMATS, "name") else out
    wide = fmt == "wide"
    started = time.monotonic()
    shown_phase = None
    shown: dict[int, tuple] = {}
    awaiting_since: float | None = None
    pending_hint_shown = False
    missing = f"it was deleted while waiting (kubectl get rollbackrequests -n {c.namespace})"
    while True:
        req = c.get("rollbackrequests", name, missing=missing)
        status = req.get("status") or {}
        line = views.phase_line(req)
        if line != shown_phase:
            emit(line)
            shown_phase = line
        for entry in status.get("steps") or []:
            key = views.progress_key(entry)
            if shown.get(entry.get("step")) != key:
                emit("  " + views.progress_line(entry))
                shown[entry.get("step")] = key
        phase = status.get("phase")
        if phase in views.FINAL_EXIT:
            emit("")
            emit(describe_view(c, req, wide))
            if fmt in formats.DOCUMENT_FORMATS:
                print_document(views.report_doc(req), fmt)
            if phase == "Planned":
                return 0 if (status.get("plan") or {}).get("fullyReversible") else 2
            return views.FINAL_EXIT[phase]
        if phase == "AwaitingApproval":
            awaiting_since = awaiting_since or time.monotonic()
            if time.monotonic() - awaiting_since >= approval_grace:
                emit("")
                emit(describe_view(c, req, wide))
                emit("")
                emit("Stopped waiting: " + views.approval_hint(req))
                if fmt in formats.DOCUMENT_FORMATS:
                    print_document(views.report_doc(req), fmt)
                return 2
        else:
            awaiting_since = None
        if (phase is None or (phase == "Pending" and not (req.get("status") or {}).get("conditions"))) \
                and not pending_hint_shown and time.monotonic() - started > PENDING_HINT_SECONDS:
            remark("note: the operator has not picked the request up yet; is reversi-operator running?")
            pending_hint_shown = True
        if timeout and time.monotonic() - started > timeout:
            raise CliError(f"timed out after {timeout:g}s waiting for RollbackRequest {c.namespace}/{name} "
                           f"({line}); it goes on in the cluster: kubectl reversi describe {name} -n {c.namespace}")
        time.sleep(POLL_SECONDS)


# ---------------------------------------------------------------------------------- describe


RUN_PREFIXES = ("run/", "runs/", "rvrun/", "run.reversi.dev/", "runs.reversi.dev/")
REQUEST_PREFIXES = ("rollbackrequest/", "rollbackrequests/", "rbr/", "rollbackrequest.reversi.dev/",
                    "rollbackrequests.reversi.dev/")


def requests_of(c: Connection, run: str) -> list[dict]:
    """The RollbackRequests of the namespace whose ``spec.runRef`` names Run ``run`` (one paged LIST)."""
    return [r for r in c.list("rollbackrequests") if run_ref_name(r) == run]


def request_of_run(c: Connection, run: dict) -> dict:
    """The RollbackRequest ``describe run/RUN`` shows: the one working on the run now
    (``status.activeRequest``), else the one that last took its lock (``status.lastRequest``; a
    later dry run does not hide it), else the newest one whose ``spec.runRef.name`` is the run (a
    dry run takes no lock). What stands on the run, which the alerts and an acknowledgement
    follow, is the Run's own ``status.standing``, which ``describe`` prints with it whichever
    request it shows (docs/concepts.md#what-stands). Raises :class:`CliError` when the run has none."""
    name = run["metadata"]["name"]
    status = run.get("status") or {}
    for held in (status.get("activeRequest"), status.get("lastRequest")):
        found = c.get("rollbackrequests", held) if held else None
        if found and run_ref_name(found) == name:
            return found  # else deleted since (or its name used again for another Run): the newest one left
    mine = requests_of(c, name)
    if not mine:
        raise CliError(f"no RollbackRequest for Run {c.namespace}/{name}; start one with "
                       f"kubectl reversi rollback {name} -n {c.namespace}")
    return max(mine, key=lambda r: (r["metadata"].get("creationTimestamp") or "", r["metadata"]["name"]))


def describe_view(c: Connection, req: dict, wide: bool = False) -> str:
    """The describe report; the Run (tool names) and the Events are extras: a user who may not
    read them still gets the report."""
    run_name = ((req.get("spec") or {}).get("runRef") or {}).get("name", "")
    uid = req["metadata"].get("uid")
    missing = "not found"
    try:
        run = c.get("runs", run_name) if run_name else None
    except CliError as err:
        remark(f"warning: {err}")
        run, missing = None, "not readable"
    step_tools = None
    if run is not None and views.steps_without_tool(req):
        try:  # a long run's status names a bounded part of its steps: the rest from the RunSteps
            step_tools = {o["spec"]["index"]: o["spec"].get("tool", "") for o in c.run_steps(run_name)}
        except CliError as err:
            remark(f"warning: tool names left out: {err}")
    try:
        events = c.events_for(c.namespace, "RollbackRequest", {uid}) if uid else []
    except CliError as err:
        remark(f"warning: {err}")
        events = []
    return views.describe_request(req, run, events, now(), run_missing=missing, step_tools=step_tools, wide=wide)


@cli.command(help="The report of a RollbackRequest (or of the newest one of a run: run/RUN or run RUN), "
                  "and what to do next. Exit 0 when the report is shown, whatever its verdict.")
@click.argument("target", metavar="REQUEST|run/RUN|run RUN", shell_complete=REQUEST_NAMES)
@click.argument("run_name", metavar="", required=False)
@output_option(*formats.FORMATS, what="the report: json and yaml as rollback --wait -o json prints it, name as "
               "rollbackrequest.reversi.dev/NAME, wide with more columns in the steps table")
@global_options
def describe(target: str, run_name: str | None, output: str | None) -> int:
    fmt = output_of(output)
    c = conn()
    lowered = target.lower()
    if run_name is not None:  # kubectl style: describe run NAME
        if lowered.rstrip("/") + "/" not in RUN_PREFIXES:
            raise click.UsageError(f"describe takes one REQUEST, or run/RUN, or run RUN; got {target!r} {run_name!r}")
        target, lowered = f"run/{run_name}", f"run/{run_name.lower()}"
    run_prefix = next((p for p in RUN_PREFIXES if lowered.startswith(p)), None)
    if run_prefix:
        req = request_of_run(c, load_run(c, target[len(run_prefix):]))
    else:
        req_prefix = next((p for p in REQUEST_PREFIXES if lowered.startswith(p)), "")
        name = target[len(req_prefix):]
        if lowered.rstrip("/") + "/" in RUN_PREFIXES and not name.strip("/"):
            raise click.UsageError("name the run: describe run/RUN or describe run RUN")
        req = c.get("rollbackrequests", name,
                    missing=f"list them with kubectl get rollbackrequests -n {c.namespace}, "
                            f"or describe the newest of a run with kubectl reversi describe run/RUN")
    if fmt in formats.DOCUMENT_FORMATS:
        print_document(views.report_doc(req), fmt)
    elif fmt == "name":
        out(formats.object_name("RollbackRequest", req["metadata"]["name"]))
    else:
        out(describe_view(c, req, wide=fmt == "wide"))
    return 0


# ----------------------------------------------------------------------------------- resolve


def check_resolution(obj: dict, where: str, step: int) -> None:
    """Refuse locally what the server would refuse: a RunStep (``obj``) whose outcome is settled,
    or that is already resolved. ``where`` names the run (``Run shop/order-9``)."""
    spec = obj.get("spec") or {}
    if spec.get("outcome") not in UNKNOWN_OUTCOMES:
        raise CliError(f"step {step} ({spec.get('tool')}) of {where} has outcome {spec.get('outcome')}: "
                       "only intended or uncertain steps are resolved; there is nothing to settle")
    old = spec.get("resolution")
    if old:
        by = f" by {old['actor']}" if old.get("actor") else ""
        raise CliError(f"step {step} of {where} is already resolved as {old.get('status')}{by} "
                       f"({old.get('note')!r}); a resolution cannot be changed")


def missing_step(run: dict, namespace: str, step: int) -> CliError:
    """The error for a step that has no RunStep: not recorded, or still inline in a Run of
    Reversi 0.1 that the operator has not moved yet."""
    name = run["metadata"]["name"]
    where = f"Run {namespace}/{name}"
    listing = f"kubectl get runsteps -l {LABEL_RUN}={name} -n {namespace}"
    if any(s.get("index") == step for s in (run.get("spec") or {}).get("steps") or []):
        return CliError(f"step {step} of {where} is still inline in the Run (recorded by Reversi 0.1): "
                        f"reversi-operator moves it into RunStep {step_name(name, step)} when it runs; "
                        f"resolve it once it is there ({listing})")
    return CliError(f"{where} has no step {step} (no RunStep {namespace}/{step_name(name, step)}); "
                    f"see its steps with {listing}")


@cli.command(help="Settle an intended or uncertain step of RUN: what did the call really do?")
@click.argument("run", shell_complete=RUN_NAMES)
@click.argument("step", type=click.IntRange(min=0, max=MAX_RUN_STEPS - 1))
@click.option("--status", "outcome", type=click.Choice(["succeeded", "failed"]), required=True,
              help="What the call really did.")
@click.option("--result", default=None, metavar="JSON",
              help='The call\'s real result, a JSON object, e.g. \'{"id": "cap_1"}\' (needed for $result templates).')
@click.option("--note", required=True, help="How you know (required; kept in the record).")
@global_options
def resolve(run: str, step: int, outcome: str, result: str | None, note: str) -> int:
    if not note.strip():
        raise CliError("--note is empty; say how you know what the call did (it is kept in the record)")
    value: dict[str, Any] = {"status": outcome}
    if result is not None:
        try:
            parsed = json.loads(result)
        except ValueError as err:
            raise CliError(f"--result is not JSON ({err}); pass an object, "
                           "e.g. --result '{\"id\": \"cap_1\"}'") from err
        if not isinstance(parsed, dict):
            raise CliError("--result must be a JSON object, e.g. --result '{\"id\": \"cap_1\"}'")
        value["result"] = parsed
    value["note"] = note
    check_name(run, "Run")
    c = conn()
    where = f"Run {c.namespace}/{run}"
    name = step_name(run, step)

    def attempt() -> dict:
        obj = c.get("runsteps", name)
        if obj is None:
            raise missing_step(load_run(c, run), c.namespace, step)
        check_resolution(obj, where, step)
        # the resourceVersion makes the merge patch conditional: a step that changed meanwhile
        # (its outcome recorded, another resolution) is read again and checked again
        return c.patch("runsteps", name, {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                                          "spec": {"resolution": value}})

    try:
        updated = retry_conflicts(attempt, f"resolving step {step} of {where}")
    except ApiException as err:
        raise refused(err, f"resolving step {step} of {where}") from err
    saved = (updated.get("spec") or {}).get("resolution") or value
    by = f" by {saved['actor']}" if saved.get("actor") else ""
    out(f"{where}: step {step} resolved as {outcome}{by}.")
    remark(f"See what the rollback will do now: kubectl reversi plan {run} -n {c.namespace}")
    return 0


# ----------------------------------------------------------------------------------- approve


def check_approval(req: dict, namespace: str, steps: tuple[int, ...]) -> None:
    """Refuse locally what cannot work: a finished or dry-run request, a step that is not a
    compensation needing approval (when the plan in status says so)."""
    meta, spec, status = req["metadata"], req.get("spec") or {}, req.get("status") or {}
    where = f"RollbackRequest {namespace}/{meta['name']}"
    run = (spec.get("runRef") or {}).get("name", "RUN")
    if spec.get("dryRun"):
        raise CliError(f"{where} is a dry run: nothing is undone, so there is nothing to approve; "
                       f"start a real one with kubectl reversi rollback {run} -n {namespace}")
    phase = status.get("phase")
    if phase in ("Succeeded", "Incomplete", "Failed"):
        raise CliError(f"{where} has ended ({phase}): approving it changes nothing; start a new request with "
                       f"kubectl reversi rollback {run} -n {namespace} and approve that one")
    plan = status.get("plan") or {}
    actions = {a["step"]: a for a in plan.get("actions") or []}
    for s in steps:
        action = actions.get(s)
        if action is not None and not (action.get("kind") in ("compensate", "defer") and action.get("needsApproval")):
            raise CliError(f"step {s} of {where} needs no approval ({action.get('kind')}: "
                           f"{action.get('reason') or 'its compensation does not require approval'})")
        if action is None and plan and not plan.get("omitted"):
            raise CliError(f"{where} has no step {s} in its plan; see which steps wait with "
                           f"kubectl reversi describe {meta['name']} -n {namespace}")


@cli.command(help="Deny the compensation of a step that awaits approval: it is not undone, the report says "
             "\"denied by <you>: <note>\" under awaitingApproval, and the request finishes. "
             "Needs the RBAC verb approve.")
@click.argument("request", shell_complete=REQUEST_NAMES)
@click.option("--step", "steps", type=click.IntRange(min=0), multiple=True, required=True,
              help="Step to deny (repeatable).")
@click.option("--note", required=True, help="Why, for the record.")
@global_options
def deny(request: str, steps: tuple[int, ...], note: str) -> int:
    if not note.strip():
        raise click.UsageError("--note must say why")
    c = conn()
    where = f"RollbackRequest {c.namespace}/{request}"
    missing = f"list them with kubectl get rollbackrequests -n {c.namespace}"
    try:
        def attempt() -> dict | None:
            req = c.get("rollbackrequests", request, missing=missing)
            check_approval(req, c.namespace, steps)
            have = {d.get("step") for d in (req.get("spec") or {}).get("denials") or []}
            new = [s for s in dict.fromkeys(steps) if s not in have]
            if not new:
                return None
            ops = append_to_spec_list(req, "denials", [{"step": s, "note": note} for s in new])
            return c.patch("rollbackrequests", request, ops, json_patch=True)

        updated = retry_conflicts(attempt, f"denying in {where}")
    except ApiException as err:
        hint = ""
        if err.status == 403 and 'verb "approve"' not in server_message(err):
            hint = "; denying needs the RBAC verbs patch and approve on rollbackrequests.reversi.dev"
        raise CliError(f"{refused(err, f'denying in {where}')}{hint}") from err
    if updated is None:
        out(f"{where}: step(s) {views.steps_text(list(steps))} already denied; nothing to do.")
        return 0
    by = {d.get("step"): d.get("actor") for d in (updated.get("spec") or {}).get("denials") or []}
    for s in dict.fromkeys(steps):
        out(f"{where}: step {s} denied{f' by {by[s]}' if by.get(s) else ''}: it will not be undone.")
    return 0


def append_to_spec_list(obj: dict, field: str, entries: list[dict]) -> list[dict]:
    """A JSON patch that appends ``entries`` to ``spec.<field>`` of ``obj`` (creating the list when
    absent), guarded by a ``test`` of the resourceVersion read: a lost race is a 409, retried."""
    ops: list[dict] = [{"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]}]
    if (obj.get("spec") or {}).get(field) is None:
        return ops + [{"op": "add", "path": f"/spec/{field}", "value": entries}]
    return ops + [{"op": "add", "path": f"/spec/{field}/-", "value": entry} for entry in entries]


@cli.command(help="Approve compensations of a RollbackRequest: --step N (repeatable) or --all.")
@click.argument("request", shell_complete=REQUEST_NAMES)
@click.option("--step", "steps", type=click.IntRange(min=0), multiple=True, help="Step to approve (repeatable).")
@click.option("--all", "approve_all", is_flag=True, help="Approve every compensation (spec.approveCompensations).")
@global_options
def approve(request: str, steps: tuple[int, ...], approve_all: bool) -> int:
    if not steps and not approve_all:
        raise click.UsageError("say what to approve: --step N (repeatable) or --all")
    if steps and approve_all:
        raise click.UsageError("use --step or --all, not both")
    c = conn()
    where = f"RollbackRequest {c.namespace}/{request}"
    missing = f"list them with kubectl get rollbackrequests -n {c.namespace}"
    try:
        if approve_all:
            req = c.get("rollbackrequests", request, missing=missing)
            check_approval(req, c.namespace, ())
            updated = c.patch("rollbackrequests", request, {"spec": {"approveCompensations": True}})
            by = (updated.get("spec") or {}).get("approvedBy")
            out(f"{where}: every compensation approved (approveCompensations){f' by {by}' if by else ''}.")
            return 0

        def attempt() -> dict | None:
            req = c.get("rollbackrequests", request, missing=missing)
            check_approval(req, c.namespace, steps)
            have = {a.get("step") for a in (req.get("spec") or {}).get("approvals") or []}
            new = [s for s in dict.fromkeys(steps) if s not in have]
            if not new:
                return None
            ops = append_to_spec_list(req, "approvals", [{"step": s} for s in new])
            return c.patch("rollbackrequests", request, ops, json_patch=True)

        updated = retry_conflicts(attempt, f"approving {where}")
    except ApiException as err:
        hint = ""
        if err.status == 403 and 'verb "approve"' not in server_message(err):
            hint = "; approving needs the RBAC verbs patch and approve on rollbackrequests.reversi.dev"
        raise CliError(f"{refused(err, f'approving {where}')}{hint}") from err
    if updated is None:
        out(f"{where}: step(s) {views.steps_text(list(steps))} already approved; nothing to do.")
        return 0
    approvers = {a.get("step"): a.get("approver") for a in (updated.get("spec") or {}).get("approvals") or []}
    done = ", ".join(f"{s}" + (f" (by {approvers[s]})" if approvers.get(s) else "") for s in dict.fromkeys(steps))
    out(f"{where}: approved step(s) {done}.")
    return 0


# ------------------------------------------------------------------------------------ cancel


@cli.command(help="Cancel a RollbackRequest (spec.cancel): no new compensator or reader Job starts; running Jobs "
             "finish and their outcome is recorded; every step not started is reported cancelled; the Run is "
             "released and the request ends Incomplete (Complete=False, reason Cancelled). A request that has "
             "ended is left as it is. Needs the RBAC verb patch on rollbackrequests (as deleting needs delete).")
@click.argument("request", shell_complete=REQUEST_NAMES)
@global_options
def cancel(request: str) -> int:
    c = conn()
    where = f"RollbackRequest {c.namespace}/{request}"
    missing = f"list them with kubectl get rollbackrequests -n {c.namespace}"
    try:
        req = c.get("rollbackrequests", request, missing=missing)
        spec, status = req.get("spec") or {}, req.get("status") or {}
        phase = status.get("phase")
        if phase in ("Planned", "Succeeded", "Incomplete", "Failed"):
            out(f"{where} has already ended ({phase}): cancelling it changes nothing.")
            return 0
        if spec.get("cancel"):
            by = f" by {spec['cancelledBy']}" if spec.get("cancelledBy") else ""
            out(f"{where} is already cancelled{by}: it ends once its running Jobs finish.")
            return 0
        updated = c.patch("rollbackrequests", request, {"spec": {"cancel": True}})
    except ApiException as err:
        hint = "; cancelling needs the RBAC verb patch on rollbackrequests.reversi.dev" if err.status == 403 else ""
        raise CliError(f"{refused(err, f'cancelling {where}')}{hint}") from err
    cancelled_by = (updated.get("spec") or {}).get("cancelledBy")
    by = f" by {cancelled_by}" if cancelled_by else ""
    out(f"{where}: cancelled{by}. No new compensation starts; running ones finish and are "
        f"recorded; steps not started are reported cancelled. Follow it: kubectl reversi describe {request} "
        f"-n {c.namespace}")
    return 0


# ------------------------------------------------------------------------------- acknowledge


@cli.command(help="Accept what RUN's rollbacks could not undo (what stands, its residue): the Run and the "
             "RollbackRequest whose residue it is read as done (Ready; Flux, Argo CD and kstatus see them healthy), "
             "the incomplete-rollback alerts clear, and the report still says what stands. Say in --note what was "
             "done about it. A later rollback that leaves something new standing is not covered; one that undid "
             "nothing is. --withdraw takes the acknowledgement back. Needs the RBAC verb acknowledge on runs (the "
             "role reversi-acknowledge).")
@click.argument("run", shell_complete=RUN_NAMES)
@click.option("--note", default=None, help="What was done about the residue, for the record (at most 1024 characters).")
@click.option("--withdraw", is_flag=True, help="Take the acknowledgement back: the run is incomplete again.")
@global_options
def acknowledge(run: str, note: str | None, withdraw: bool) -> int:
    c = conn()
    where = f"Run {c.namespace}/{run}"
    if withdraw == (note is not None):
        raise click.UsageError("give --note (what was done about the residue) or --withdraw")
    if note is not None and not note.strip():
        raise click.UsageError("--note must say what was done about the residue")
    load_run(c, run)
    body = {"spec": {"acknowledgement": None if withdraw else {"note": note}}}
    try:
        updated = c.patch("runs", run, body)
    except ApiException as err:  # the server's message says what to do (the RBAC verb, or what to wait for)
        raise CliError(refused(err, f"acknowledging {where}")) from err
    if withdraw:
        out(f"{where}: acknowledgement withdrawn; what stands counts as incomplete again.")
        return 0
    ack = (updated.get("spec") or {}).get("acknowledgement") or {}
    by = f" by {ack['actor']}" if ack.get("actor") else ""
    request = f" of RollbackRequest {ack['request']}" if ack.get("request") else ""
    out(f"{where}: the residue{request} is acknowledged{by}. The report still lists it: "
        f"kubectl reversi describe run/{run} -n {c.namespace}")
    return 0


# -------------------------------------------------------------------------------------- halt


@cli.group(help="Refuse new calls: add, list and lift Halts (namespaced) and ClusterHalts.")
@global_options
def halt() -> None:
    pass


def halt_body(name: str, namespace: str | None, reason: str, by: str | None, scope: dict[str, str]) -> dict:
    """A Halt (``namespace`` given) or ClusterHalt object."""
    spec: dict[str, Any] = {"reason": reason}
    if by:
        spec["by"] = by
    if scope:
        spec["scope"] = scope
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": API_VERSION, "kind": "Halt" if namespace else "ClusterHalt", "metadata": meta, "spec": spec}


def current_user(c: Connection) -> str | None:
    user = c.whoami()
    return user if user and len(user) <= 253 else None


@halt.command("add", help="Refuse new calls that match the scope (no scope: every call).")
@click.argument("name")
@click.option("--reason", required=True, help='Why; refused calls get "kill switch: <reason>".')
@click.option("--tool", default=None, metavar="GLOB", help="Glob over the tool, e.g. 'payments.*'.")
@click.option("--actor", default=None, metavar="GLOB", help="Glob over the run's scope.actor.")
@click.option("--tenant", default=None, metavar="GLOB", help="Glob over the run's scope.tenant.")
@click.option("--environment", default=None, metavar="GLOB", help="Glob over the run's scope.environment.")
@click.option("--cluster", is_flag=True, help="A ClusterHalt: every namespace (or --namespace-glob).")
@click.option("--namespace-glob", default=None, metavar="GLOB", help="With --cluster: glob over the run's namespace.")
@click.option("--wait", is_flag=True, help="Wait until the API server refuses the calls it matches (its InForce "
              "condition, set by the operator from a dry-run probe); exit 1 when that does not come within --timeout.")
@click.option("--timeout", default=30.0, show_default=True, help="With --wait: seconds to wait.")
@global_options
def halt_add(name: str, reason: str, tool: str | None, actor: str | None, tenant: str | None,
             environment: str | None, cluster: bool, namespace_glob: str | None, wait: bool = False,
             timeout: float = 30.0) -> int:
    if namespace_glob is not None and not cluster:
        raise click.UsageError("--namespace-glob needs --cluster (a Halt covers its own namespace only)")
    if not reason.strip():
        raise CliError("--reason is empty; say why calls are halted (refused calls quote it)")
    scope = halt_scope(tool=tool, actor=actor, tenant=tenant, environment=environment, namespace=namespace_glob)
    c = conn()
    body = halt_body(name, None if cluster else c.namespace, reason, current_user(c), scope)
    plural = "clusterhalts" if cluster else "halts"
    try:
        c.create(plural, body, cluster=cluster)
    except CliError as err:
        if "already exists" in str(err):
            lift = f"kubectl reversi halt lift {name}" + (" --cluster" if cluster else f" -n {c.namespace}")
            raise CliError(f"{'ClusterHalt ' + name if cluster else f'Halt {c.namespace}/{name}'} already exists; "
                           f"lift it first ({lift}) or choose another name") from err
        raise
    where = f"ClusterHalt {name}" if cluster else f"Halt {c.namespace}/{name}"
    reach = "in every namespace" if cluster and "namespace" not in scope else (
        "" if cluster else f"in namespace {c.namespace}")
    out(f"{where} created: new calls matching {views.scope_text(scope)} {reach} are refused "
        f"(\"kill switch: {reason}\"); rollbacks keep working.".replace("  ", " "))
    if "tool" in scope:
        warn_no_tool(c, scope, None if cluster else c.namespace)
    if wait:
        wait_in_force(c, plural, name, where, cluster, timeout)
    return 0


def wait_in_force(c: Connection, plural: str, name: str, where: str, cluster: bool, timeout: float) -> None:
    """Wait until the halt's ``InForce`` condition is True (the operator's dry-run probe was
    refused by the API server). Raises :class:`CliError` after ``timeout`` seconds, saying what
    the condition said last."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while True:
        obj = c.get(plural, name, None if cluster else c.namespace, cluster=cluster) or {}
        last = next((x for x in (obj.get("status") or {}).get("conditions") or [] if x.get("type") == "InForce"), {})
        if last.get("status") == "True":
            out(f"{where} is in force: the API server refuses the calls it matches.")
            return
        if time.monotonic() >= deadline:
            said = f"InForce={last.get('status')} ({last.get('reason')}: {last.get('message')})" if last else \
                "no InForce condition yet (is the operator running?)"
            raise CliError(f"{where} was created but not confirmed in force within {timeout:g}s: {said}")
        time.sleep(0.2)


def halt_scope(**fields: str | None) -> dict[str, str]:
    """The scope of ``halt add``: every option given, an empty one included (refused here with the
    same rule and message as the webhook: :func:`reversi.models.halt.pattern_problem`)."""
    scope = {k: v for k, v in fields.items() if v is not None}
    for field, pattern in scope.items():
        why = pattern_problem(field, pattern)
        if why:
            option = "--namespace-glob" if field == "namespace" else f"--{field}"
            raise CliError(f"{option} {pattern!r} can never match: {why}")
    return scope


def warn_no_tool(c: Connection, scope: dict[str, str], namespace: str | None) -> None:
    """Say so when ``scope.tool`` matches no tool of the ToolManifests in reach (like the webhook)."""
    try:
        manifests = c.list("toolmanifests", namespace, all_namespaces=namespace is None)
    except CliError:
        return
    tools = rules.tools_in_reach(manifests, namespace, scope)
    if not rules.tools_matched(scope["tool"], tools):
        remark("warning: " + rules.no_tool_message(scope["tool"], rules.reach_text(namespace, scope), len(tools)))


@halt.command("list", help="Halts (of the namespace, or all) and ClusterHalts: reason, scope, active, refused, age.")
@click.option("-A", "--all-namespaces", is_flag=True, help="Halts of every namespace.")
@output_option(*formats.FORMATS, what="the halts: json and yaml as a v1 List of the objects, name as "
               "halt.reversi.dev/NAME and clusterhalt.reversi.dev/NAME, wide with InForce and every condition")
@global_options
def halt_list(all_namespaces: bool, output: str | None) -> int:
    fmt = output_of(output)
    c = conn()
    halts = c.list("halts", all_namespaces=all_namespaces)
    if not halts and not all_namespaces:
        c.check_namespace()
    for h in halts:
        h.setdefault("kind", "Halt")
    try:
        cluster_halts = c.list("clusterhalts", cluster=True)
    except CliError as err:
        remark(f"warning: ClusterHalts not listed: {err}")
        cluster_halts = []
    for h in cluster_halts:
        h.setdefault("kind", "ClusterHalt")
    items = sorted(cluster_halts, key=lambda h: h["metadata"]["name"]) + \
        sorted(halts, key=lambda h: (h["metadata"].get("namespace", ""), h["metadata"]["name"]))
    if fmt in formats.DOCUMENT_FORMATS:
        print_document(formats.list_of(items), fmt)
        return 0
    if not items:
        where = "any namespace" if all_namespaces else f"namespace {c.namespace}"
        (remark if fmt == "name" else out)(f"No halts in {where} and no ClusterHalts: new calls are admitted.")
        return 0
    if fmt == "name":
        out("\n".join(formats.object_name(h["kind"], h["metadata"]["name"]) for h in items))
        return 0
    out(views.halt_rows(items, now(), all_namespaces, wide=fmt == "wide"))
    for note in views.halt_notes(items):
        out(note)
    return 0


@halt.command("lift", help="Delete a Halt (or a ClusterHalt with --cluster): calls are admitted again. "
              "--all lifts every Halt of the namespace (with --cluster: every ClusterHalt) after a confirmation.")
@click.argument("name", required=False, shell_complete=complete_names("halts"))
@click.option("--cluster", is_flag=True, help="Lift a ClusterHalt.")
@click.option("--all", "lift_all", is_flag=True,
              help="Lift every Halt of the namespace (--cluster: every ClusterHalt).")
@click.option("--yes", "-y", is_flag=True, help="With --all: do not ask for confirmation.")
@global_options
def halt_lift(name: str | None, cluster: bool, lift_all: bool, yes: bool) -> int:
    c = conn()
    plural = "clusterhalts" if cluster else "halts"
    if lift_all or not name:
        if name or not lift_all:
            raise CliError("name one halt to lift, or lift them all with --all (not both)")
        return lift_every_halt(c, plural, cluster, yes)
    where = f"ClusterHalt {name}" if cluster else f"Halt {c.namespace}/{name}"
    if name == KILL_SWITCH and cluster:
        remark("note: this is the kill switch; kubectl reversi kill-switch off does the same")
    if not c.delete(plural, name, cluster=cluster):
        listing = "kubectl reversi halt list" + ("" if cluster else f" -n {c.namespace}")
        other = "" if cluster else " (a ClusterHalt? add --cluster)"
        raise CliError(f"{where} not found{other}; list halts with {listing}")
    out(f"{where} lifted.")
    return 0


def lift_every_halt(c: Connection, plural: str, cluster: bool, yes: bool) -> int:
    """``halt lift --all``: list what would be lifted, ask (unless ``yes``), delete each."""
    items = c.list(plural, cluster=cluster)
    kind, where = ("ClusterHalt", "the cluster") if cluster else ("Halt", f"namespace {c.namespace}")
    names = sorted(h["metadata"]["name"] for h in items)
    if not names:
        out(f"No {kind}s in {where}: nothing to lift.")
        return 0
    out(f"{len(names)} {kind}(s) in {where}: {', '.join(names)}")
    if not yes and not click.confirm(f"Lift all {len(names)}? New calls they refuse will be admitted again",
                                     default=False, err=True):
        out("Nothing lifted.")
        return 1
    for halt_name in names:
        c.delete(plural, halt_name, cluster=cluster)
        out(f"{kind} {halt_name if cluster else f'{c.namespace}/{halt_name}'} lifted.")
    return 0


# ------------------------------------------------------------------------------- kill switch


@cli.group("kill-switch", help=f"Refuse every new call everywhere (ClusterHalt {KILL_SWITCH}); rollbacks keep working.")
@global_options
def kill_switch() -> None:
    pass


@kill_switch.command("on", help="Turn the kill switch on: every new call in every namespace is refused.")
@click.option("--reason", required=True, help='Why; refused calls get "kill switch: <reason>".')
@global_options
def kill_switch_on(reason: str) -> int:
    if not reason.strip():
        raise CliError("--reason is empty; say why every call is halted (refused calls quote it)")
    c = conn()
    by = current_user(c)
    existing = c.get("clusterhalts", KILL_SWITCH, cluster=True)
    if existing is not None:
        old = (existing.get("spec") or {}).get("reason")
        if old != reason:
            patch: dict[str, Any] = {"spec": {"reason": reason}}
            if by:
                patch["spec"]["by"] = by
            try:
                c.patch("clusterhalts", KILL_SWITCH, patch, cluster=True)
            except ApiException as err:
                raise c.api_error(err, f"updating ClusterHalt {KILL_SWITCH}") from err
            out(f"kill switch was already on; reason changed from {old!r} to {reason!r}.")
        else:
            out("kill switch is already on.")
        return 0
    c.create("clusterhalts", halt_body(KILL_SWITCH, None, reason, by, {}), cluster=True)
    out(f"kill switch ON: every new call in every namespace is refused (\"kill switch: {reason}\"); "
        "rollbacks keep working. Turn it off with kubectl reversi kill-switch off")
    return 0


@kill_switch.command("off", help="Turn the kill switch off (other halts stay).")
@global_options
def kill_switch_off() -> int:
    c = conn()
    if c.delete("clusterhalts", KILL_SWITCH, cluster=True):
        out("kill switch off: new calls are admitted again (unless another halt matches: kubectl reversi halt list).")
    else:
        out("kill switch is already off.")
    return 0


@kill_switch.command("status", help="Whether the kill switch is on.")
@output_option("json", "yaml", "name", what="the state: json and yaml as {on, reason, by, since, refusedCalls}, "
               f"name as clusterhalt.reversi.dev/{KILL_SWITCH} when it is on (nothing when it is off)")
@global_options
def kill_switch_status(output: str | None) -> int:
    fmt = output_of(output)
    c = conn()
    halt_obj = c.get("clusterhalts", KILL_SWITCH, cluster=True)
    if fmt in formats.DOCUMENT_FORMATS:
        print_document(views.kill_switch_doc(halt_obj), fmt)
    elif fmt == "name":
        if halt_obj is not None:
            out(formats.object_name("ClusterHalt", KILL_SWITCH))
    else:
        out(views.kill_switch_text(halt_obj, now()))
    return 0


# ------------------------------------------------------------------------------------ export


@cli.command(help="The record of RUN as JSON lines: run, steps (its RunSteps), resolutions, undo state, transitions.")
@click.argument("run", shell_complete=RUN_NAMES)
@click.option("--with-snapshots", is_flag=True, help="Include each step's manifest snapshot.")
@global_options
def export(run: str, with_snapshots: bool) -> int:
    c = conn()
    obj = load_run(c, run)
    requests = requests_of(c, run)
    names = {r["metadata"]["uid"]: r["metadata"]["name"] for r in requests}
    events = c.events_for(c.namespace, "RollbackRequest", set(names))
    transitions = [{"request": names.get(e["uid"], e["name"]), "reason": e["reason"], "message": e["message"],
                    "time": e["time"]} for e in events]
    write = sys.stdout.write
    with no_cyclic_gc():
        for record in views.export_records(obj, c.run_steps(run), transitions, with_snapshots,
                                           inline=not inline_moved(obj)):
            write(views.json_line(record) + "\n")
    sys.stdout.flush()
    return 0


# -------------------------------------------------------------------------------------- archive


@cli.group(help="Runs that retention deleted, read from the archive in PostgreSQL (docs/operations.md#the-archive). "
                "The database: --dsn, else $REVERSI_ARCHIVE_DSN, else libpq's own settings (PGHOST, PGUSER, "
                "~/.pgpass, ...).")
@global_options
def archive() -> None:
    pass


#: The extra of pyproject.toml that installs the archive's PostgreSQL driver.
ARCHIVE_EXTRA = "archive"


def _archive(dsn: str | None) -> Any:
    """The archive, once its driver is known to import (the adapter imports psycopg only when it
    connects: without this check a missing extra would surface as a traceback mid-command)."""
    import importlib

    try:
        importlib.import_module("psycopg")
    except ImportError as err:
        raise CliError("kubectl reversi archive needs the PostgreSQL driver psycopg, which is not installed: "
                       f"pip install 'reversi[{ARCHIVE_EXTRA}]'") from err
    from ..adapters.archive import Archive

    return Archive(dsn if dsn is not None else os.environ.get("REVERSI_ARCHIVE_DSN", ""))


def _archive_namespace() -> str:
    """-n, else the kubeconfig context's namespace, else default (no cluster is needed)."""
    given = click.get_current_context().meta.get(_META, {}).get("namespace")
    if given:
        return str(given)
    try:
        return conn().namespace
    except CliError:
        return "default"


def _archive_call(fn: Callable[[], Any]) -> Any:
    from ..adapters.archive import ArchiveError

    try:
        return fn()
    except ArchiveError as err:
        raise CliError(f"archive: {err.message}") from err


DSN_OPTION = click.option("--dsn", default=None, envvar=None, metavar="DSN",
                          help="PostgreSQL connection string (default: $REVERSI_ARCHIVE_DSN, else libpq's settings).")


@archive.command("list", help="Archived Runs of the namespace (or all), newest first: filter by name, principal "
                              "(the agent), tool (a step of it) and creation time.")
@click.option("-A", "--all-namespaces", is_flag=True, help="Runs of every namespace.")
@click.option("--run", "run_name", default=None, help="The Run's name.")
@click.option("--principal", default=None, help="Who created the run, e.g. system:serviceaccount:agents:checkout.")
@click.option("--tool", default=None, help="Runs with a step of this tool.")
@click.option("--since", default=None, metavar="TIME", help="Created at or after (RFC 3339: 2026-01-31T00:00:00Z).")
@click.option("--until", default=None, metavar="TIME", help="Created before (RFC 3339).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10000), help="Most rows.")
@DSN_OPTION
@output_option(*formats.FORMATS, what="the archived Runs: json and yaml as {runs: [{namespace, name, uid, "
               "principal, actor, steps, writes, createdAt, lastActivity, archivedAt, deletedReason}]}, name as "
               "run.reversi.dev/NAME, wide with the count of writes")
@global_options
def archive_list(all_namespaces: bool, run_name: str | None, principal: str | None, tool: str | None,
                 since: str | None, until: str | None, limit: int, dsn: str | None, output: str | None) -> int:
    fmt = output_of(output)
    bounds = {}
    for flag, value in (("--since", since), ("--until", until)):
        moment = views.parse_time(value) if value else None
        if value and moment is None:
            raise click.UsageError(f"{flag} {value!r} is not an RFC 3339 time such as 2026-01-31T00:00:00Z")
        bounds[flag] = moment
    store = _archive(dsn)
    namespace = None if all_namespaces else _archive_namespace()
    found = _archive_call(lambda: store.runs(namespace=namespace, name=run_name, principal=principal, tool=tool,
                                             since=bounds["--since"], until=bounds["--until"], limit=limit))
    if fmt in formats.DOCUMENT_FORMATS:
        print_document({"runs": [views.archive_doc(r) for r in found]}, fmt)
        return 0
    if not found:
        remark(f"no archived Run matches (namespace {namespace or 'any'})")
        return 0
    if fmt == "name":
        out(formats.names("Run", [r.name for r in found]))
        return 0
    out(views.archive_rows(found, now(), all_namespaces, wide=fmt == "wide"))
    return 0


@archive.command("show", help="An archived Run: who ran it, who did what, its steps, and the report of each of its "
                              "RollbackRequests as describe printed it. RUN is a name (its newest archived Run of "
                              "that name) or a uid. --export prints the record as kubectl reversi export did.")
@click.argument("run")
@click.option("--export", "as_export", is_flag=True, help="JSON lines, as kubectl reversi export (no transitions).")
@DSN_OPTION
@output_option(*formats.FORMATS, what="the archived Run: json and yaml as {run, steps, requests, actions, "
               "deletedReason, lastActivity} (the objects as the API served them), name as run.reversi.dev/NAME, "
               "wide with each step's dependencies and resolution")
@global_options
def archive_show(run: str, as_export: bool, dsn: str | None, output: str | None) -> int:
    fmt = output_of(output)
    if as_export and fmt:
        raise click.UsageError("--export prints JSON lines; give it or -o, not both")
    store = _archive(dsn)
    uid = run
    if not _looks_like_uid(run):
        namespace = _archive_namespace()
        found = _archive_call(lambda: store.runs(namespace=namespace, name=run, limit=1))
        if not found:
            raise CliError(f"no archived Run {namespace}/{run}; kubectl reversi archive list -n {namespace} lists them")
        uid = found[0].uid
    record = _archive_call(lambda: store.record(uid))
    if record is None:
        raise CliError(f"no archived Run with uid {uid}")
    if as_export:
        for item in views.export_records(record.run, record.steps, [], inline=False):
            out(views.json_line(item))
    elif fmt in formats.DOCUMENT_FORMATS:
        print_document(views.archived_run_doc(record), fmt)
    elif fmt == "name":
        out(formats.object_name("Run", record.name))
    else:
        out(views.archived_run(record, now(), wide=fmt == "wide"))
    return 0


def _looks_like_uid(text: str) -> bool:
    parts = text.split("-")
    return len(parts) == 5 and all(p and all(c in string.hexdigits for c in p) for p in parts)


# -------------------------------------------------------------------------------------- main


# ---------------------------------------------------------------------------------- kube-manifest


@cli.command("kube-manifest", help="Print a ToolManifest of the built-in Kubernetes family (YAML): the tools "
                                   "kube.create, kube.apply, kube.patch, kube.scale and kube.delete, undone and read "
                                   "back by reversi-kube-runner from the operator's image, and the irreversible ones "
                                   "with their residue. Apply it, then record with rec.kube "
                                   "(docs/concepts.md#built-in-kubernetes-compensation).")
@click.option("--name", default="kube", show_default=True, help="The ToolManifest's name.")
@click.option("--image", required=True, help="The operator's image (the runner runs reversi-kube-runner from it).")
@click.option("--service-account", required=True,
              help="The ServiceAccount the runner's Jobs run as: the namespace's owner grants it the rights "
                   "(docs/operations.md#the-kube-runners-rights).")
@click.option("--runner", "runner_name", default="kube", show_default=True, help="The runner's name.")
@click.option("--command", "command_line", default="reversi-kube-runner", show_default=True,
              help="The runner's command (split like a shell). On the local control plane's node agent, which "
                   "ignores images and runs commands on the host: \"python3 -m reversi.entrypoints.kube_runner\".")
@global_options
def kube_manifest(name: str, image: str, service_account: str, runner_name: str, command_line: str) -> int:
    import shlex

    import yaml

    from ..engine import kube

    namespace = click.get_current_context().meta.get(_META, {}).get("namespace")
    manifest = {"apiVersion": "reversi.dev/v1alpha1", "kind": "ToolManifest",
                "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
                "spec": {"runners": [kube.runner_entry(image, service_account, runner_name,
                                                       command=shlex.split(command_line) or None)],
                         "tools": kube.manifest_tools(runner_name)}}
    out(yaml.safe_dump(manifest, sort_keys=False).rstrip())
    return 0


# --------------------------------------------------------------------------------------- version


@cli.command(help="This plugin's version and schema version, and the schema version of each installed CRD. "
                  "Exit 2 when an installed CRD is missing or older (the operator then reconciles nothing).")
@output_option(*formats.DOCUMENT_FORMATS, what="the versions (as kubectl version -o does): "
               "{version, schemaVersion, crds, current, problems}")
@click.option("--client", "client_only", is_flag=True,
              help="Only this plugin's version and schema version: no cluster is read.")
@global_options
def version(output: str | None, client_only: bool) -> int:
    fmt = output_of(output)
    from .. import __version__ as mine
    from .. import schema
    from ..adapters.kube import read_crds
    from ..models.common import SCHEMA_VERSION

    if client_only:
        if fmt:
            print_document({"version": mine, "schemaVersion": SCHEMA_VERSION}, fmt)
        else:
            out(f"kubectl-reversi {mine}, operator schema version {SCHEMA_VERSION}")
        return 0
    c = conn()
    try:
        result = schema.check(read_crds(c.api, schema.CRD_NAMES))
    except ApiException as err:
        raise CliError(f"cannot read the CRDs ({err.status} {err.reason}): reading "
                       "customresourcedefinitions needs the RBAC verb get") from err
    if fmt:
        print_document({"version": mine, "schemaVersion": result.wanted, "crds": result.installed,
                        "current": result.ok, "problems": list(result.problems)}, fmt)
    else:
        out(f"kubectl-reversi {mine}, operator schema version {result.wanted}")
        out("installed CRDs:")
        for name, have in result.installed.items():
            shown = "not installed" if have is None else (f"schema version {have}" if have else "no schema version")
            out(f"  {name:<30} {shown}")
        out(result.summary())
    return 0 if result.ok else 2


# ----------------------------------------------------------------------- logs and completion

cli.add_command(logs_command)
cli.add_command(completion_command)


def main(argv: list[str] | None = None) -> None:
    """Run the plugin; exit 0, 1 (an error, one line on stderr) or 2 (not fully undone). With
    click's completion variable set (the ``completion`` scripts set it) it prints candidates."""
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    try:
        code = cli.main(args=argv, prog_name="kubectl reversi", complete_var=COMPLETE_VAR, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as err:
        click.echo(err.ctx.get_help() if err.ctx else str(err))
        code = 0
    except click.UsageError as err:
        where = err.ctx.command_path if err.ctx else "kubectl reversi"
        message = " ".join(err.format_message().split()).rstrip(".")  # click lists choices on lines of their own
        click.echo(f"error: {message}; see {where} --help", err=True)
        code = 1
    except click.ClickException as err:
        click.echo(f"error: {err.format_message()}", err=True)
        code = 1
    except click.Abort:
        click.echo("error: interrupted (anything already created goes on in the cluster)", err=True)
        code = 1
    except CliError as err:
        click.echo(f"error: {err}", err=True)
        code = 1
    except ApiException as err:
        click.echo(f"error: the API server answered {err.status} {err.reason}: {server_message(err)}", err=True)
        code = 1
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 1
    except ImportError as err:  # an optional extra not installed
        click.echo(f"error: {missing_module(err)}", err=True)
        code = 1
    except Exception as err:  # noqa: BLE001 - every error is one line: connection failures come in many types
        click.echo(f"error: {_unexpected(err)}", err=True)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)


def _unexpected(err: Exception) -> str:
    """One line for an exception no command expected: a connection failure names the server and
    the fix; anything else is a bug, shown whole only with ``REVERSI_DEBUG=1``."""
    if _is_connection_error(err):
        host = _server()
        return (f"cannot reach the API server{f' at {host}' if host else ''}: {_short(err)}; "
                "check --kubeconfig and --context, and that the cluster is up (kubectl cluster-info)")
    if os.environ.get("REVERSI_DEBUG") == "1":
        raise err
    return (f"unexpected {type(err).__name__}: {_short(err)} (a bug of kubectl reversi; "
            "REVERSI_DEBUG=1 shows where)")


def _is_connection_error(err: BaseException) -> bool:
    import urllib3.exceptions

    return isinstance(err, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def _short(err: BaseException) -> str:
    reason = getattr(err, "reason", None) or err
    text = str(reason)
    if "Connection refused" in text:
        return "connection refused"
    return text.splitlines()[0][:200]


def _server() -> str | None:
    return _server_seen[-1] if _server_seen else None


if __name__ == "__main__":
    main()
