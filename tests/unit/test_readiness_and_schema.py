"""Ready/Reconciling/Stalled (kstatus conventions) and the schema check, as pure functions."""

from __future__ import annotations

import pytest

from reversi import conditions as cond
from reversi import crdgen, schema
from reversi.adapters import status as st
from reversi.handlers.halts import halt_status
from reversi.handlers.manifests import manifest_status
from reversi.models import ALL_CRDS
from reversi.models.common import SCHEMA_VERSION, SCHEMA_VERSION_ANNOTATION


def _conds(updates, gen=3):
    return {t: (s, r) for t, s, r, _ in updates}


@pytest.mark.parametrize("phase, ready, reconciling, stalled", [
    ("Pending", "False", "True", "False"),
    ("Waiting", "False", "True", "False"),
    ("Running", "False", "True", "False"),
    ("AwaitingApproval", "False", "True", "False"),
    ("Planned", "True", "False", "False"),
    ("Succeeded", "True", "False", "False"),
    ("Incomplete", "False", "False", "True"),
    ("Failed", "False", "False", "True"),
])
def test_request_readiness_per_phase(phase, ready, reconciling, stalled):
    got = _conds(st.request_readiness(phase, cond.IN_PROGRESS, "m"))
    assert (got[cond.READY][0], got[cond.RECONCILING][0], got[cond.STALLED][0]) == (ready, reconciling, stalled)
    # the condition that is True carries the reason; the others say Idle or the same reason
    assert all(reason in cond.REASONS for _, reason in got.values())


def test_readiness_refuses_an_unknown_state():
    with pytest.raises(ValueError, match="ready, progressing or stalled"):
        st.readiness("done", cond.IDLE, "")


def _cond(ctype, status, reason, gen=1):
    return cond.condition(ctype, status, reason, "m", gen)


def test_run_readiness_follows_lock_and_last_rollback():
    assert _conds(st.run_readiness([]))[cond.READY] == ("True", cond.NO_ROLLBACK)
    locked = [_cond(cond.LOCKED, cond.TRUE, cond.HELD_BY_REQUEST)]
    assert _conds(st.run_readiness(locked))[cond.RECONCILING] == ("True", cond.HELD_BY_REQUEST)
    done = [_cond(cond.LOCKED, cond.FALSE, cond.RELEASED), _cond(cond.ROLLED_BACK, cond.TRUE, cond.ALL_COMPENSATED)]
    assert _conds(st.run_readiness(done))[cond.READY] == ("True", cond.ALL_COMPENSATED)
    bad = [_cond(cond.LOCKED, cond.FALSE, cond.RELEASED), _cond(cond.ROLLED_BACK, cond.FALSE, cond.INCOMPLETE)]
    assert _conds(st.run_readiness(bad))[cond.STALLED] == ("True", cond.INCOMPLETE)


def test_run_status_update_writes_only_when_behind():
    update = st.run_status_update({"observedGeneration": 0}, 4)
    assert update["observedGeneration"] == 4
    assert {x["type"]: x["observedGeneration"] for x in update["conditions"]} == {
        cond.READY: 4, cond.RECONCILING: 4, cond.STALLED: 4}
    assert st.run_status_update(update, 4) is None
    assert st.run_status_update(update, 5)["observedGeneration"] == 5


def test_observed_update_of_a_final_request():
    status = {"observedGeneration": 1, "phase": "Planned",
              "conditions": [_cond(cond.READY, cond.TRUE, cond.PLAN_READY)]}
    update = st.observed_update(status, 2)
    assert update["observedGeneration"] == 2 and update["conditions"][0]["observedGeneration"] == 2
    assert update["conditions"][0]["status"] == cond.TRUE
    assert st.observed_update({**status, "observedGeneration": 2}, 2) is None


