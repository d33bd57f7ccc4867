"""A RollbackRequest of a run with child runs (rule 17, docs/concepts.md#nested-runs): one lock over the
whole tree, children rolled back as units in causal order, one report with a section per run.

The order is :mod:`reversi.engine.nested_runs`'s. The request works on its own run with the per-run
machinery of :mod:`reversi.handlers.reconciler`, holding back the steps below the current
*floor* (the opening index of the next child not yet rolled back). When everything at or above
the floor is settled, the next child is rolled back as a unit by a RollbackRequest of its own,
named ``<request>-<child>-<hash>`` and owned by this one (its status holds the child's full report; a
child with children of its own does the same, recursively); then the floor moves down.

- **Lock.** Taking the lock takes it on every Run of the tree (the request's run and every run
  below it, listed by the ``reversi.dev/root`` label): all or nothing; a run held by another live
  request makes this one wait. Every run is closed with it (``status.closedBy``). The runs are
  pinned in ``status.treeRuns`` and released together when the request ends. A child's own
  request works under this lock: it is accepted as the holder's when its controller owner is the
  holder (or is accepted so itself) and that owner's report names it.
- **Already recovered.** A child whose Run (and every run below it) says ``RolledBack=True`` (an
  earlier request undid it completely) is not rolled back again: its section is
  ``alreadyRecovered`` and no request, Job or compensator runs for it.
- **Cancel, deadline.** A child's request in flight is cancelled; children not started are
  ``cancelled`` in the report.
- **Report.** ``status.report`` stays the request's own run's (existing clients keep working);
  ``status.report.runs`` has a section per run (the own run first, then the runs below it in the
  order they are rolled back), and ``status.report.complete`` is true only when every section is.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

from .. import conditions as cond
from ..adapters.kube import Kube, api_message
from ..adapters import run_tree as tree_io
from ..engine import nested_runs as rules
from ..engine.report import report_message
from ..models.rollbackrequest import TERMINAL_PHASES, Report, RollbackRequestSpec
from ..models.run import MAX_RUN_DEPTH

log = logging.getLogger("reversi.rollback")

REQUESTS, RUNS = "rollbackrequests", "runs"
#: annotation of a child run's RollbackRequest: the request of its parent run that made it
ANNOTATION_TREE_REQUEST = "reversi.dev/tree-request"
MAX_REQUEST_NAME = 253
#: fields of a request copied to the requests of its child runs (approvals, denials, force and
#: approveCompensations name steps of one run or need the caller's RBAC verbs: not copied)
COPIED = ("retries", "backoff", "parallelism", "verify_command", "require_verification", "deadline_seconds",
          "compensation_deadline_seconds")


def child_request_name(request: str, run: str) -> str:
    """The deterministic name of the RollbackRequest of child run ``run`` made by ``request``:
    ``<request>-<run>-<5 hex of a hash of both>`` (so a request a person named ``<request>-<run>``
    is not taken for it), the request's name shortened when the whole is over 253 characters."""
    digest = hashlib.sha256(f"{request}/{run}".encode()).hexdigest()[:5]
    keep = MAX_REQUEST_NAME - len(run) - len(digest) - 2
    return f"{request[:keep]}-{run}-{digest}"


def child_request(req: dict, spec: RollbackRequestSpec, run: str) -> dict:
    """The RollbackRequest of child run ``run`` (pure): owned by ``req`` (deleted with it), the
    settings of ``spec`` that apply to any run (:data:`COPIED`)."""
    meta = req["metadata"]
    wire = spec.model_copy(update={"run_ref": spec.run_ref.model_copy(update={"name": run})}).model_dump(
        mode="json", by_alias=True, exclude_none=True, include={"run_ref", *COPIED})
    return {
        "apiVersion": "reversi.dev/v1alpha1", "kind": "RollbackRequest",
        "metadata": {"name": child_request_name(meta["name"], run), "namespace": meta["namespace"],
                     "annotations": {ANNOTATION_TREE_REQUEST: meta["name"]},
                     "ownerReferences": [{"apiVersion": "reversi.dev/v1alpha1", "kind": "RollbackRequest",
                                          "name": meta["name"], "uid": meta["uid"], "controller": True}]},
        "spec": wire,
    }


def section(node: rules.Node, **values: Any) -> dict[str, Any]:
    """A run section of the report (wire form) for a run below the request's run."""
    out: dict[str, Any] = {"run": node.name, "parent": node.parent, "opened": node.opened, "outcome": "pending",
                           "complete": False, "compensated": 0, "failed": 0}
    out.update(values)
    return {k: v for k, v in out.items() if v is not None}


def counts(report: dict | None) -> dict[str, int]:
    """``compensated`` and ``failed`` counts of a report (wire form)."""
    report = report or {}
    return {"compensated": len(report.get("compensated") or []), "failed": len(report.get("failed") or [])}


