"""``kubectl reversi`` without a cluster: exit codes and one-line errors for bad input, the local
checks of resolve and approve, request names, kubeconfig and context selection."""

from __future__ import annotations

import re

import pytest
import yaml

from reversi.cli import main as plugin
from reversi.cli.api import CliError, connect


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        plugin.main(list(argv))
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


def single_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def kubeconfig(tmp_path):
    """A kubeconfig whose server is unreachable, with two contexts (one names a namespace)."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "plain",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "plain", "context": {"cluster": "c", "user": "u"}},
                     {"name": "shop", "context": {"cluster": "c", "user": "u", "namespace": "shop"}}],
    }
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# ------------------------------------------------------------------------- usage and errors


def test_help_exits_0(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "plan" in out and "kill-switch" in out and "Exit codes" in out


def test_a_usage_error_is_one_line_and_exit_1_not_2(capsys):
    code, _, err = run(capsys, "plan")
    assert code == 1
    assert single_error(err) == "error: Missing argument 'RUN'; see kubectl reversi plan --help"
    code, _, err = run(capsys, "rollback", "r", "--retries", "11")
    assert code == 1 and "--retries" in single_error(err)


def test_approve_needs_step_or_all_and_not_both(capsys):
    code, _, err = run(capsys, "approve", "undo-1")
    assert code == 1 and "--step N (repeatable) or --all" in single_error(err)
    code, _, err = run(capsys, "approve", "undo-1", "--step", "1", "--all")
    assert code == 1 and "not both" in single_error(err)


def test_halt_namespace_glob_needs_cluster(capsys):
    code, _, err = run(capsys, "halt", "add", "h", "--reason", "r", "--namespace-glob", "shop-*")
    assert code == 1 and "--namespace-glob needs --cluster" in single_error(err)


def test_resolve_checks_its_input_before_calling_anything(capsys):
    code, _, err = run(capsys, "resolve", "r", "1", "--status", "succeeded", "--note", " ")
    assert code == 1 and "--note is empty" in single_error(err)
    code, _, err = run(capsys, "resolve", "r", "1", "--status", "succeeded", "--note", "n", "--result", "[1]")
    assert code == 1 and "--result must be a JSON object" in single_error(err)
    code, _, err = run(capsys, "resolve", "r", "1", "--status", "maybe", "--note", "n")
    assert code == 1 and "'maybe' is not one of 'succeeded', 'failed'" in single_error(err)


def test_a_missing_kubeconfig_names_the_flag(capsys, tmp_path):
    code, _, err = run(capsys, "--kubeconfig", str(tmp_path / "none.yaml"), "plan", "r")
    assert code == 1
    assert single_error(err) == (f"error: kubeconfig {tmp_path / 'none.yaml'} not found; "
                                 "pass an existing file to --kubeconfig")


def test_an_unreachable_server_is_one_line(capsys, kubeconfig):
    code, _, err = run(capsys, "--kubeconfig", str(kubeconfig), "plan", "r")
    assert code == 1
    line = single_error(err)
    assert line.startswith("error: cannot reach the API server at https://127.0.0.1:1") and "--context" in line


# ------------------------------------------------------------------------------ connection


def test_namespace_is_the_flag_else_the_contexts_else_default(kubeconfig):
    assert connect(str(kubeconfig), None, None).namespace == "default"
    assert connect(str(kubeconfig), "shop", None).namespace == "shop"
    assert connect(str(kubeconfig), "shop", "billing").namespace == "billing"
    assert connect(str(kubeconfig), "shop", None).context == "shop"


def test_an_unknown_context_lists_the_known_ones(kubeconfig):
    with pytest.raises(CliError) as err:
        connect(str(kubeconfig), "prod", None)
    assert "context prod not found" in str(err.value) and "plain, shop" in str(err.value)


# --------------------------------------------------------------------------- local checks


def test_request_name_is_run_undo_random_and_fits():
    name = plugin.request_name("order-9")
    assert re.fullmatch(r"order-9-undo-[a-z0-9]{5}", name)
    assert len(plugin.request_name("x" * 253)) == 253


def runstep(index: int, tool: str, outcome: str, resolution: dict | None = None) -> dict:
    spec = {"index": index, "tool": tool, "outcome": outcome, "runRef": {"name": "r"}}
    if resolution:
        spec["resolution"] = resolution
    return {"metadata": {"name": f"r-{index:05d}", "resourceVersion": "7"}, "spec": spec}


STEPS = [runstep(0, "pay.charge", "succeeded"), runstep(1, "pay.capture", "uncertain"),
         runstep(2, "pay.capture", "intended", {"status": "failed", "note": "never sent", "actor": "alice"})]


def test_check_resolution_accepts_an_unresolved_uncertain_step():
    plugin.check_resolution(STEPS[1], "Run shop/r", 1)


@pytest.mark.parametrize(("step", "message"), [
    (0, "step 0 (pay.charge) of Run shop/r has outcome succeeded: only intended or uncertain steps are resolved"),
    (2, "step 2 of Run shop/r is already resolved as failed by alice ('never sent'); a resolution cannot be changed"),
])
def test_check_resolution_refuses(step, message):
    with pytest.raises(CliError) as err:
        plugin.check_resolution(STEPS[step], "Run shop/r", step)
    assert message in str(err.value)


def test_a_missing_step_names_its_runstep_and_how_to_list_the_steps():
    run = {"metadata": {"name": "r"}, "spec": {}}
    assert str(plugin.missing_step(run, "shop", 5)) == (
        "Run shop/r has no step 5 (no RunStep shop/r-00005); see its steps with "
        "kubectl get runsteps -l reversi.dev/run=r -n shop")


def test_a_step_still_inline_in_a_run_of_0_1_waits_for_the_operator():
    run = {"metadata": {"name": "r"}, "spec": {"steps": [{"index": 0, "tool": "pay.charge", "outcome": "uncertain"}]}}
    text = str(plugin.missing_step(run, "shop", 0))
    assert "still inline in the Run (recorded by Reversi 0.1)" in text and "RunStep r-00000" in text


def test_resolve_refuses_a_step_beyond_the_largest_run_before_calling_anything(capsys):
    code, _, err = run(capsys, "resolve", "r", "100000", "--status", "failed", "--note", "n")
    assert code == 1 and "0<=x<=99999" in single_error(err)
    code, _, err = run(capsys, "resolve", "R!", "1", "--status", "failed", "--note", "n")
    assert code == 1 and "'R!' is not a valid Run name" in single_error(err)


def _req(phase="AwaitingApproval", dry_run=False, actions=None, omitted=0):
    status = {"phase": phase}
    if actions is not None:
        status["plan"] = {"fullyReversible": True, "actions": actions, "omitted": omitted}
    return {"metadata": {"name": "undo"}, "spec": {"runRef": {"name": "r"}, "dryRun": dry_run}, "status": status}


ACTIONS = [{"step": 0, "kind": "compensate", "needsApproval": False, "reason": "undo with refund"},
           {"step": 1, "kind": "compensate", "needsApproval": True}]


def test_check_approval_accepts_a_step_that_needs_it_and_a_request_not_yet_planned():
    plugin.check_approval(_req(actions=ACTIONS), "shop", (1,))
    plugin.check_approval(_req(phase=None), "shop", (7,))


@pytest.mark.parametrize(("req", "steps", "message"), [
    (_req(dry_run=True), (1,), "is a dry run"),
    (_req(phase="Incomplete"), (1,), "has ended (Incomplete): approving it changes nothing"),
    (_req(actions=ACTIONS), (0,),
     "step 0 of RollbackRequest shop/undo needs no approval (compensate: undo with refund)"),
    (_req(actions=ACTIONS), (4,), "has no step 4 in its plan"),
])
def test_check_approval_refuses(req, steps, message):
    with pytest.raises(CliError) as err:
        plugin.check_approval(req, "shop", steps)
    assert message in str(err.value)


def test_check_approval_cannot_tell_for_steps_left_out_of_a_compacted_plan():
    plugin.check_approval(_req(actions=ACTIONS, omitted=100), "shop", (4,))


def test_halt_body_is_a_halt_with_namespace_or_a_cluster_halt():
    body = plugin.halt_body("h", "shop", "why", "alice", {"tool": "pay.*"})
    assert body == {"apiVersion": "reversi.dev/v1alpha1", "kind": "Halt",
                    "metadata": {"name": "h", "namespace": "shop"},
                    "spec": {"reason": "why", "by": "alice", "scope": {"tool": "pay.*"}}}
    body = plugin.halt_body("reversi-kill-switch", None, "stop", None, {})
    assert body == {"apiVersion": "reversi.dev/v1alpha1", "kind": "ClusterHalt",
                    "metadata": {"name": "reversi-kill-switch"}, "spec": {"reason": "stop"}}


# ------------------------------------------------------------------------- conflict retries


def _api_error(status: int, message: str, details: dict | None = None):
    import json

    from kubernetes.client.rest import ApiException

    err = ApiException(status=status, reason="x")
    err.body = json.dumps({"kind": "Status", "message": message, "details": details or {}, "code": status})
    return err


def test_retry_conflicts_retries_a_lost_race_then_succeeds():
    from reversi.cli.api import PATCH_NOT_APPLICABLE, retry_conflicts

    calls = []

    def action():
        calls.append(1)
        if len(calls) < 3:
            raise _api_error(422 if len(calls) == 1 else 409, PATCH_NOT_APPLICABLE)
        return "done"

    assert retry_conflicts(action, "resolving") == "done" and len(calls) == 3


def test_retry_conflicts_passes_a_refusal_through_at_once_and_gives_up_on_endless_races():
    from kubernetes.client.rest import ApiException

    from reversi.cli.api import PATCH_NOT_APPLICABLE, retry_conflicts

    calls = []

    def refused():
        calls.append(1)
        raise _api_error(422, 'admission webhook "validate-run.reversi.dev" denied the request: a note is required')

    with pytest.raises(ApiException):
        retry_conflicts(refused, "resolving")
    assert len(calls) == 1

    def racing():
        raise _api_error(422, PATCH_NOT_APPLICABLE)

    with pytest.raises(CliError) as err:
        retry_conflicts(racing, "resolving step 1 of Run shop/r", attempts=2)
    assert str(err.value) == "resolving step 1 of Run shop/r: the object kept changing; try again"


def test_describe_of_a_request_waiting_for_its_run_says_so_not_that_the_operator_is_down():
    from reversi.cli.views import next_steps

    waiting = {"metadata": {"name": "undo", "namespace": "shop"}, "spec": {"runRef": {"name": "ghost"}},
               "status": {"phase": "Pending", "conditions": [
                   {"type": "Planned", "status": "False", "reason": "RunNotFound",
                    "message": "RollbackRequest shop/undo: Run shop/ghost not found; waiting for it to be created"}]}}
    lines = next_steps(waiting, None)
    assert "waits for the Run" in lines[0] and "shop/ghost not found" in lines[0]
    assert "kubectl get runs -n shop" in lines[1]
    assert not any("reversi-operator is running" in line for line in lines)
    fresh = {"metadata": {"name": "undo", "namespace": "shop"}, "spec": {"runRef": {"name": "r"}}, "status": {}}
    assert "reversi-operator is running" in next_steps(fresh, None)[0]


def test_an_incomplete_request_says_how_to_accept_its_residue_until_it_is_accepted():
    from reversi.cli.views import next_steps

    request = {"metadata": {"name": "undo", "namespace": "shop"}, "spec": {"runRef": {"name": "r"}},
               "status": {"phase": "Incomplete", "report": {"unrecoverable": [{"step": 0, "reason": "irreversible"}]}}}
    run = {"metadata": {"name": "r"}, "spec": {}, "status": {
        "lastRequest": "undo", "conditions": [{"type": "RolledBack", "status": "False"}]}}
    lines = next_steps(request, run)
    assert any("kubectl reversi acknowledge r --note TEXT -n shop" in line for line in lines), lines
    run["spec"]["acknowledgement"] = {"note": "told them", "actor": "lead", "request": "undo"}
    assert not any("acknowledge" in line for line in next_steps(request, run))


def test_version_client_reads_no_cluster(capsys, tmp_path, monkeypatch):
    """``version --client`` answers with no cluster at all (no kubeconfig: nothing is read)."""
    import json

    from reversi.models.common import SCHEMA_VERSION

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    code, out, err = run(capsys, "version", "--client")
    assert code == 0 and err == "" and f"operator schema version {SCHEMA_VERSION}" in out
    code, out, _ = run(capsys, "version", "--client", "--json")
    assert code == 0 and json.loads(out)["schemaVersion"] == SCHEMA_VERSION


def test_a_missing_choice_is_one_line_that_lists_the_choices(capsys):
    code, _out, err = run(capsys, "completion")
    assert code == 1
    assert single_error(err) == ("error: Missing argument '{bash|zsh|fish}'. Choose from: bash, zsh, fish; see "
                                 "kubectl reversi completion --help")
