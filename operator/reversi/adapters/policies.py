"""The admission policies the API server evaluates itself on a recorded call: pure builders of the
MutatingAdmissionPolicy and ValidatingAdmissionPolicies (``admissionregistration.k8s.io/v1``),
their bindings, and the glob-to-CEL translation of halt scopes
(docs/operations.md#admission-where-each-rule-is-enforced).

A RunStep create that carries ``spec.runAtOpen`` (what its recorder read of the Run at open) and
no ``snapshot`` or ``recordedAt`` is the **recorded call**: it crosses no webhook
(:data:`RECORDED_CALL` keeps ``mutate-runstep`` out of it). The API server then

- stamps it (:func:`stamp_policy`): ``spec.principal`` from the authenticated user, the
  ``reversi.dev/run`` label from ``spec.runRef.name``, and the Run as owner with the uid the
  recorder read (a step of a Run deleted since is collected with it, and its outcome write then
  fails with ``not found``, so the recorder reports it);
- refuses (:func:`record_policy`) a name that is not ``<run>-<index>``, a step recorded with a
  resolution, ``args`` past the ceiling, a Run name that cannot label its steps;
- refuses a call a Halt or ClusterHalt matches (:func:`halt_policy`: the halts are the policy's
  params, so a halt is in force within the API server's informer lag, with no operator and no
  admission replica running), matched on the tool and on the run's and its ancestors' scopes as
  the step carries them;
- refuses a step of a run that a rollback has locked (:func:`lock_policy`: the params are the
  namespace's ClosedRunSlices, one entry per locked run, written by the operator when it takes the
  lock; one map lookup per slice, whatever the number of closed runs).

Every other RunStep create (a client that sends no ``runAtOpen``, the operator's move of a
Reversi 0.1 journal) crosses ``mutate-runstep`` as before, which checks it against the Run.
"""

from __future__ import annotations

from typing import Any

from ..models.runstep import MAX_CALL_BYTES, MAX_RUN_NAME

GROUP, VERSION = "reversi.dev", "v1alpha1"
ADM = "admissionregistration.k8s.io/v1"

#: CEL: a RunStep create that is a recorded call (checked by the policies, not by a webhook)
RECORDED_CALL = ("request.operation == 'CREATE' && has(object.spec.runAtOpen) && "
                 "!has(object.spec.snapshot) && !has(object.spec.recordedAt)")

#: ceiling of a recorded call's ``args`` as CEL measures them (as for the outcome's result)
ARGS_CEILING_BYTES = 2 * MAX_CALL_BYTES

#: regular-expression characters a glob takes literally (escaped with a backslash in the regex)
_REGEX_SPECIALS = ".+()|[]{}^$"


def cel_string(text: str) -> str:
    """``text`` as a CEL string literal (single quotes; backslash and quote escaped)."""
    quoted = text.replace("\\", "\\\\").replace("'", "\\'")
    return "'" + "".join(f"\\u{ord(c):04x}" if ord(c) < 32 else c for c in quoted) + "'"


#: the glob-to-regex translation as ``(old, new)`` replacements, applied in order to the pattern:
#: escaped characters are set aside as control characters, the rest is quoted, the wildcards
#: expanded, and the escaped ones put back quoted (CEL has no loops, only ``replace``)
GLOB_STEPS: tuple[tuple[str, str], ...] = (
    ("\\\\", "\x01"), ("\\*", "\x02"), ("\\?", "\x03"), ("\\", ""),
    *((char, "\\" + char) for char in _REGEX_SPECIALS),
    ("*", ".*"), ("?", "."), ("\x02", "\\*"), ("\x03", "\\?"), ("\x01", "\\\\"),
)


def glob_regex_of(pattern: str) -> str:
    """The RE2 regex (also Python's ``re``) :func:`glob_regex` makes of ``pattern`` in CEL."""
    for old, new in GLOB_STEPS:
        pattern = pattern.replace(old, new)
    return f"^(?s:{pattern})$"


def glob_regex(expr: str) -> str:
    """A CEL expression giving the RE2 regex of the glob that the CEL string ``expr`` holds,
    with the semantics of docs/concepts.md#glob-semantics-of-halt-scopes: the whole value,
    ``*`` any run of characters, ``?`` one character, ``\\`` makes the next one literal,
    everything else literal (:data:`GLOB_STEPS`)."""
    out = expr + "".join(f".replace({cel_string(old)}, {cel_string(new)})" for old, new in GLOB_STEPS)
    return f"'^(?s:' + {out} + ')$'"


