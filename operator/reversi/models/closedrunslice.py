"""ClosedRunSlice (namespaced): one slice of the runs a rollback has closed in its namespace, the
param of the lock policy (rule 11; docs/concepts.md#admission).

The closed runs of a namespace are sliced the way EndpointSlices slice Endpoints: a run belongs
to slice ``reversi-closed-runs-<nn>`` by a hash of its name (:data:`SLICES` slices), and each
slice holds at most :data:`SLICE_CAPACITY` runs, so no object grows past a fixed size whatever
the number of closed runs. ``spec.runs`` maps a run's name to ``<run uid> <RollbackRequest>``
(``... ended`` once that request released it: the run stays closed). The lock policy refuses a
recorded call of a run whose entry names the uid the call carries; an entry goes with its Run.

Only the operator writes slices (no user role is given this kind): whoever may delete one
reopens its runs to recorded calls.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .common import MAX_NAME, CrdInfo, ReversiModel, StatusModel, rule
from .runstep import MAX_RUN_NAME

#: slices per namespace: a run's slice is a hash of its name modulo this
SLICES = 16
#: runs one slice holds at most (its schema's ``maxProperties``): with run names of at most
#: :data:`~reversi.models.runstep.MAX_RUN_NAME` characters, entries of at most :data:`MAX_ENTRY`
#: and the API server's managedFields (one item per run, about 30 bytes besides the name), a
#: slice stays under 0.9 MB, well within etcd's 1.5 MiB
SLICE_CAPACITY = 2000
#: longest entry: a uid (36), a space, a RollbackRequest's name, `` ended``
MAX_ENTRY = 36 + 1 + MAX_NAME + 6

Entry = Annotated[str, Field(max_length=MAX_ENTRY)]


class ClosedRunSliceSpec(ReversiModel):
    """The runs of this slice that a rollback has closed."""

    runs: dict[str, Entry] = Field(
        default_factory=dict, json_schema_extra={"maxProperties": SLICE_CAPACITY, "x-kubernetes-validations": [
            rule(f"self.all(run, size(run) <= {MAX_RUN_NAME})", f"a run name is at most {MAX_RUN_NAME} characters")]},
        description=f"Run name -> '<run uid> <RollbackRequest>' ('... ended' once the request released the lock); "
                    f"at most {SLICE_CAPACITY} runs.")


class ClosedRunSliceStatus(StatusModel):
    """Nothing is reported on a slice."""


CRD = CrdInfo(
    kind="ClosedRunSlice",
    plural="closedrunslices",
    singular="closedrunslice",
    short_names=["rvclosed"],
    description="A slice of the runs a rollback has closed in this namespace: the param of the lock policy, "
                "written by the operator only.",
    spec_model=ClosedRunSliceSpec,
    status_model=ClosedRunSliceStatus,
    reconciled=False,
    printer_columns=[{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
)