@dataclass
class TreePass:
    """What one pass knows of the tree below the request's run."""

    run: str
    nodes: list[rules.Node]
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def tree(self) -> dict[str, list[rules.Node]]:
        return rules.subtree(self.nodes, self.run)

    @property
    def children(self) -> list[rules.Node]:
        return list(self.tree.get(self.run, []))

    def done(self) -> set[str]:
        return {n for n, s in self.sections.items() if s.get("outcome") in rules.DONE_OUTCOMES}

    @property
    def floor(self) -> int:
        return rules.floor(self.children, self.done())

    @property
    def next(self) -> rules.Node | None:
        return rules.next_child(self.children, self.done())

    def ordered(self) -> list[dict[str, Any]]:
        """The sections of the runs below, in rollback order."""
        return [self.sections.get(n.name) or section(n) for n in rules.descendants(self.tree, self.run)]

    def complete(self) -> bool:
        return rules.tree_complete(True, self.ordered())


class TreeRollback:
    """The tree part of :class:`reversi.handlers.reconciler.Reconciler` (a mixin: it uses the
    reconciler's ``kube``, ``_lock`` and ``_release``)."""

    kube: Kube

    def _lock(self, run_obj: dict, name: str, ns: str) -> bool:  # pragma: no cover - the Reconciler's
        raise NotImplementedError

    def _release(self, ns: str, run_name: str, name: str, complete: bool, deleted: bool = False, *,
                 stopped: bool = False, writers: frozenset[str] = frozenset()) -> None:
        raise NotImplementedError  # pragma: no cover - the Reconciler's

    # ------------------------------------------------------------------------------ the lock

    def _held_for(self, req: dict, run_obj: dict, hops: int = 0) -> bool:
        """Whether ``req`` is a child run's request working under the lock its tree's request
        holds on ``run_obj``: its controller owner is the holder (or is accepted so itself, at
        most 8 hops up) and that owner's report names ``req`` as the request of a run."""
        holder = (run_obj.get("status") or {}).get("activeRequest")
        meta = req["metadata"]
        if not holder or holder == meta["name"] or hops >= MAX_RUN_DEPTH:
            return False
        owner = next((o for o in meta.get("ownerReferences") or []
                      if o.get("controller") and o.get("kind") == "RollbackRequest"), None)
        if owner is None:
            return False
        parent = self.kube.get(REQUESTS, meta["namespace"], owner["name"])
        if parent is None or parent["metadata"].get("uid") != owner.get("uid"):
            return False
        runs = (((parent.get("status") or {}).get("report") or {}).get("runs")) or []
        if not any(s.get("request") == meta["name"] for s in runs):
            return False
        return parent["metadata"]["name"] == holder or self._held_for(parent, run_obj, hops + 1)

    def _lock_tree(self, req: dict, run_obj: dict, status: dict) -> tuple[str, str] | None:
        """Take the lock of the request's run and of every run below it, all or nothing (pins
        ``status.treeRuns``): None when held, else ``(run, holder)`` — the run another live request
        (or a concurrent write) keeps it from taking, so the request waits. A child run's own
        request takes nothing: its tree's request holds the lock for it."""
        meta = req["metadata"]
        ns, name = meta["namespace"], meta["name"]
        held_for = self._held_for(req, run_obj)
        pinned = status.get("treeRuns")
        if pinned is not None and (held_for or (run_obj.get("status") or {}).get("activeRequest") == name):
            return None
        nodes = [n for n in tree_io.tree_nodes(self.kube, ns, run_obj) if n.name != run_obj["metadata"]["name"]]
        below = rules.descendants(rules.subtree(nodes, run_obj["metadata"]["name"]), run_obj["metadata"]["name"])
        entries = [{"run": n.name, "parent": n.parent, "opened": n.opened, "created": n.created or None}
                   for n in below]
        if held_for:
            status["treeRuns"] = [{k: v for k, v in e.items() if v is not None} for e in entries]
            return None
        objs = [o for o in (self.kube.get(RUNS, ns, n.name) for n in below) if o is not None]
        for obj in [*objs, run_obj]:  # a run held by another live request: wait, taking nothing
            holder = (obj.get("status") or {}).get("activeRequest")
            if holder and holder != name and self._live(ns, holder):
                return obj["metadata"]["name"], holder
        taken: list[str] = []
        for obj in [*objs, run_obj]:
            if not self._lock(obj, name, ns):
                for run in taken:  # all or nothing
                    self._unlock(ns, run, name)
                return obj["metadata"]["name"], (obj.get("status") or {}).get("activeRequest") or "another request"
            if obj is not run_obj and (obj.get("status") or {}).get("activeRequest") != name:
                taken.append(obj["metadata"]["name"])
        status["treeRuns"] = [{k: v for k, v in e.items() if v is not None} for e in entries]
        return None

    def _live(self, ns: str, request: str) -> bool:
        other = self.kube.get(REQUESTS, ns, request)
        return (other is not None and (other.get("status") or {}).get("phase") not in TERMINAL_PHASES
                and not other["metadata"].get("deletionTimestamp"))

    def _unlock(self, ns: str, run: str, name: str) -> None:
        """Give back a run's lock taken in a tree lock that could not be completed (its RolledBack
        condition is left as it was)."""
        obj = self.kube.get(RUNS, ns, run)
        if obj is None or (obj.get("status") or {}).get("activeRequest") != name:
            return
        gen = obj["metadata"].get("generation")
        conds = cond.set_condition((obj.get("status") or {}).get("conditions") or [], cond.condition(
            cond.LOCKED, cond.FALSE, cond.RELEASED, f"RollbackRequest {name} could not lock the whole tree; it waits",
            gen))
        self.kube.merge_status(RUNS, ns, run, {"activeRequest": None, "conditions": conds})

    # ------------------------------------------------------------------------------ the pass

    def _tree_pass(self, req: dict, status: dict) -> TreePass | None:
        """The tree below the request's run as pinned at the lock, with the sections so far; None
        for a run with no children (or before the lock)."""
        pinned = status.get("treeRuns")
        if not pinned:
            return None
        run = ((req.get("spec") or {}).get("runRef") or {}).get("name", "")
        nodes = [rules.Node(e["run"], e.get("parent"), e.get("opened") or 0, e.get("created") or "") for e in pinned]
        old = (((req.get("status") or {}).get("report") or {}).get("runs")) or []
        return TreePass(run, nodes, {s["run"]: dict(s) for s in old[1:] if isinstance(s, dict) and s.get("run")})

    def _drive_tree(self, req: dict, spec: RollbackRequestSpec, tp: TreePass, segment_done: bool,
                    stopping: str | None) -> None:
        """Move the children on: when the request's own steps at or above the floor are settled
        (``segment_done``), roll back the next child as a unit (``alreadyRecovered`` when an earlier
        request rolled it back completely, else by its own request); settle a child whose request
        ended. With ``stopping`` (cancel, deadline): cancel a child's request in flight, and mark
        the children not started ``cancelled``."""
        for child in rules.children_order(tp.children):
            sec = tp.sections.get(child.name) or section(child)
            tp.sections[child.name] = sec
            if sec.get("outcome") in rules.DONE_OUTCOMES:
                continue
            if sec.get("request"):
                self._follow_child(req, tp, child, sec, stopping)
                return  # one child at a time
            if stopping:
                for n in [child, *rules.descendants(tp.tree, child.name)]:
                    tp.sections[n.name] = section(n, outcome="cancelled", message=f"not started: {stopping}")
                continue
            if not segment_done:
                return
            self._start_child(req, spec, tp, child)
            return

    def _start_child(self, req: dict, spec: RollbackRequestSpec, tp: TreePass, child: rules.Node) -> None:
        ns, name = req["metadata"]["namespace"], req["metadata"]["name"]
        unit = [child, *rules.descendants(tp.tree, child.name)]
        if all(self._rolled_back(ns, n.name) for n in unit):
            for n in unit:
                tp.sections[n.name] = section(n, outcome="alreadyRecovered", complete=True,
                                              message="rolled back completely by an earlier request: nothing ran again")
            return
        body = child_request(req, spec, child.name)
        sub = body["metadata"]["name"]
        tp.sections[child.name] = section(child, outcome="running", request=sub)
        # the report names the child's request before it exists: that is what lets it work under this lock
        self.kube.merge_status(REQUESTS, ns, name, {"report": {"runs": self._sections_so_far(req, tp)}})
        try:
            created = self.kube.create(REQUESTS, ns, body)
        except ApiException as err:
            self._child_refused(req, tp, child, sub, err)
            return
        if created:
            self.kube.event(req, "ChildRollbackStarted", f"rolling back child Run {ns}/{child.name} (opened at step "
                            f"{child.opened}) as one unit: RollbackRequest {ns}/{sub}")

    def _child_refused(self, req: dict, tp: TreePass, child: rules.Node, sub: str, err: ApiException) -> None:
        """The API server refused to create the child's RollbackRequest ``sub``. When it could not
        answer (5xx, such as an admission webhook no replica answers, or 429), the child has not
        started: its section goes back to not started, and ``err`` is raised again, so the pass is
        tried again (with backoff, saying so on the request after three failures) and starts the
        child once the API server takes the request (docs/guarantees.md#webhook). A refusal for good
        (4xx) ends the child's section ``incomplete`` with the API server's message. Raises ``err``."""
        ns, name = req["metadata"]["namespace"], req["metadata"]["name"]
        if err.status >= 500 or err.status == 429:
            tp.sections[child.name] = section(child)
            self.kube.merge_status(REQUESTS, ns, name, {"report": {"runs": self._sections_so_far(req, tp)}})
            raise err
        tp.sections[child.name] = section(child, outcome="incomplete", message=(
            f"the API server refused RollbackRequest {sub}: {api_message(err)}; the child run was not rolled back"))
        self.kube.event(req, "ChildRollbackRefused", tp.sections[child.name]["message"], warning=True)

    def _follow_child(self, req: dict, tp: TreePass, child: rules.Node, sec: dict, stopping: str | None) -> None:
        ns = req["metadata"]["namespace"]
        sub = self.kube.get(REQUESTS, ns, sec["request"])
        if sub is None:
            tp.sections[child.name] = section(child, request=sec["request"], outcome="incomplete",
                                              message=f"RollbackRequest {sec['request']} was deleted before it ended")
            return
        owners = [o.get("uid") for o in sub["metadata"].get("ownerReferences") or [] if o.get("controller")]
        if owners != [req["metadata"]["uid"]]:
            tp.sections[child.name] = section(child, outcome="incomplete", message=(
                f"a RollbackRequest {sec['request']} that this request did not make exists: the child run was not "
                "rolled back; delete or rename that request, then create a new request"))
            return
        sub_status = sub.get("status") or {}
        if sub_status.get("phase") not in TERMINAL_PHASES:
            if stopping and not (sub.get("spec") or {}).get("cancel"):
                self.kube.merge(REQUESTS, ns, sec["request"], {"spec": {"cancel": True}})
            return
        report = sub_status.get("report") or {}
        complete = bool(report.get("complete")) and sub_status.get("phase") == "Succeeded"
        done = cond.get_condition(sub_status.get("conditions"), cond.COMPLETE) or {}
        cancelled = done.get("reason") == cond.CANCELLED and not report.get("compensated")
        tp.sections[child.name] = section(child, request=sec["request"], complete=complete,
                                          outcome=rules.section_outcome(sub_status.get("phase"), complete, cancelled),
                                          message=done.get("message"), **counts(report))
        for grand in (report.get("runs") or [])[1:]:  # the child's own children, from its report
            if isinstance(grand, dict) and grand.get("run"):
                tp.sections[grand["run"]] = dict(grand)

    def _rolled_back(self, ns: str, run: str) -> bool:
        obj = self.kube.get(RUNS, ns, run) or {}
        rolled = cond.get_condition((obj.get("status") or {}).get("conditions"), cond.ROLLED_BACK) or {}
        return rolled.get("status") == cond.TRUE

    def _sections_so_far(self, req: dict, tp: TreePass) -> list[dict[str, Any]]:
        own = ((((req.get("status") or {}).get("report") or {}).get("runs")) or [None])[0]
        return [own or {"run": tp.run, "outcome": "running"}, *tp.ordered()]

    def _tree_sections(self, tp: TreePass, report: Report, own_complete: bool, finished: bool,
                       cancelled: bool) -> list[dict[str, Any]]:
        """``status.report.runs``: the request's own run first, then the runs below it."""
        if not finished:
            outcome = "running"
        else:
            outcome = "rolledBack" if own_complete else ("cancelled" if cancelled and not report.compensated
                                                         else "incomplete")
        own = {"run": tp.run, "outcome": outcome, "complete": own_complete, "compensated": len(report.compensated),
               "failed": len(report.failed), "message": report_message(report)}
        return [own, *tp.ordered()]

    def _release_tree(self, ns: str, name: str, status: dict, deleted: bool = False, stopped: bool = False) -> None:
        """Release every run below the request's run that it holds (pinned ``status.treeRuns``),
        each ``RolledBack`` as its section says and what stands from its journal (its undo
        entries are its child request's: docs/concepts.md#what-stands)."""
        sections = {s.get("run"): s for s in ((status.get("report") or {}).get("runs") or []) if isinstance(s, dict)}
        for entry in status.get("treeRuns") or []:
            run = entry.get("run")
            if run:
                sec = sections.get(run) or {}
                self._release(ns, run, name, complete=bool(sec.get("complete")), deleted=deleted, stopped=stopped,
                              writers=frozenset({child_request_name(name, run)} | ({sec["request"]}
                                                                                   if sec.get("request") else set())))

    def _release_tree_of(self, run_obj: dict, name: str) -> None:
        """A request deleted mid-way: release every run of its run's tree that still names it."""
        ns = run_obj["metadata"]["namespace"]
        for node in tree_io.tree_nodes(self.kube, ns, run_obj):
            obj = self.kube.get(RUNS, ns, node.name) or {}
            if (obj.get("status") or {}).get("activeRequest") == name:
                self._release(ns, node.name, name, complete=False, deleted=True)