def _field_hit(field: str, scope: str) -> str:
    """CEL: the halt's ``scope.<field>`` (absent: any) matches ``<scope>.<field>`` (absent: no)."""
    pattern = f"params.spec.scope.{field}"
    return (f"(!has(params.spec.scope) || !has({pattern}) || "
            f"(has({scope}.{field}) && {scope}.{field}.matches({glob_regex(pattern)})))")


def _scope_hit(scope: str) -> str:
    """CEL: every actor/tenant/environment pattern of the halt matches the run scope ``scope``."""
    return " && ".join(_field_hit(f, scope) for f in ("actor", "tenant", "environment"))


def _step_text() -> str:
    return "string(object.spec.index) + ', ' + object.spec.tool"


def halt_policy(kind: str, name: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy whose params are every ``kind`` (``Halt``: of the step's
    namespace; ``ClusterHalt``: of the cluster): a recorded call is refused (``kill switch:
    <reason>``) when a halt's scope matches its tool and its run's scope, or the scope of one of
    its ancestors (rule 9; docs/concepts.md#glob-semantics-of-halt-scopes)."""
    own = "object.spec.runAtOpen.scope"
    variables = [
        {"name": "toolHit", "expression": "!has(params.spec.scope) || !has(params.spec.scope.tool) || "
                                          f"object.spec.tool.matches({glob_regex('params.spec.scope.tool')})"},
        {"name": "ownHit", "expression": f"(has({own}) && ({_scope_hit(own)})) || (!has({own}) && {_no_scope_hit()})"},
        {"name": "ancestorHit", "expression": "has(object.spec.runAtOpen.ancestors) && "
                                              "object.spec.runAtOpen.ancestors.exists(a, "
                                              f"(has(a.scope) && ({_scope_hit('a.scope')})) || "
                                              f"(!has(a.scope) && {_no_scope_hit()}))"},
    ]
    hit = "variables.toolHit && (variables.ownHit || variables.ancestorHit)"
    where = "'Halt ' + params.metadata.namespace + '/' + params.metadata.name"
    if kind == "ClusterHalt":
        variables.append({"name": "namespaceHit", "expression": (
            "!has(params.spec.scope) || !has(params.spec.scope.namespace) || "
            f"object.metadata.namespace.matches({glob_regex('params.spec.scope.namespace')})")})
        hit = "variables.namespaceHit && " + hit
        where = "'ClusterHalt ' + params.metadata.name"
    through = ("(variables.ownHit ? '' : ', by the scope of ancestor Run ' + object.spec.runAtOpen.ancestors.filter(a, "
               f"(has(a.scope) && ({_scope_hit('a.scope')})) || (!has(a.scope) && {_no_scope_hit()}))[0].name)")
    return {
        "apiVersion": ADM, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind},
            "matchConstraints": _runstep_creates(),
            "matchConditions": [{"name": "recorded-call", "expression": RECORDED_CALL}],
            "variables": variables,
            "validations": [{
                "expression": f"!({hit})", "reason": "Forbidden",
                "messageExpression": f"'kill switch: ' + params.spec.reason + ' (' + {where} + ' refuses step ' + "
                                     f"{_step_text()} + {through} + '; deleting the halt lifts it)'"}],
        },
    }


def _no_scope_hit() -> str:
    """CEL: the halt names no actor, tenant or environment (a run with no scope matches then only)."""
    return ("(!has(params.spec.scope) || (!has(params.spec.scope.actor) && !has(params.spec.scope.tenant) && "
            "!has(params.spec.scope.environment)))")


def _runstep_creates() -> dict[str, Any]:
    return {"resourceRules": [{"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": ["CREATE"],
                               "resources": ["runsteps"]}]}


