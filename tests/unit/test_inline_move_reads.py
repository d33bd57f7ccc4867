"""The admission server's reads while it moves a Reversi 0.1 Run's inline journal to RunSteps
(reversi.handlers.admission; docs/concepts.md#the-journal): the Run is read for the first
moved step and kept on the process's parts (``Parts.inline``), so each later moved copy of an
inline step, owned by the same Run, needs no read; a step that is not a moved copy reads it again.
What is kept is the process's own: the parts of another process (or of kopf started again) keep
nothing of it."""

from __future__ import annotations

from reversi.adapters import journal as jr
from reversi.handlers import admission as adm
from reversi.handlers import runtime
from reversi.models.run import RunSpec
from reversi.settings import OperatorSettings

SNAP = {"name": "payments.get_customer", "effect": "read"}


def _run(uid: str = "u-r") -> dict:
    steps = [{"index": i, "tool": "payments.get_customer", "args": {"id": f"cus_{i}"}, "outcome": "succeeded",
              "snapshot": SNAP} for i in range(3)]
    return {"metadata": {"namespace": "shop", "name": "r", "uid": uid, "resourceVersion": "7"},
            "spec": {"manifestRef": {"name": "payments"}, "principal": "agent-a", "steps": steps}}


class Reads:
    """The API as the admission server reads it for a new step: counts the Run's reads."""

    def __init__(self, run: dict) -> None:
        self.run = run
        self.run_reads = 0

    def get(self, plural, namespace, name):
        if plural == "runs":
            self.run_reads += 1
            return self.run
        return None

    def list(self, plural, namespace=None, cached=False):
        return []


def _moved(run: dict, index: int) -> dict:
    """The RunStep the operator's move creates for inline step ``index`` (owned by the Run)."""
    spec = RunSpec.model_validate(run["spec"])
    inline = jr.inline_step_spec(spec, next(s for s in spec.steps if s.index == index))
    return jr.step_body("shop", "r", inline, owner_uid=run["metadata"]["uid"])


def _parts(kube: Reads) -> runtime.Parts:
    return runtime.build_admission(OperatorSettings(), kube)  # type: ignore[arg-type]  # reads only


def test_a_moved_step_is_recognised_from_the_run_kept_on_the_parts():
    run = _run()
    kube = Reads(run)
    parts = _parts(kube)
    try:
        assert adm._read_for_new_step(parts, "shop", "r", 0, _moved(run, 0)).run == run
        assert kube.run_reads == 1 and parts.inline.runs[("shop", "r")] is run
        for index in (1, 2):  # the rest of the move: no read
            assert adm._read_for_new_step(parts, "shop", "r", index, _moved(run, index)).run is run
        assert kube.run_reads == 1
        other = _moved(run, 1)
        other["spec"]["args"] = {"id": "cus_other"}  # not the moved copy of an inline step: read again
        adm._read_for_new_step(parts, "shop", "r", 1, other)
        assert kube.run_reads == 2
    finally:
        assert parts.reads is not None
        parts.reads.shutdown()


def test_a_step_owned_by_another_run_of_that_name_is_not_taken_as_moved():
    run = _run()
    kube = Reads(run)
    parts = _parts(kube)
    try:
        adm._read_for_new_step(parts, "shop", "r", 0, _moved(run, 0))
        adm._read_for_new_step(parts, "shop", "r", 1, _moved(_run(uid="u-new"), 1))
        assert kube.run_reads == 2
    finally:
        assert parts.reads is not None
        parts.reads.shutdown()


def test_what_is_kept_is_the_processs_own():
    run = _run()
    first, second = Reads(run), Reads(run)
    first_parts, second_parts = _parts(first), _parts(second)
    try:
        adm._read_for_new_step(first_parts, "shop", "r", 0, _moved(run, 0))
        adm._read_for_new_step(second_parts, "shop", "r", 1, _moved(run, 1))
        assert (first.run_reads, second.run_reads) == (1, 1)  # the second read its Run itself
        assert first_parts.inline is not second_parts.inline
    finally:
        for parts in (first_parts, second_parts):
            assert parts.reads is not None
            parts.reads.shutdown()


def test_at_most_a_few_runs_are_kept_the_oldest_dropped_first():
    parts = runtime.Parts(OperatorSettings(), Reads(_run()))  # type: ignore[arg-type]
    for n in range(runtime.INLINE_KEPT + 2):
        run = {**_run(), "metadata": {**_run()["metadata"], "name": f"r{n}"}}
        adm._run_of_step(parts.inline, Reads(run), "shop", f"r{n}")  # type: ignore[arg-type]
    assert list(parts.inline.runs) == [("shop", f"r{n}") for n in range(2, runtime.INLINE_KEPT + 2)]
