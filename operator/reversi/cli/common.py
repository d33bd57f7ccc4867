"""What every ``kubectl reversi`` command shares: the global options and the connection they make,
``-o/--output``, and printing. The command modules (:mod:`reversi.cli.main`, :mod:`reversi.cli.logs`,
:mod:`reversi.cli.completion`) import it; it imports none of them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import click

from click.shell_completion import CompletionItem

from ..adapters import apicalls as calls
from . import output as formats
from .api import CliError, Connection, connect

#: The key of this plugin's values in ``click.Context.meta`` (global options, the connection).
META = "reversi.cli"
SERVERS_SEEN: list[str] = []  # the API server of this invocation, for "cannot reach" errors


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Store a global option in the shared context meta (a value after the command wins)."""
    if value is not None:
        ctx.meta.setdefault(META, {})[param.name] = value
    return value


def global_options(f: Callable) -> Callable:
    """``--kubeconfig``, ``--context``, ``-n/--namespace`` on the group and on every command."""
    f = click.option("-n", "--namespace", default=None, expose_value=False, callback=_remember,
                     help="Namespace (default: the context's, else default).")(f)
    f = click.option("--context", default=None, expose_value=False, callback=_remember,
                     help="kubeconfig context (default: the current one).")(f)
    f = click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, expose_value=False,
                     callback=_remember,
                     help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).")(f)
    return f


def given_namespace() -> str | None:
    """``-n/--namespace`` as given (before or after the command), else ``None``."""
    return click.get_current_context().meta.get(META, {}).get("namespace")


def conn(ctx: click.Context | None = None) -> Connection:
    """The connection for this invocation (made on first use); ``ctx``: the context to read the
    global options from (default: click's current one)."""
    ctx = ctx or click.get_current_context()
    meta = ctx.meta.setdefault(META, {})
    if "connection" not in meta:
        meta["connection"] = connect(meta.get("kubeconfig"), meta.get("context"), meta.get("namespace"))
        SERVERS_SEEN.append(meta["connection"].server)
    return meta["connection"]


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def out(text: str = "") -> None:
    click.echo(text)


def remark(text: str) -> None:
    """A remark for the person (stderr), not part of the output a script reads."""
    click.echo(text, err=True)


# ---------------------------------------------------------------------------- completion

#: How long shell completion waits for the API server's answer (one attempt, no retry).
COMPLETION_TIMEOUT = 3.0


def complete_names(plural: str) -> Callable[[click.Context, click.Parameter, str], list[CompletionItem]]:
    """A ``shell_complete`` for an argument that names an object of the namespace: the names of
    ``plural`` (``runs``, ``rollbackrequests``, ``halts``) that start with the word typed, from one
    LIST of the API server's cache with the global options given so far. Nothing (the shell offers
    no candidate) when the cluster cannot be read: completion never prints an error."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            c = conn(ctx)
            names = calls.list_objects(c.custom, plural, c.namespace, cached=True, timeout=COMPLETION_TIMEOUT,
                                       policy=calls.Policy(attempts=1), keep=lambda o: o["metadata"]["name"])
        except Exception:  # noqa: BLE001 - any failure means no candidates, never a message in the shell
            return []
        return [CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]

    return complete


# ------------------------------------------------------------------------------------ -o


_OUTPUT_HELP = {
    "json": "JSON", "yaml": "YAML", "name": "kind.group/name lines", "wide": "the table with more columns",
}


def _json_alias(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta.setdefault(META, {})["json_alias"] = True
    return value


def output_option(*allowed: str, what: str = "the result") -> Callable[[Callable], Callable]:
    """``-o/--output`` with the formats ``allowed`` (a subset of :data:`output.FORMATS`; click
    refuses any other in one line naming them) and a hidden ``--json``, the deprecated alias of
    ``-o json`` (a warning on stderr says so). The command reads the choice with
    :func:`output_of`."""
    allowed = allowed or formats.FORMATS
    shown = ", ".join(f"{f} ({_OUTPUT_HELP[f]})" for f in allowed)

    def decorate(f: Callable) -> Callable:
        f = click.option("--json", "json_alias", is_flag=True, hidden=True, expose_value=False,
                         callback=_json_alias, help="Deprecated: -o json.")(f)
        return click.option("-o", "--output", type=click.Choice(allowed), default=None,
                            help=f"Print {what} as: {shown}.")(f)

    return decorate


def output_of(output: str | None) -> str | None:
    """The format chosen with ``-o`` or with the deprecated ``--json``; both given differently:
    :class:`click.UsageError`."""
    alias = click.get_current_context().meta.get(META, {}).get("json_alias")
    if not alias:
        return output
    if output not in (None, "json"):
        raise click.UsageError(f"--json means -o json; give -o {output} alone")
    remark("warning: --json is deprecated; use -o json (its keys are now camelCase, as the Kubernetes API has "
           "them: fullyReversible, not fully_reversible)")
    return "json"


def print_document(doc: Any, fmt: str) -> None:
    """Print ``doc`` as ``json`` or ``yaml`` (:func:`output.dump`)."""
    out(formats.dump(doc, fmt))


# ------------------------------------------------------------------------------- errors


#: Modules an optional extra of pyproject.toml installs, and that extra's name.
MODULE_EXTRAS = {"psycopg": "archive", "mcp": "gateway", "uvicorn": "gateway", "starlette": "gateway"}


def missing_module(err: ImportError) -> str:
    """The one line for a module that could not be imported: the extra that installs it
    (``pip install 'reversi[archive]'``), else a reinstall of the plugin."""
    top = (err.name or "").split(".")[0]
    extra = MODULE_EXTRAS.get(top)
    if extra:
        return f"this command needs {top}, which is not installed: pip install 'reversi[{extra}]'"
    return (f"a module kubectl reversi needs cannot be imported ({top or err}); reinstall it: "
            "pip install --force-reinstall reversi")


__all__ = ["META", "MODULE_EXTRAS", "SERVERS_SEEN", "CliError", "complete_names", "conn", "global_options",
           "given_namespace",
           "missing_module", "now", "out", "output_of", "output_option", "print_document", "remark"]