def record_policy(name: str, recorder: str | None = None) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy of a recorded call's own shape: the name ``<run>-<index in
    five digits>``, the caller is the Run's principal as the step's copy of the Run says (rule 10;
    the operator checks the copy against the Run) or ``recorder``, the admission server's own user,
    which records the writes of the user a Run's ``spec.record`` names
    (docs/concepts.md#recording-with-no-agent-code) and alone may mark a step
    ``runAtOpen.recordedAtAdmission``, no resolution, ``args`` within
    :data:`ARGS_CEILING_BYTES` as CEL measures them, a Run name that can label its steps."""
    by_recorder = f" || request.userInfo.username == {cel_string(recorder)}" if recorder else ""
    index = "string(object.spec.index)"
    expected = f"object.spec.runRef.name + '-' + ('0000' + {index}).substring(size({index}) - 1)"
    run = "'Run ' + object.metadata.namespace + '/' + object.spec.runRef.name"
    return {
        "apiVersion": ADM, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": _runstep_creates(),
            "matchConditions": [{"name": "recorded-call", "expression": RECORDED_CALL}],
            "validations": [
                {"expression": f"object.metadata.name == {expected}", "reason": "Invalid",
                 "messageExpression": "'RunStep ' + object.metadata.namespace + '/' + object.metadata.name + ': step ' "
                                      f"+ {index} + ' of ' + {run} + ' must be named ' + {expected} + "
                                      "' (<run>-<index in five digits>)'"},
                {"expression": f"size(object.spec.runRef.name) <= {MAX_RUN_NAME}", "reason": "Invalid",
                 "messageExpression": f"{run} + ' has a name longer than {MAX_RUN_NAME} characters, which cannot "
                                      "label its steps: record into a Run with a shorter name'"},
                {"expression": "!has(object.spec.runAtOpen.principal) || "
                               "object.spec.runAtOpen.principal == request.userInfo.username" + by_recorder,
                 "reason": "Forbidden",
                 "messageExpression": f"{run} + ' belongs to another principal (' + object.spec.runAtOpen.principal + "
                                      "'); ' + request.userInfo.username + ' may not add or change its steps: open a "
                                      "Run of your own'"},
                {"expression": "!has(object.spec.runAtOpen.recordedAtAdmission) || "
                               "!object.spec.runAtOpen.recordedAtAdmission" + (
                                   f" || request.userInfo.username == {cel_string(recorder)}" if recorder else ""),
                 "reason": "Forbidden",
                 "messageExpression": "'spec.runAtOpen.recordedAtAdmission is set only by Reversi\\'s recording "
                                      "webhook; ' + request.userInfo.username + ' may not set it'"},
                {"expression": "!has(object.spec.resolution)", "reason": "Invalid",
                 "message": "a step is recorded without spec.resolution; settle it afterwards (kubectl reversi "
                            "resolve)"},
                {"expression": f"size(bytes('%s'.format([object.spec.args]))) <= {ARGS_CEILING_BYTES}",
                 "reason": "Invalid",
                 "messageExpression": f"'step ' + {index} + ' (' + object.spec.tool + '): args is more than "
                                      f"{ARGS_CEILING_BYTES} bytes as the API server measures "
                                      f"it, past the limit of {MAX_CALL_BYTES} bytes of JSON per step; record a "
                                      "reference (an id, a URL) instead of the whole payload'"},
            ],
        },
    }


def lock_policy(name: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy of rule 11 on a recorded call: its params are the namespace's
    ClosedRunSlices (:mod:`reversi.models.closedrunslice`; none: no run of the namespace is locked),
    and a step of a run whose entry names the uid the step carries is refused (a Run re-created
    under the same name is another run, open). One map lookup per slice, whatever the number of
    closed runs."""
    entry = "params.spec.runs[object.spec.runRef.name]"
    return {
        "apiVersion": ADM, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClosedRunSlice"},
            "matchConstraints": _runstep_creates(),
            "matchConditions": [{"name": "recorded-call", "expression": RECORDED_CALL}],
            "validations": [{
                "expression": "!has(params.spec.runs) || !(object.spec.runRef.name in params.spec.runs) || "
                              f"{entry}.split(' ')[0] != object.spec.runAtOpen.uid",
                "reason": "Forbidden",
                "messageExpression": "'Run ' + object.metadata.namespace + '/' + object.spec.runRef.name + ': run "
                                     f"' + (size({entry}.split(' ')) > 2 ? 'was' : 'is being') + ' rolled back by "
                                     f"RollbackRequest ' + {entry}.split(' ')[1] + '; it takes no new steps: record "
                                     "further calls in a new Run'"}],
        },
    }


