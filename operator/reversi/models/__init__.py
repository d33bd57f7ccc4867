"""Pydantic models of the Reversi kinds (docs/concepts.md): one module per kind, the CRDs are generated
from them by ``reversi.crdgen``. Wire names are camelCase, Python names snake_case."""

from .common import (
    MAX_RUN_STEPS,
    MAX_STEPS,
    Backoff,
    Condition,
    CrdInfo,
    ObjectRef,
    ReversiModel,
    StatusModel,
)
from .closedrunslice import CRD as CLOSED_RUN_SLICE_CRD
from .halt import (
    CLUSTER_HALT_CRD,
    HALT_CRD,
    ClusterHalt,
    ClusterHaltScope,
    ClusterHaltSpec,
    Halt,
    HaltScope,
    HaltSpec,
    HaltStatus,
)
from .rollbackrequest import CRD as ROLLBACK_REQUEST_CRD
from .rollbackrequest import (
    Approval,
    Force,
    Phase,
    Plan,
    PlanAction,
    Report,
    RollbackRequest,
    RollbackRequestSpec,
    RollbackRequestStatus,
    StepBlocked,
    StepError,
    StepReason,
    StepResidue,
    StepStatus,
)
from .run import CRD as RUN_CRD
from .run import Resolution, Run, RunScope, RunSpec, RunStatus, Step, StepUndo, ToolSnapshot
from .runstep import CRD as RUN_STEP_CRD
from .runstep import RunStep, RunStepSpec, RunStepStatus, StepResolution
from .toolmanifest import CRD as TOOL_MANIFEST_CRD
from .toolmanifest import (
    Compensation,
    Precondition,
    Runner,
    ToolManifest,
    ToolManifestSpec,
    ToolManifestStatus,
    ToolSpec,
    Verification,
)

ALL_CRDS = (TOOL_MANIFEST_CRD, RUN_CRD, RUN_STEP_CRD, ROLLBACK_REQUEST_CRD, HALT_CRD, CLUSTER_HALT_CRD,
            CLOSED_RUN_SLICE_CRD)

__all__ = [
    "ALL_CRDS",
    "Approval",
    "Force",
    "Backoff",
    "CLUSTER_HALT_CRD",
    "ClusterHalt",
    "ClusterHaltScope",
    "ClusterHaltSpec",
    "Compensation",
    "Precondition",
    "Condition",
    "CrdInfo",
    "HALT_CRD",
    "Halt",
    "HaltScope",
    "HaltSpec",
    "HaltStatus",
    "MAX_RUN_STEPS",
    "MAX_STEPS",
    "ObjectRef",
    "Phase",
    "Plan",
    "PlanAction",
    "ROLLBACK_REQUEST_CRD",
    "RUN_CRD",
    "RUN_STEP_CRD",
    "RunStep",
    "RunStepSpec",
    "RunStepStatus",
    "StepResolution",
    "Report",
    "Resolution",
    "ReversiModel",
    "RollbackRequest",
    "RollbackRequestSpec",
    "RollbackRequestStatus",
    "Run",
    "RunScope",
    "RunSpec",
    "RunStatus",
    "Runner",
    "StatusModel",
    "Step",
    "StepBlocked",
    "StepError",
    "StepReason",
    "StepResidue",
    "StepStatus",
    "StepUndo",
    "TOOL_MANIFEST_CRD",
    "ToolManifest",
    "ToolManifestSpec",
    "ToolManifestStatus",
    "ToolSnapshot",
    "ToolSpec",
    "Verification",
]
