"""What the demos do before the real node starts, and what it starts with (no node needed):

- the node's Debian packages are installed by the demos where they are missing and can be, from
  the one list ``make node-deps`` installs too (reversi_devcluster.nodedeps); where they cannot,
  one line says why and what to run;
- the cluster DNS: the kube-dns Service on the address the kubelet gives every pod."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from reversi_devcluster import nodedeps, realnode

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def host(monkeypatch):
    """A host with root and the cgroup memory controller, whose packages and apt-get the test sets."""
    state = {"missing": ["buildah", "debootstrap"], "cannot": None, "fail": None, "installed": []}
    monkeypatch.setattr(realnode, "_host_unsupported", lambda: None)
    monkeypatch.setattr(nodedeps, "missing", lambda: list(state["missing"]))
    monkeypatch.setattr(nodedeps, "cannot_install", lambda: state["cannot"])

    def install(names: list[str]) -> None:
        if state["fail"]:
            raise RuntimeError(state["fail"])
        state["installed"] += names
        state["missing"] = [n for n in state["missing"] if n not in names]

    monkeypatch.setattr(nodedeps, "install", install)
    return state


def test_missing_packages_are_installed_with_one_line_saying_so(host):
    lines: list[str] = []
    assert realnode.make_ready(log=lines.append) is None
    assert host["installed"] == ["buildah", "debootstrap"]
    assert lines[0] == "installing the real node's Debian packages (as make node-deps does): buildah debootstrap"


def test_where_they_cannot_be_installed_one_line_says_why_and_what_to_run(host):
    host["cannot"] = "this machine has no apt-get"
    lines: list[str] = []
    why = realnode.make_ready(log=lines.append)
    assert why == ("the real node needs Debian's buildah debootstrap, and this machine has no apt-get: "
                   "apt-get update && apt-get install -y --no-install-recommends buildah debootstrap")
    assert host["installed"] == [] and lines == []


def test_a_failed_install_says_what_to_run(host):
    host["fail"] = "apt-get install failed (exit 100):\nE: Unable to locate package buildah"
    why = realnode.make_ready(log=lambda _: None)
    assert why is not None and "apt-get install failed (exit 100)" in why and "make node-deps" in why
    assert "\n" not in why  # one line


def test_make_node_deps_installs_the_same_list():
    """One list: the Makefile's target runs nodedeps.py and names no package itself."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\nnode-deps:\n", 1)[1].split("\n\n", 1)[0]
    assert "devcluster/reversi_devcluster/nodedeps.py" in recipe
    assert not any(name in recipe for name in nodedeps.PACKAGES), recipe


def test_the_kube_dns_service_is_where_the_kubelet_points_pods(tmp_path):
    class Cluster:  # what RealNode reads of its cluster to render the DNS objects
        settings = None
        paths = type("Paths", (), {"root": tmp_path})()

    objects = realnode.RealNode(Cluster()).dns_objects()  # type: ignore[arg-type]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert kinds == {("ServiceAccount", "coredns"), ("ClusterRole", "system:coredns"),
                     ("ClusterRoleBinding", "system:coredns"), ("ConfigMap", "coredns"),
                     ("Deployment", "coredns"), ("Service", "kube-dns")}
    service = next(o for o in objects if o["kind"] == "Service")
    assert service["metadata"]["namespace"] == "kube-system"
    assert service["spec"]["clusterIP"] == realnode.CLUSTER_DNS_IP
    corefile = next(o for o in objects if o["kind"] == "ConfigMap")["data"]["Corefile"]
    assert re.search(rf"kubernetes {re.escape(realnode.CLUSTER_DOMAIN)} in-addr.arpa", corefile)
    (container,) = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("localhost/coredns:v")
    assert "${" not in yaml.safe_dump(objects)