def test_halt_is_ready_while_in_force():
    body = {"metadata": {"generation": 2, "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"reason": "r"}}
    status = halt_status(body)
    assert status["observedGeneration"] == 2 and status["active"] is True
    assert cond.is_true(status["conditions"], cond.READY) and cond.is_true(status["conditions"], cond.ACTIVE)
    assert halt_status({**body, "status": status}) is None


def test_manifest_ready_when_accepted_stalled_when_not():
    good = {"metadata": {"generation": 1}, "spec": {"tools": [{"name": "a.read", "effect": "read"}]}}
    assert cond.is_true(manifest_status(good)["conditions"], cond.READY)
    bad = {"metadata": {"generation": 1}, "spec": {"tools": [{"name": "a.write", "effect": "write"}]}}
    conds = manifest_status(bad)["conditions"]
    assert cond.is_true(conds, cond.STALLED) and not cond.is_true(conds, cond.READY)
    assert cond.get_condition(conds, cond.STALLED)["reason"] == cond.MANIFEST_INVALID


# ----------------------------------------------------------------------------- schema version

def _crd(name, version):
    annotations = {} if version is None else {SCHEMA_VERSION_ANNOTATION: str(version)}
    return {"metadata": {"name": name, "annotations": annotations}}


def test_schema_check_accepts_current_and_newer_crds():
    crds = [_crd(n, SCHEMA_VERSION) for n in schema.CRD_NAMES[:-1]] + [_crd(schema.CRD_NAMES[-1], SCHEMA_VERSION + 1)]
    result = schema.check(crds)
    assert result.ok and result.oldest == SCHEMA_VERSION
    assert "the operator needs" in result.summary()


def test_schema_check_names_older_and_missing_crds():
    crds = [_crd("runs.reversi.dev", 1), _crd("halts.reversi.dev", None)] + [
        _crd(n, SCHEMA_VERSION) for n in schema.CRD_NAMES if n not in ("runs.reversi.dev", "halts.reversi.dev",
                                                                       "clusterhalts.reversi.dev")]
    result = schema.check(crds + [_crd("other.example.com", 1)])
    assert not result.ok
    assert result.installed["runs.reversi.dev"] == 1 and result.installed["halts.reversi.dev"] == 0
    assert result.installed["clusterhalts.reversi.dev"] is None and result.oldest is None
    text = result.summary()
    assert f"runs.reversi.dev has schema version 1, the operator needs {SCHEMA_VERSION}" in text
    assert "halts.reversi.dev has no schema version" in text
    assert "clusterhalts.reversi.dev is not installed" in text
    assert "helm upgrade" in text


def test_generated_crds_carry_the_schema_version_and_the_status_default():
    for info in ALL_CRDS:
        crd = crdgen.crd_for(info)
        assert crd["metadata"]["annotations"][SCHEMA_VERSION_ANNOTATION] == str(SCHEMA_VERSION)
        assert schema.version_of(crd) == SCHEMA_VERSION
        version = crd["spec"]["versions"][0]
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        columns = [col["name"] for col in version["additionalPrinterColumns"]]
        if not info.reconciled:  # a record (RunStep): Current as soon as it exists, no Ready
            assert "default" not in status and "Ready" not in columns
            continue
        assert status["default"] == {"observedGeneration": 0}  # kstatus: InProgress until observed
        assert columns[-2:] == ["Ready", "Age"]


def test_chart_template_is_the_crd_with_enable_and_keep_switches():
    text = crdgen.chart_template(ALL_CRDS[0])
    assert text.startswith(crdgen.CHART_HEADER) and text.endswith("{{- end }}\n")
    assert 'if or (not (hasKey $crds "enabled")) $crds.enabled' in crdgen.CHART_HEADER
    assert '    {{- if or (not (hasKey $crds "keep")) $crds.keep }}\n    helm.sh/resource-policy: keep\n' in text


#: digest of the generated schemas (descriptions left out) at each schema version: a change to a
#: CRD's schema must raise SCHEMA_VERSION (models/common.py), or an operator would run against
#: CRDs that prune what it writes without noticing. Add the new digest here when you raise it.
SCHEMA_DIGESTS = {2: "0c3df7b157cbb7409336484ca4fbce5d662a007fe2f74afb46a5523063a0149b",
                  3: "1c614fa3bc3571ad065e04f4f135242d333cf2a0bc72cabea9c6f697b6a7e154",
                  4: "ddbb97959a07f14b2f29295a03176354981672a74471197a384e0924c3f68b82",
                  5: "bbe42b38d893258141681674d50eb97afeecfd723b2b02d02e300e5bd646a828",
                  6: "45a7598f93e411cdbd73a7cb81368667980aa671b81f704728f2e6c37d6d1f04",
                  7: "4d5e2ed3ee772d1f8b0b717fd7e7d44d5d6b75415733d11f556559ad417e59e8",
                  8: "ae6a6aa4c014e4423e78b1f5ace40b5d3e7fddaee164dbfffb43b8a24198719a",
                  9: "41766c54cb87ad20f3f21bf8a05f9ba7e00765c419dee65c6746df11766c58f0",
                  10: "1a972d61e7f332736dbce7e6366aa80a4570ded0e9126d664558214f7915a801",
                  11: "b9ec90315d6923acf6c37f09e9b93afda9645b753908354956507721489b0b54",
                  12: "90f688ce9b48712cfd1cca02948a5a03bd43db53a39950ec4ad01b64eabc3a37"}


def _schema_digest() -> str:
    import hashlib
    import json

    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "description"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    schemas = {i.crd_name: strip(crdgen.crd_for(i)["spec"]["versions"][0]["schema"]) for i in ALL_CRDS}
    return hashlib.sha256(json.dumps(schemas, sort_keys=True).encode()).hexdigest()


def test_a_schema_change_raises_the_schema_version():
    digest = _schema_digest()
    assert SCHEMA_DIGESTS.get(SCHEMA_VERSION) == digest, (
        f"the generated CRD schemas changed (digest {digest}) but SCHEMA_VERSION is still {SCHEMA_VERSION}: "
        "raise SCHEMA_VERSION in operator/reversi/models/common.py, run make crds, and record the digest in "
        "SCHEMA_DIGESTS")
