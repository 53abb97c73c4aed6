"""The guardian's SQL history: one repository object (``Store``) and the frozen views it returns."""

from guardian.store.engine import head_revision, mask_url
from guardian.store.errors import NotFoundError, StoreError
from guardian.store.evaluations import EvaluationView
from guardian.store.interventions import (
    ConfigChange,
    InterventionEventView,
    InterventionView,
    StateDetail,
    StoredPlan,
    config_changes,
)
from guardian.store.repository import Store
from guardian.store.views import (
    MODES,
    VERDICTS,
    AttemptView,
    CheckpointView,
    FindingView,
    IncidentDetail,
    IncidentView,
    RunView,
    StepIndex,
)

__all__ = [
    "MODES",
    "VERDICTS",
    "AttemptView",
    "CheckpointView",
    "ConfigChange",
    "EvaluationView",
    "FindingView",
    "IncidentDetail",
    "IncidentView",
    "InterventionEventView",
    "InterventionView",
    "NotFoundError",
    "RunView",
    "StateDetail",
    "StepIndex",
    "Store",
    "StoreError",
    "StoredPlan",
    "config_changes",
    "head_revision",
    "mask_url",
]
