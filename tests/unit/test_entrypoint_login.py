"""The entry points' kopf login from ``--kubeconfig`` (reversi.entrypoints.common.login): a
kubeconfig that authenticates with a token (a ServiceAccount's, as the chart's pods do, or as
benchmarks/record_load_bench.py --apf runs the operator) logs kopf in with that token, never
anonymously; one with a client certificate logs in with the certificate."""

from __future__ import annotations

import yaml

from reversi.entrypoints import common

CLUSTER = {"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}


def _kubeconfig(tmp_path, user: dict):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [CLUSTER],
                                    "users": [{"name": "u", "user": user}],
                                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                                    "current-context": "x"}))
    return path


def test_a_token_kubeconfig_logs_kopf_in_with_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("REVERSI_KUBECONFIG", str(_kubeconfig(tmp_path, {"token": "sa-token-123"})))
    info = common.login()
    assert (info.server, info.scheme, info.token) == ("https://127.0.0.1:6443", "Bearer", "sa-token-123")


def test_a_certificate_kubeconfig_logs_kopf_in_with_no_token(tmp_path, monkeypatch):
    (tmp_path / "u.crt").write_text("cert")
    (tmp_path / "u.key").write_text("key")
    monkeypatch.setenv("REVERSI_KUBECONFIG", str(_kubeconfig(tmp_path, {
        "client-certificate": str(tmp_path / "u.crt"), "client-key": str(tmp_path / "u.key")})))
    info = common.login()
    assert info.scheme is None and info.token is None
    assert info.certificate_path and info.private_key_path