def principal_of_step(recorder: str | None) -> str:
    """CEL: the principal a recorded call is stamped with: the authenticated user; for ``recorder`` (the
    admission server, recording another user's write for a Run with ``spec.record``), the Run's
    principal as the step's copy of the Run names it (docs/concepts.md#recording-with-no-agent-code)."""
    if not recorder:
        return "request.userInfo.username"
    return (f"(request.userInfo.username == {cel_string(recorder)} && has(object.spec.runAtOpen.principal) ? "
            "object.spec.runAtOpen.principal : request.userInfo.username)")


def stamp_policy(name: str, recorder: str | None = None) -> dict[str, Any]:
    """The MutatingAdmissionPolicy that stamps a recorded call: ``spec.principal`` from the
    authenticated user (a client's value is overwritten; :func:`principal_of_step`), the
    ``reversi.dev/run`` label, and the Run (``spec.runRef.name``, uid ``spec.runAtOpen.uid``) as its
    one controlling owner."""
    owner = ("Object.metadata.ownerReferences{apiVersion: 'reversi.dev/v1alpha1', kind: 'Run', "
             "name: object.spec.runRef.name, uid: object.spec.runAtOpen.uid, controller: true, "
             "blockOwnerDeletion: false}")
    # (a list literal of objects as a patch value makes the API server panic: the owner reference
    # is added as one element to a list that starts empty; a client's other owners are dropped)
    patch = (f"[JSONPatch{{op: 'add', path: '/spec/principal', value: {principal_of_step(recorder)}}}, "
             "JSONPatch{op: 'add', path: '/metadata/ownerReferences', value: []}, "
             f"JSONPatch{{op: 'add', path: '/metadata/ownerReferences/-', value: {owner}}}] + "
             "(has(object.metadata.labels) ? [] : [JSONPatch{op: 'add', path: '/metadata/labels', value: {}}]) + "
             "[JSONPatch{op: 'add', path: '/metadata/labels/reversi.dev~1run', value: object.spec.runRef.name}]")
    return {
        "apiVersion": ADM, "kind": "MutatingAdmissionPolicy", "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail", "reinvocationPolicy": "Never",
            "matchConstraints": _runstep_creates(),
            "matchConditions": [{"name": "recorded-call", "expression": RECORDED_CALL}],
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
        },
    }


def binding(kind: str, name: str, param: dict[str, Any] | None = None) -> dict[str, Any]:
    """The binding (``kind``: ``ValidatingAdmissionPolicyBinding`` or
    ``MutatingAdmissionPolicyBinding``) that puts policy ``name`` in force in every namespace,
    with ``param`` as its ``paramRef`` (a missing param allows)."""
    spec: dict[str, Any] = {"policyName": name}
    if kind == "ValidatingAdmissionPolicyBinding":
        spec["validationActions"] = ["Deny"]
    if param is not None:
        spec["paramRef"] = {**param, "parameterNotFoundAction": "Allow"}
    return {"apiVersion": ADM, "kind": kind, "metadata": {"name": name}, "spec": spec}


def recording_policies(prefix: str, recorder: str | None = None) -> list[dict[str, Any]]:
    """Every policy of the recorded call and its binding, named ``<prefix>-runstep-...``, in the
    order to apply them (each policy before its binding); ``recorder``: the admission server's user
    (:func:`record_policy`)."""
    vapb = "ValidatingAdmissionPolicyBinding"
    out: list[dict[str, Any]] = []
    stamp = f"{prefix}-runstep-stamp"
    out += [stamp_policy(stamp, recorder), binding("MutatingAdmissionPolicyBinding", stamp)]
    record = f"{prefix}-runstep-record"
    out += [record_policy(record, recorder), binding(vapb, record)]
    for kind, suffix in (("Halt", "halts"), ("ClusterHalt", "clusterhalts")):
        policy = f"{prefix}-runstep-{suffix}"
        out += [halt_policy(kind, policy), binding(vapb, policy, {"selector": {}})]
    lock = f"{prefix}-runstep-lock"
    out += [lock_policy(lock), binding(vapb, lock, {"selector": {}})]
    return out


def glob_instance(pattern: str) -> str:
    """A value the glob ``pattern`` matches: each ``*`` and ``?`` becomes ``x``, an escaped
    character itself (used to probe whether a halt is in force)."""
    out, escaped = [], False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        else:
            out.append("x" if char in "*?" else char)
    return "".join(out)
