"""Each journal entry is whole (rule 3, docs/concepts.md#the-journal): the merge patch that records a
step's undo on its RunStep removes every field the new entry does not have, so nothing of an
earlier attempt (its ``effectUnknown``, its ``lastError``) outlives the write that settled it."""

from __future__ import annotations

from reversi.adapters.journal import undo_patch
from reversi.models.run import StepUndo

KEY = "a" * 64


def _merge(stored: dict, patch: dict) -> dict:
    """RFC 7386 merge patch, as the API server applies it."""
    out = dict(stored)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def test_an_answer_after_an_unknown_attempt_clears_effect_unknown_and_a_success_clears_the_error():
    stopped = StepUndo(step=3, state="compensationFailed", attempts=1, idempotency_key=KEY, request="a",
                       last_error="evicted mid-call", effect_unknown=True)
    answered = StepUndo(step=3, state="compensationFailed", attempts=2, idempotency_key=KEY, request="b",
                        last_error="exit 1: card declined")
    done = StepUndo(step=3, state="compensated", attempts=3, idempotency_key=KEY, request="c", verification="none")
    stored: dict = {}
    for entry in (stopped, answered):
        stored = _merge(stored, undo_patch(entry))
    undo = stored["status"]["undo"]
    assert "effectUnknown" not in undo and undo["lastError"] == "exit 1: card declined" and undo["request"] == "b"
    stored = _merge(stored, undo_patch(done))
    assert StepUndo.model_validate(stored["status"]["undo"]) == done


def test_the_patch_carries_every_field_of_the_entry():
    entry = StepUndo(step=0, state="compensating", attempts=1, idempotency_key=KEY, request="a")
    undo = undo_patch(entry)["status"]["undo"]
    assert {k: v for k, v in undo.items() if v is not None} == entry.to_wire()
    assert set(undo) == {f.alias or n for n, f in StepUndo.model_fields.items()}
