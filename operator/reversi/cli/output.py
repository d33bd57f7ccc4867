"""``-o/--output`` of ``kubectl reversi``, as kubectl prints it: pure functions, no I/O.

- ``json``: the document indented by two spaces, keys in the order built (camelCase, as the
  Kubernetes API names them);
- ``yaml``: the same document as block YAML that :func:`yaml.safe_load` reads back equal;
- ``name``: one ``<kind>.<group>/<name>`` line per object (``rollbackrequest.reversi.dev/undo-1``),
  as ``kubectl get -o name`` prints;
- ``wide``: the table with more columns (the views take a ``wide`` flag).

Each command accepts the formats that fit what it prints (:data:`FORMATS` at most); an unknown one
is refused by click's choice check in one line that names the allowed ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

#: Every output format, in the order the help lists them.
FORMATS = ("json", "yaml", "name", "wide")
#: The formats of a document that is not an object and has no table (``version``).
DOCUMENT_FORMATS = ("json", "yaml")
GROUP = "reversi.dev"


def dump(doc: Any, fmt: str) -> str:
    """``doc`` (plain JSON values) as ``json`` or ``yaml`` text, without a trailing newline.
    Raises :class:`ValueError` for another format."""
    if fmt == "json":
        return json.dumps(doc, indent=2, ensure_ascii=False, default=str)
    if fmt == "yaml":
        return yaml.safe_dump(_plain(doc), sort_keys=False, allow_unicode=True, default_flow_style=False).rstrip()
    raise ValueError(f"{fmt!r} is not a document format (json or yaml)")


def _plain(value: Any) -> Any:
    """Tuples as lists and anything else JSON would print with ``default=str`` as a string, so
    ``yaml.safe_dump`` never meets a type it cannot write."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def object_name(kind: str, name: str, group: str = GROUP) -> str:
    """``kubectl get -o name``'s line for an object: ``rollbackrequest.reversi.dev/undo-1``
    (the kind in lower case, then the API group; the core group has none: ``pod/p``)."""
    return f"{kind.lower()}.{group}/{name}" if group else f"{kind.lower()}/{name}"


def names(kind: str, objects: Iterable[str], group: str = GROUP) -> str:
    """:func:`object_name` of each name in ``objects``, one per line."""
    return "\n".join(object_name(kind, n, group) for n in objects)


def list_of(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Objects as kubectl's ``-o json`` prints several: a ``v1`` ``List`` with ``items``."""
    return {"apiVersion": "v1", "kind": "List", "items": [dict(i) for i in items], "metadata": {"resourceVersion": ""}}
