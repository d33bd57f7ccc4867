"""Verification matching (rule 5, docs/concepts.md#rollback-rules): the reader's JSON answer must contain ``expect``.

JSON-subset match: every key of an expected object must be in the answer's object, matched
recursively; lists and scalars must be equal (a list is compared whole, in order). Numbers
compare by value (``1 == 1.0``) but booleans are not numbers (``true != 1``).
"""

from __future__ import annotations

import json
from typing import Any

MAX_VALUE_TEXT = 120


def first_mismatch(answer: Any, expect: Any) -> str | None:
    """``None`` when ``answer`` contains ``expect``, else a message naming the first difference.

    The message names the field by dotted path (list positions as numbers), e.g.
    ``status is "succeeded", expected "canceled"``, ``refunded is missing, expected true`` or
    ``charge.amount is 2, expected 3``. A difference at the top names ``the answer``.
    Keys are checked in the order of ``expect``.
    """
    return _mismatch(answer, expect, "")


def parse_answer(text: str) -> Any:
    """Parse a reader's answer (rule 5): its whole output as one JSON document, or else the last
    non-empty line of it (so log lines a reader writes before its answer do no harm).

    Raises ``ValueError`` ("the reader printed no JSON ...") otherwise: a failed read. The
    message gives the output's size, never its content (it may hold anything the reader logs).
    """
    text = text or ""
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines = [line for line in text.splitlines() if line.strip()]
    if lines:
        try:
            return json.loads(lines[-1])
        except ValueError:
            pass
    raise ValueError(f"the reader printed no JSON ({len(text)} characters of output, no JSON document as a whole "
                     "or on its last line); read the reader Job's log")


def _mismatch(answer: Any, expect: Any, path: str) -> str | None:
    if isinstance(expect, dict):
        if not isinstance(answer, dict):
            return f"{_name(path)} is {_show(answer)}, expected an object like {_show(expect)}"
        for key, want in expect.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in answer:
                return f"{where} is missing, expected {_show(want)}"
            found = _mismatch(answer[key], want, where)
            if found:
                return found
        return None
    if not json_equal(answer, expect):
        return f"{_name(path)} is {_show(answer)}, expected {_show(expect)}"
    return None


def json_equal(a: Any, b: Any) -> bool:
    """Equality of two JSON values: dicts by keys and values, lists in order, numbers by value,
    booleans distinct from numbers, ``None`` only equal to ``None``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b):
        return False
    return a == b


def _name(path: str) -> str:
    return path or "the answer"


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > MAX_VALUE_TEXT:
        text = text[: MAX_VALUE_TEXT - 1] + "…"
    return text
