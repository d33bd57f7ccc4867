"""Faults of the local control plane give clear errors and leave no process behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from reversi.devcluster import build
from reversi.devcluster.cluster import COMPONENTS, Cluster, ClusterError, ClusterSettings

pytestmark = pytest.mark.cluster


def _second_cluster(tmp_path: Path, **extra) -> Cluster:
    """A cluster in its own folder on its own ports, beside the session's cluster."""
    return Cluster(ClusterSettings(
        cluster_dir=tmp_path / "cluster", apiserver_port=26443, etcd_port=22379,
        etcd_peer_port=22380, kubelet_port=30250, start_timeout=60, **extra))


def _no_process_left(c: Cluster) -> None:
    for comp in COMPONENTS:
        assert not c.paths.pid(comp).exists(), f"{comp} pid file left behind"
    out = subprocess.run(["pgrep", "-f", str(c.paths.root)], capture_output=True, text=True)
    assert out.stdout.strip() == "", f"processes left behind: {out.stdout}"


def test_a_port_in_use_names_the_component_and_the_port(tmp_path, cluster):
    c = _second_cluster(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", c.settings.apiserver_port))
        sock.listen()
        with pytest.raises(ClusterError) as err:
            c.up(log=lambda *_: None)
    assert "kube-apiserver: port 26443 on 127.0.0.1 is in use" in str(err.value)
    _no_process_left(c)


def test_a_component_that_dies_at_start_is_named_with_its_log(tmp_path, cluster):
    c = _second_cluster(tmp_path, apiserver_extra_args=["--no-such-flag"])
    with pytest.raises(ClusterError) as err:
        c.up(log=lambda *_: None)
    message = str(err.value)
    assert message.startswith("kube-apiserver exited during start-up")
    assert str(c.paths.log("kube-apiserver")) in message
    assert "unknown flag: --no-such-flag" in message
    _no_process_left(c)


def test_a_component_that_dies_later_shows_in_status_and_down_cleans_up(tmp_path, cluster):
    c = _second_cluster(tmp_path)
    c.up(log=lambda *_: None)
    try:
        kcm = c.status()["kube-controller-manager"]["pid"]
        os.kill(kcm, 9)
        env = {**os.environ, "REVERSI_CLUSTER_DIR": str(c.paths.root), "REVERSI_APISERVER_PORT": "26443"}
        out = subprocess.run([sys.executable, "-m", "reversi.devcluster.cli", "status"],
                             capture_output=True, text=True, env=env, timeout=30)
        assert out.returncode == 1
        line = next(l for l in out.stdout.splitlines() if l.startswith("kube-controller-manager"))
        assert "stopped" in line and str(c.paths.log("kube-controller-manager")) in line
    finally:
        c.down(quiet=True)
    _no_process_left(c)


def test_a_build_that_fails_names_the_component_and_its_log(tmp_path, monkeypatch):
    pins = tmp_path / "pins.toml"
    etcd = build.load_pins()["etcd"]["version"]
    pins.write_text(build.PINS_FILE.read_text().replace(f'version = "{etcd}"', 'version = "v3.6.999"'))
    monkeypatch.setenv("REVERSI_PINS", str(pins))
    monkeypatch.setenv("REVERSI_CACHE", str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "reversi.devcluster.cli", "build", "etcd"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "building etcd (resolve modules) failed" in out.stderr
    assert str(tmp_path / "cache" / "etcd-v3.6.999" / "build.log") in out.stderr
