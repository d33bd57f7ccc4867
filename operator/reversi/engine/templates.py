"""Argument templates: ``$args.a.b`` / ``$result.items.0.id`` taken from the original call
(docs/concepts.md#vocabulary).

A *string* that is exactly ``$args`` or ``$result``, optionally followed by ``.segment`` parts, is
a reference: it is replaced by that value of the original call (its ``args`` or its ``result``).
A segment walks into a dict by key, or into a list by a decimal index (``items.0``). Any other
value (numbers, other strings such as ``"order $args.x"``, ``null``) is literal. Dicts and lists
are resolved recursively (values only; keys are never templates).

A reference that cannot be followed raises :class:`MissingValue` naming the path: Reversi never
guesses. A JSON ``null`` found at the end of a reference counts as missing too (an undo called
with ``charge_id: null`` would be a guess).
"""

from __future__ import annotations

from typing import Any

ROOTS = ("args", "result")


class MissingValue(LookupError):
    """A template names a value the original call does not have.

    ``path`` is the template (``"$result.id"``); ``reason`` says which part is missing.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def is_reference(value: Any) -> bool:
    """Whether ``value`` is a template reference (``$args...`` or ``$result...``)."""
    if not isinstance(value, str) or not value.startswith("$"):
        return False
    head = value[1:].split(".", 1)[0]
    return head in ROOTS


def lookup(path: str, args: dict[str, Any] | None, result: dict[str, Any] | None) -> Any:
    """The value a reference ``path`` names in the call's ``args`` / ``result``.

    Raises :class:`MissingValue` when any segment is missing, a list index is out of range or not
    a number, the walk reaches a scalar, the call has no result, or the value found is null.
    """
    root, _, rest = path[1:].partition(".")
    if root not in ROOTS:
        raise MissingValue(path, f"unknown root ${root}; use $args or $result")
    current: Any = args if root == "args" else result
    if current is None:
        raise MissingValue(path, "the call has no result" if root == "result" else "the call has no args")
    segments = rest.split(".") if rest or path.endswith(".") else []
    for i, segment in enumerate(segments):
        if segment == "":
            raise MissingValue(path, f"empty segment after {_walked(root, segments, i)}")
        if isinstance(current, dict):
            if segment not in current:
                raise MissingValue(path, f"{_walked(root, segments, i)} has no {segment!r}")
            current = current[segment]
        elif isinstance(current, list):
            if not (segment.isdigit() and segment.isascii()):
                raise MissingValue(path, f"{_walked(root, segments, i)} is a list; {segment!r} is not an index")
            position = int(segment)
            if position >= len(current):
                raise MissingValue(path, f"{_walked(root, segments, i)} has {len(current)} items; no index {position}")
            current = current[position]
        else:
            raise MissingValue(path, f"{_walked(root, segments, i)} is not an object or a list")
    if current is None:
        raise MissingValue(path, f"{_walked(root, segments, len(segments))} is null")
    return current


def _walked(root: str, segments: list[str], count: int) -> str:
    """The reference walked so far (for messages): ``$root`` and the first ``count`` segments."""
    return ".".join([f"${root}", *segments[:count]])


def resolve(template: Any, args: dict[str, Any] | None, result: dict[str, Any] | None) -> Any:
    """Resolve ``template`` (any JSON value) against the original call.

    Returns a new JSON value (the input is not modified); references are replaced by their values
    (the values are copied, so the caller may change the output freely).
    Raises :class:`MissingValue` for the first reference that cannot be resolved.
    """
    if isinstance(template, str):
        if is_reference(template):
            return _copy(lookup(template, args, result))
        return template
    if isinstance(template, dict):
        return {key: resolve(value, args, result) for key, value in template.items()}
    if isinstance(template, list):
        return [resolve(value, args, result) for value in template]
    return template


def references(template: Any) -> list[str]:
    """Every reference in ``template``, in document order (for messages and checks)."""
    out: list[str] = []
    if isinstance(template, str):
        if is_reference(template):
            out.append(template)
    elif isinstance(template, dict):
        for value in template.values():
            out.extend(references(value))
    elif isinstance(template, list):
        for value in template:
            out.extend(references(value))
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
