"""Pure rules of guard reads, forces and a Run gone after the lock (the cluster side:
tests/integration/test_cancel_delete_and_guards_misuse.py)."""

from __future__ import annotations

from reversi.adapters import jobs as jobs_mod
from reversi.adapters.jobs import guard_read


def _job(request_uid: str, step: int, attempt: int, role: str, read: int) -> dict[str, str]:
    return {jobs_mod.LABEL_REQUEST_UID: request_uid, jobs_mod.LABEL_STEP: str(step),
            jobs_mod.LABEL_ATTEMPT: str(attempt), jobs_mod.LABEL_ROLE: role, jobs_mod.LABEL_READ: str(read)}


def test_a_guard_read_is_the_requests_own_and_never_an_earlier_requests_answer():
    jobs = {"a-w0": _job("uid-a", 0, 1, "precondition", 0), "a-p0": _job("uid-a", 0, 1, "precheck", 0),
            "c-w1": _job("uid-c", 0, 1, "precondition", 1), "other-step": _job("uid-a", 1, 1, "precondition", 4),
            "other-attempt": _job("uid-a", 0, 2, "precondition", 7)}.values()
    jobs = list(jobs)
    assert guard_read([], "uid-b", 0, 1, "precondition") == 0  # nothing read yet
    assert guard_read(jobs, "uid-a", 0, 1, "precondition") == 0  # its own Job: adopted (an operator restart)
    assert guard_read(jobs, "uid-c", 0, 1, "precondition") == 1
    assert guard_read(jobs, "uid-b", 0, 1, "precondition") == 2  # a new request reads again, under a new name
    assert guard_read(jobs, "uid-b", 0, 1, "precheck") == 1
    assert guard_read(jobs, "uid-b", 1, 1, "precondition") == 5
    assert guard_read(jobs, "uid-b", 0, 3, "precondition") == 0


def test_a_force_must_name_a_step_whose_compensation_has_a_precondition():
    from reversi.engine import admission as rules
    from reversi.models.run import RunSpec

    comp = {"tool": "payments.void_capture", "kind": "inverse", "args": {}, "runner": "cli"}
    guarded = {"name": "payments.capture", "effect": "write", "compensation": {
        **comp, "precondition": {"tool": "payments.get_charge", "args": {}, "expect": {"refunded": False}}}}
    plain = {"name": "inventory.reserve", "effect": "write", "compensation": comp}
    spec = RunSpec.model_validate({"principal": "a", "mode": "enforce", "manifestRef": {"name": "m"}, "steps": [
        {"index": 0, "tool": "payments.capture", "args": {}, "outcome": "succeeded", "snapshot": guarded},
        {"index": 1, "tool": "inventory.reserve", "args": {}, "outcome": "succeeded", "snapshot": plain},
        {"index": 2, "tool": "email.send", "args": {}, "outcome": "succeeded"}]})
    assert rules.check_forces(spec, [0]) is None
    assert rules.check_forces(spec, [7]).message == "force of step 7: the run has no such step"
    for index in (1, 2):
        assert rules.check_forces(spec, [0, index]).message.startswith(
            f"force of step {index}: its compensation has no precondition")


def test_a_run_deleted_or_created_again_after_the_lock_is_gone_for_the_request():
    from reversi.handlers.reconciler import run_gone

    pinned = {"runSteps": 2, "startTime": "2026-01-01T10:00:05Z"}
    locked = {"metadata": {"creationTimestamp": "2026-01-01T10:00:00Z"}, "status": {"closedBy": "undo"}}
    assert run_gone(pinned, locked) is None
    # the Run's clock may run ahead of the operator's: a creation time after startTime is no sign
    assert run_gone(pinned, {**locked, "metadata": {"creationTimestamp": "2026-01-01T10:00:09Z"}}) is None
    assert run_gone(pinned, None) == "was deleted"
    assert run_gone(pinned, {"metadata": {"creationTimestamp": "2026-01-01T10:00:06Z"}}) == \
        "was deleted and created again"
    assert run_gone(pinned, {"metadata": {}, "status": {"activeRequest": None}}) == "was deleted and created again"
    # before the lock (no runSteps pinned) a missing or new Run is waited for, as before
    assert run_gone({"startTime": "2026-01-01T10:00:05Z"}, None) is None
    assert run_gone({}, {"metadata": {"creationTimestamp": "2026-01-01T10:00:06Z"}}) is None


def test_a_precheck_against_an_empty_expect_is_refused():
    from reversi.engine import admission as rules
    from reversi.models.toolmanifest import ToolManifestSpec

    def manifest(expect: dict, precheck: bool = True) -> ToolManifestSpec:
        return ToolManifestSpec.model_validate({
            "runners": [{"name": "cli", "image": "x", "command": ["x"]}],
            "tools": [{"name": "payments.create_charge", "effect": "write",
                       "compensation": {"tool": "payments.refund", "kind": "compensation", "args": {},
                                        "runner": "cli", "precheck": precheck},
                       "verification": {"tool": "payments.get_charge", "args": {}, "expect": expect,
                                        "runner": "cli"}}]})

    assert rules.check_guards(manifest({"refunded": True})) is None
    assert rules.check_guards(manifest({}, precheck=False)) is None
    refusal = rules.check_guards(manifest({}))
    assert refusal is not None and "never undone" in refusal.message
