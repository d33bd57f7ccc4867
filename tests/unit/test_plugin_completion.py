"""Shell completion of ``kubectl reversi``: click's scripts for bash, zsh and fish, and the
``kubectl_complete-reversi`` program kubectl 1.26+ runs for a plugin's completion."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from reversi.cli import main as plugin
from reversi.cli.completion import COMPLETE_VAR, kubectl_complete

REPO = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        plugin.main(list(argv))
    captured = capsys.readouterr()
    return done.value.code, captured.out, captured.err


def test_completion_bash_is_a_script_bash_accepts_and_registers_for_kubectl_reversi(capsys, tmp_path):
    code, script, _ = run(capsys, "completion", "bash")
    assert code == 0
    path = tmp_path / "kubectl-reversi.bash"
    path.write_text(script)
    bash = shutil.which("bash")
    assert bash, "bash is needed for this test"
    syntax = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    loaded = subprocess.run([bash, "-c", f"source {path} && complete -p kubectl-reversi"], capture_output=True,
                            text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip().endswith("kubectl-reversi") and "-F _kubectl_reversi_completion" in loaded.stdout


@pytest.mark.parametrize("shell, marker", [("zsh", "#compdef kubectl-reversi"), ("fish", "complete --no-files")])
def test_completion_zsh_and_fish_are_clicks_scripts_for_the_program(capsys, shell, marker):
    code, script, _ = run(capsys, "completion", shell)
    assert code == 0 and marker in script and COMPLETE_VAR in script


def test_an_unknown_shell_is_one_line_naming_the_shells(capsys):
    code, _, err = run(capsys, "completion", "tcsh")
    assert code == 1 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in err and len(err.strip().splitlines()) == 1


def test_the_bash_script_gets_its_candidates_from_the_program(tmp_path):
    """What the script runs on TAB: the program with click's variable set (bash_complete)."""
    env = {**os.environ, "COMP_WORDS": "kubectl-reversi halt l", "COMP_CWORD": "2", COMPLETE_VAR: "bash_complete"}
    done = subprocess.run([sys.executable, "-m", "reversi.entrypoints.plugin"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plain,lift", "plain,list"]


def test_kubectl_complete_lists_the_subcommands_then_no_file_completion():
    lines = kubectl_complete(plugin.cli, [""]).splitlines()
    assert lines[-1] == ":4"
    assert {"plan", "rollback", "describe", "logs", "completion", "halt", "kill-switch", "archive"} <= set(lines[:-1])
    assert kubectl_complete(plugin.cli, ["__complete", "halt", ""]).splitlines() == ["add", "lift", "list", ":4"]
    assert kubectl_complete(plugin.cli, ["plan", "r", "-o", ""]).splitlines() == ["json", "yaml", "name", "wide", ":4"]
    assert kubectl_complete(plugin.cli, ["plan", "--kubeconfig", ""]) == ":0"  # a path: the shell completes files


def test_kubectl_complete_reversi_is_a_console_script_that_answers_kubectl():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["kubectl_complete-reversi"].partition(":")
    done = subprocess.run([sys.executable, "-c", f"from {module} import {function}; {function}()", "ki"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["kill-switch", ":4"]


def test_names_are_not_completed_and_nothing_is_printed_when_the_cluster_cannot_be_read(tmp_path):
    """RUN and REQUEST arguments complete from the cluster (tests/integration/test_plugin.py);
    an unreachable API server gives no candidate, and no error in the shell."""
    import yaml

    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    assert kubectl_complete(plugin.cli, ["--kubeconfig", str(path), "plan", ""]) == ":4"
    assert kubectl_complete(plugin.cli, ["--kubeconfig", str(path), "logs", "undo"]) == ":4"
