"""The guardian's SQL history: one repository object (``Store``) and the frozen views it returns."""

from guardian.store.engine import head_revision, mask_url
from guardian.store.errors import NotFoundError, StoreError
from guardian.store.interventions import InterventionEventView, InterventionView
from guardian.store.repository import Store
from guardian.store.views import (
    CLOSED_INCIDENT_STATUSES,
    INCIDENT_OPEN,
    MODES,
    VERDICTS,
    AttemptView,
    CheckpointView,
    FindingView,
    IncidentDetail,
    IncidentView,
    RunView,
)

__all__ = [
    "CLOSED_INCIDENT_STATUSES",
    "INCIDENT_OPEN",
    "MODES",
    "VERDICTS",
    "AttemptView",
    "CheckpointView",
    "FindingView",
    "IncidentDetail",
    "IncidentView",
    "InterventionEventView",
    "InterventionView",
    "NotFoundError",
    "RunView",
    "Store",
    "StoreError",
    "head_revision",
    "mask_url",
]
