"""Every command the alerts' annotations and docs/operations.md print works as printed on the
chart installed as documented (release ``reversi`` in namespace ``reversi-system``): the
Deployments, Services, ports and Secrets they name are among the objects ``helm template``
renders, each label selector picks the pods of exactly one Deployment, the one its text says (the
operator's or the admission server's), and a port-forward to the metrics reaches the operator's
Service. The PrometheusRule of another release names that release's objects."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
import yaml

from tests.chart.chartkit import CHART, KUBE_VERSION, REPO

DOC = REPO / "docs" / "operations.md"
RULES = CHART / "files" / "alerts" / "reversi.rules.yaml"


def _render(helm, release: str, namespace: str) -> list[dict]:
    out = subprocess.run([helm, "template", release, CHART, "-n", namespace, "--kube-version", KUBE_VERSION,
                          "--set", "metrics.prometheusRule.enabled=true"], capture_output=True, text=True,
                         check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def documented(helm) -> list[dict]:
    """The chart as the docs install it: release reversi in reversi-system (alerts on)."""
    return _render(helm, "reversi", "reversi-system")


@pytest.fixture(scope="module")
def other(helm) -> list[dict]:
    return _render(helm, "rv", "ops")


def _kubectl_commands(text: str, namespace: str) -> list[list[str]]:
    """The ``kubectl`` commands in ``text`` (code spans and lines of code blocks) that act in
    ``namespace``, split as a shell would."""
    found: list[list[str]] = []
    blocks = [block.replace("\\\n", " ") for block in re.findall(r"```sh\n(.*?)```", text, re.S)]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = re.findall(r"`([^`\n]*(?:\n[^`\n]*)?)`", prose) + [
        line.split("  #")[0] for block in blocks for line in block.splitlines()]
    for span in spans:
        span = " ".join(span.split())
        for part in re.split(r"&&|;|\|", span):
            part = part.strip().rstrip("&").strip()
            if not part.startswith("kubectl "):
                continue
            words = shlex.split(part)
            if any(words[i] in ("-n", "--namespace") and words[i + 1] == namespace for i in range(len(words) - 1)):
                found.append(words)
    return found


def _pod_labels(objs: list[dict]) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
            for o in objs if o["kind"] == "Deployment"}


def _check(words: list[str], objs: list[dict], namespace: str, fullname: str) -> list[str]:
    """What in one command does not exist in the rendered objects ``objs`` (empty: all of it does)."""
    problems: list[str] = []
    named = {(o["kind"], o["metadata"]["name"]) for o in objs if o["metadata"].get("namespace") in (None, namespace)}
    for i, word in enumerate(words):
        kind, _, name = word.partition("/")
        if kind in ("deploy", "deployment") and ("Deployment", name) not in named:
            problems.append(f"no Deployment {name}")
        if kind in ("svc", "service"):
            svc = next((o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == name), None)
            if svc is None:
                problems.append(f"no Service {name}")
                continue
            remote = words[i + 1].split(":")[-1] if i + 1 < len(words) else ""
            ports = {str(p["port"]): p.get("name") for p in svc["spec"]["ports"]}
            if words[1:2] == ["port-forward"] or "port-forward" in words:
                if ports.get(remote) != "metrics" or svc["spec"]["selector"].get("app.kubernetes.io/component") \
                        != "operator":
                    problems.append(f"port-forward {word} {words[i + 1]} does not reach the operator's metrics")
        creates = words[1:2] == ["create"]  # `kubectl create secret generic NAME` makes what it names
        if word == "secret" and not creates and i + 1 < len(words) and ("Secret", words[i + 1]) not in named:
            problems.append(f"no Secret {words[i + 1]}")
        if word == "-l" and i + 1 < len(words):
            wanted = dict(pair.split("=", 1) for pair in words[i + 1].split(","))
            picked = [d for d, labels in _pod_labels(objs).items()
                      if all(labels.get(k) == v for k, v in wanted.items())]
            component = wanted.get("app.kubernetes.io/component")
            expected = {"operator": fullname, "admission": f"{fullname}-admission"}.get(component or "")
            if picked != [expected]:
                problems.append(f"-l {words[i + 1]} picks the pods of {picked}, not only those of {expected}")
    return problems


def _annotations(objs: list[dict]) -> dict[str, str]:
    rule = next(o for o in objs if o["kind"] == "PrometheusRule")
    return {f"{r['alert']} {k}": v for g in rule["spec"]["groups"] for r in g["rules"]
            for k, v in r.get("annotations", {}).items()}


def test_the_alerts_commands_name_what_the_documented_install_creates(documented):
    objs = documented
    annotations = _annotations(objs)
    plain = {f"{r['alert']} {k}": v for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
             for k, v in r.get("annotations", {}).items()}
    assert annotations == plain, "the rules file and the documented release's PrometheusRule say different things"
    checked = 0
    for where, text in annotations.items():
        for words in _kubectl_commands(f"`{text}`" if "`" not in text else text, "reversi-system"):
            assert not _check(words, objs, "reversi-system", "reversi"), (where, words)
            checked += 1
    assert checked >= 4  # the operator's and the admission server's pods and logs


def test_the_alerts_commands_follow_another_release_and_namespace(other):
    objs = other
    checked = 0
    for where, text in _annotations(objs).items():
        assert "reversi-system" not in text and "deploy/reversi " not in text, where
        for words in _kubectl_commands(text, "ops"):
            assert not _check(words, objs, "ops", "rv-reversi"), (where, words)
            checked += 1
    assert checked >= 4


def test_every_command_of_operations_md_in_the_release_namespace_works_as_printed(documented):
    objs = documented
    commands = _kubectl_commands(DOC.read_text(), "reversi-system")
    assert len(commands) >= 8 and any("port-forward" in w for w in commands) and any("-l" in w for w in commands)
    problems = {" ".join(w): p for w in commands if (p := _check(w, objs, "reversi-system", "reversi"))}
    assert not problems, problems


def test_the_check_catches_what_was_wrong(documented):
    """The commands these texts printed before: a Deployment that does not exist for the release
    ``reversi``, a selector that lists the admission pods too, a port-forward to the admission
    Service."""
    for bad in ("kubectl -n reversi-system logs deploy/reversi-reversi",
                "kubectl -n reversi-system get pods -l app.kubernetes.io/name=reversi",
                "kubectl -n reversi-system port-forward svc/reversi 8081:8080"):
        assert _check(shlex.split(bad), documented, "reversi-system", "reversi"), bad
