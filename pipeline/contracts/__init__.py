"""Wire contracts: every value on a topic is one of these pydantic models, with a `schema` tag."""

from pydantic import BaseModel

from pipeline.contracts.admit import AdmitRelease, AdmitStateRecord
from pipeline.contracts.control import BreakerUpdate, CacheInvalidate, CachePut, ControlRecord, Marker
from pipeline.contracts.dlq import DlqRecord
from pipeline.contracts.evidence import Evidence
from pipeline.contracts.feedback import Feedback
from pipeline.contracts.request import ChatMessage, ReplyTo, RequestDoc, StageTiming
from pipeline.contracts.response import Response, Status, Usage
from pipeline.contracts.rollout import Rollout, RolloutConsumption
from pipeline.contracts.stream import Cancel, Delta
from pipeline.contracts.weights import WeightEvent

# topic value schema name (as in topics.yaml) -> model; JSON Schemas are generated from this map.
WIRE_MODELS: dict[str, type[BaseModel]] = {
    "request": RequestDoc,
    "response": Response,
    "evidence": Evidence,
    "rollout": Rollout,
    "weight_event": WeightEvent,
    "dlq": DlqRecord,
    "control": ControlRecord,
    "admit_release": AdmitRelease,
    "admit_state": AdmitStateRecord,
    "delta": Delta,
    "cancel": Cancel,
    "feedback": Feedback,
    "rollout_consumption": RolloutConsumption,
}

__all__ = [
    "AdmitRelease",
    "AdmitStateRecord",
    "BreakerUpdate",
    "Cancel",
    "CacheInvalidate",
    "CachePut",
    "ControlRecord",
    "Delta",
    "Marker",
    "WIRE_MODELS",
    "ChatMessage",
    "DlqRecord",
    "Evidence",
    "Feedback",
    "ReplyTo",
    "RequestDoc",
    "Response",
    "Rollout",
    "RolloutConsumption",
    "StageTiming",
    "Status",
    "Usage",
    "WeightEvent",
]
