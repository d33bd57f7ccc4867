"""``kubectl reversi``: the kubectl plugin (installed by pip as ``kubectl-reversi``).

- :mod:`reversi.cli.views`: pure formatting (tables, the describe report, JSON for ``plan`` and
  ``export``); no I/O, unit-tested;
- :mod:`reversi.cli.api`: the connection (kubeconfig, context, namespace) and the few API reads
  and writes the commands need, with API errors turned into one line that names the fix;
- :mod:`reversi.cli.main`: the click commands.

Exit codes: 0 done (and, for ``plan``/``rollback --wait``, fully reversible or complete);
1 an error (one line on stderr: ``error: ...``); 2 the answer is "not (fully) undone".
"""
