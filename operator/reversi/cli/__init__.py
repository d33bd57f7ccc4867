"""``kubectl reversi``: the kubectl plugin (installed by pip as ``kubectl-reversi``).

- :mod:`reversi.cli.views`: pure formatting (tables, the describe report, the documents of
  ``-o json|yaml``, ``export``'s records); no I/O, unit-tested;
- :mod:`reversi.cli.output`: pure ``-o json|yaml|name|wide`` rendering, as kubectl prints;
- :mod:`reversi.cli.api`: the connection (kubeconfig, context, namespace) and the few API reads
  and writes the commands need, with API errors turned into one line that names the fix;
- :mod:`reversi.cli.common`: what every command shares (global options, the connection, ``-o``);
- :mod:`reversi.cli.main`: the click commands; :mod:`reversi.cli.logs` (``logs``),
  :mod:`reversi.cli.completion` (``completion`` and ``kubectl_complete-reversi``) and
  :mod:`reversi.cli.check` (``check``) hold one command each.

Exit codes: 0 done (and, for ``plan``/``rollback --wait``, fully reversible or complete);
1 an error (one line on stderr: ``error: ...``); 2 the answer is "not (fully) undone".
"""
