"""PII masking as a pure function: text in, masked text + typed placeholders + counts out.

Presidio's analyzer finds entities (regex recognizers, project recognizers, and spaCy NER only
when a configured model is installed - never downloaded); its anonymizer resolves overlaps and
replaces each entity with a placeholder `<TYPE_n>`. The same original string gets the same
placeholder throughout one request, so the model still sees that two mentions are one person.

Long texts are analysed in overlapping windows so no pattern ever sees more than WINDOW_CHARS, and
detection fails closed: a recognizer that times out or raises makes `mask` raise `MaskFailed`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from presidio_analyzer import AnalyzerEngine, EntityRecognizer, RecognizerRegistry, RecognizerResult
from presidio_analyzer.nlp_engine import NlpEngineProvider
from presidio_analyzer.nlp_engine.no_op_nlp_engine import NoOpNlpEngine
from presidio_analyzer.predefined_recognizers import PhoneRecognizer, SpacyRecognizer
from presidio_anonymizer import AnonymizerEngine
from presidio_anonymizer.entities import OperatorConfig
from pydantic import BaseModel, Field

from pipeline.stages.mask.recognizers import (
    RECOGNIZERS_REVISION,
    FailClosedCreditCardRecognizer,
    FailClosedIpRecognizer,
    FailClosedKrRrnRecognizer,
    MaskFailed,
    OfflineEmailRecognizer,
    project_recognizers,
)

log = logging.getLogger(__name__)

LANGUAGE = "en"  # every recognizer is pattern-based and registered under one language code

DEFAULT_ENTITIES = ["EMAIL_ADDRESS", "PHONE_NUMBER", "KR_RRN", "CREDIT_CARD", "IP_ADDRESS", "PERSON", "LOCATION"]

WINDOW_CHARS = 2_000
# consecutive windows share at least this much, so any entity (an email is at most 254 chars) with its
# context lies whole in one window
WINDOW_OVERLAP = 300
_CUT_SLACK = 100  # how far back a window edge may move to land on whitespace


def _after_last_space(text: str, lo: int, hi: int) -> int | None:
    return next((i + 1 for i in range(hi - 1, max(lo, 0) - 1, -1) if text[i].isspace()), None)


def windows(text: str, size: int = WINDOW_CHARS, overlap: int = WINDOW_OVERLAP) -> Iterator[tuple[int, int]]:
    """[start, end) spans covering `text`; edges prefer whitespace so no word is cut when one can help it."""
    start, n = 0, len(text)
    while True:
        end = n if start + size >= n else (_after_last_space(text, start + size - _CUT_SLACK, start + size)
                                           or start + size)
        yield start, end
        if end >= n:
            return
        start = _after_last_space(text, end - overlap - _CUT_SLACK, end - overlap) or end - overlap


class MaskPolicy(BaseModel):
    version: str = "mask-v1"
    score_threshold: float = Field(0.4, ge=0, le=1)
    entities: list[str] = Field(default_factory=lambda: list(DEFAULT_ENTITIES))
    phone_regions: list[str] = Field(default_factory=lambda: ["KR", "US", "GB", "DE", "FR", "JP", "CN", "IN", "CA"])
    # spaCy NER model package (e.g. "en_core_web_sm"): used when installed, else off
    spacy_model: str | None = None


@dataclass
class MaskResult:
    texts: list[str]
    counts: Counter = field(default_factory=Counter)
    mapping: dict[str, str] = field(default_factory=dict)  # placeholder -> original; never logged

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Masker:
    def __init__(self, policy: MaskPolicy) -> None:
        self.policy = policy
        self.ner = bool(policy.spacy_model and importlib.util.find_spec(policy.spacy_model))
        if policy.spacy_model and not self.ner:
            log.warning("mask: spaCy model %r is not installed; NER stays off", policy.spacy_model)
        if self.ner:
            nlp = NlpEngineProvider(nlp_configuration={
                "nlp_engine_name": "spacy", "models": [{"lang_code": LANGUAGE, "model_name": policy.spacy_model}]
            }).create_engine()
        else:
            nlp = NoOpNlpEngine([{"lang_code": LANGUAGE, "model_name": "none"}])
        registry = RecognizerRegistry(supported_languages=[LANGUAGE])
        for rec in [
            OfflineEmailRecognizer(supported_language=LANGUAGE),
            PhoneRecognizer(supported_language=LANGUAGE, supported_regions=tuple(policy.phone_regions)),
            FailClosedCreditCardRecognizer(supported_language=LANGUAGE),
            FailClosedIpRecognizer(supported_language=LANGUAGE),
            FailClosedKrRrnRecognizer(supported_language=LANGUAGE),
            *project_recognizers(LANGUAGE),
            *([SpacyRecognizer(supported_language=LANGUAGE)] if self.ner else []),
        ]:
            registry.add_recognizer(rec)
        self.analyzer = AnalyzerEngine(registry=registry, nlp_engine=nlp, supported_languages=[LANGUAGE])
        self.anonymizer = AnonymizerEngine()

    @property
    def revision(self) -> str:
        presidio = importlib.metadata.version("presidio-analyzer")
        return f"presidio-{presidio}+{RECOGNIZERS_REVISION}" + (f"+{self.policy.spacy_model}" if self.ner else "")

    def analyze(self, text: str) -> list[RecognizerResult]:
        """Entities in `text`, window by window; raises MaskFailed rather than ever skipping detection."""
        found: list[RecognizerResult] = []
        try:
            for start, end in windows(text):
                for r in self.analyzer.analyze(text=text[start:end], language=LANGUAGE, entities=self.policy.entities,
                                               score_threshold=self.policy.score_threshold):
                    r.start, r.end = r.start + start, r.end + start
                    found.append(r)
        except MaskFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - any recognizer failure: the text must not pass
            raise MaskFailed(f"PII detection failed: {type(exc).__name__}") from exc
        # the overlaps find an entity twice, or a cut-off piece of it: keep the whole ones
        return EntityRecognizer.remove_duplicates(found)

    def mask(self, texts: list[str]) -> MaskResult:
        result = MaskResult(texts=[])
        by_value: dict[tuple[str, str], str] = {}

        def placeholder_for(entity: str):
            def replace(value: str) -> str:
                key = (entity, value)
                if key not in by_value:
                    result.counts[entity] += 1
                    by_value[key] = f"<{entity}_{result.counts[entity]}>"
                    result.mapping[by_value[key]] = value
                return by_value[key]

            return replace

        for text in texts:
            found = self.analyze(text)
            if not found:
                result.texts.append(text)
                continue
            operators = {r.entity_type: OperatorConfig("custom", {"lambda": placeholder_for(r.entity_type)})
                         for r in found}
            result.texts.append(self.anonymizer.anonymize(text=text, analyzer_results=found, operators=operators).text)
        return result
