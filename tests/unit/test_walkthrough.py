"""The README walkthrough is what the demo prints, line for line, and the README names every
plugin command (a new user follows the README alone)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import click

from reversi.cli.main import cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _demo():
    spec = importlib.util.spec_from_file_location("run_demo", REPO / "demo" / "run_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _walkthrough_block() -> list[str]:
    section = README[README.index("## Walkthrough: try it yourself"):]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block, "the walkthrough has a sh block"
    return block.group(1).rstrip("\n").splitlines()


def test_the_demo_prints_the_readme_walkthrough_line_for_line():
    printed = _demo().walkthrough("http://127.0.0.1:PORT")  # the README's placeholder for the port
    assert _walkthrough_block() == printed


def test_the_walkthrough_lines_are_commands_a_shell_can_run_as_written():
    for line in _walkthrough_block():
        command = line.split("  # ")[0]
        assert "<" not in command and ">" not in command, f"a placeholder a shell would read as a redirect: {line}"


def _commands(group: click.Group, prefix: str = "") -> list[str]:
    out = []
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out += _commands(cmd, f"{prefix}{name} ")
        else:
            out.append(f"{prefix}{name}")
    return out


def test_the_readme_names_every_plugin_command():
    missing = [c for c in _commands(cli)
               if f"kubectl reversi {c}" not in README and f"`{c}`" not in README and f"`{c} " not in README]
    assert not missing, f"commands the README does not mention: {missing}"


def test_the_readme_lists_kubectl_as_a_requirement():
    requirements = README[README.index("### Requirements"):README.index("## Walkthrough")]
    assert re.search(r"^- kubectl\b", requirements, re.MULTILINE)


def test_a_second_demo_is_refused_while_a_kept_one_runs(tmp_path):
    """``make demo`` while ``make demo KEEP=1`` still runs would recreate the demo's namespace and
    remove the webhook configurations the kept operator serves (halts would stop refusing calls):
    it is refused by name; a state file whose operator is gone is stale and removed."""
    import json
    import os
    import subprocess
    import sys
    from types import SimpleNamespace

    import pytest

    demo = _demo()
    cluster = SimpleNamespace(paths=SimpleNamespace(root=tmp_path))
    state = demo.STATE_FILE(cluster)
    demo.refuse_a_second_demo(cluster)  # no kept demo: nothing to refuse
    state.write_text(json.dumps({"operator": os.getpid(), "downstream": None}))
    with pytest.raises(demo.DemoRunning, match=r"python demo/run_demo\.py --stop"):
        demo.refuse_a_second_demo(cluster)
    assert state.exists()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    state.write_text(json.dumps({"operator": gone.pid, "downstream": None}))
    demo.refuse_a_second_demo(cluster)
    assert not state.exists()
