"""Shell completion of ``kubectl reversi``, all of it click's own (:mod:`click.shell_completion`):

- ``kubectl reversi completion bash|zsh|fish`` prints click's script for the program
  ``kubectl-reversi``; the script asks the program again (the variable :data:`COMPLETE_VAR`) for
  the candidates of each word;
- ``kubectl_complete-reversi ARGS... WORD`` is what kubectl 1.26+ runs to complete
  ``kubectl reversi ARGS... WORD<TAB>`` (a leading ``__complete``, as cobra plugins are called,
  is accepted too): it prints the candidates one per line, then cobra's directive line
  (``:4``, no file completion; ``:0`` when a candidate is a file or a folder, so the shell
  completes paths).
"""

from __future__ import annotations

import click
from click.shell_completion import ShellComplete, get_completion_class

from .common import out

#: The program the scripts complete (pip's console script) and click's variable for it.
PROG = "kubectl-reversi"
COMPLETE_VAR = "_KUBECTL_REVERSI_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
#: cobra's ShellCompDirective values kubectl reads from a plugin's last line.
DIRECTIVE_DEFAULT = 0
DIRECTIVE_NO_FILE = 4


def script(root: click.Command, shell: str) -> str:
    """Click's completion script of ``shell`` for :data:`PROG`. Raises :class:`ValueError` for a
    shell click does not support."""
    cls = get_completion_class(shell)
    if cls is None:
        raise ValueError(f"no completion for shell {shell!r}; choose one of {', '.join(SHELLS)}")
    return cls(root, {}, PROG, COMPLETE_VAR).source()


def kubectl_complete(root: click.Command, argv: list[str]) -> str:
    """The answer to kubectl's plugin completion: ``argv`` are the words after ``kubectl
    reversi``, the last one the word being completed (empty: a new word). Candidates one per
    line, then ``:<directive>``."""
    words = argv[1:] if argv[:1] == ["__complete"] else list(argv)
    args, incomplete = (words[:-1], words[-1]) if words else ([], "")
    items = ShellComplete(root, {}, PROG, COMPLETE_VAR).get_completions(args, incomplete)
    paths = any(item.type in ("file", "dir") for item in items)
    values = [item.value for item in items if item.type == "plain"]
    return "\n".join([*values, f":{DIRECTIVE_DEFAULT if paths else DIRECTIVE_NO_FILE}"])


@click.command("completion", help="Print the shell completion script of kubectl-reversi for bash, zsh or fish, "
                                  "e.g. source <(kubectl reversi completion bash). kubectl reversi<TAB> (kubectl "
                                  "1.26+) completes through the kubectl_complete-reversi program installed with the "
                                  "plugin instead.")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> int:
    out(script(click.get_current_context().find_root().command, shell))
    return 0
