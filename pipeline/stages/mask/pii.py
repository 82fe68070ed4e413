"""PII masking as a pure function: text in, masked text + typed placeholders + counts out.

Presidio's analyzer finds entities (regex recognizers, project recognizers, and spaCy NER for English
when a configured model is installed - never downloaded); its anonymizer resolves overlaps and
replaces each entity with a placeholder `<TYPE_n>`. The same original string gets the same
placeholder throughout one request, so the model still sees that two mentions are one person.

Long texts are analysed in overlapping windows so no pattern ever sees more than WINDOW_CHARS, and
detection fails closed: a recognizer that times out or raises makes `mask` raise `MaskFailed`.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from presidio_analyzer import (
    AnalyzerEngine,
    EntityRecognizer,
    RecognizerRegistry,
    RecognizerResult,
)
from presidio_analyzer.nlp_engine.no_op_nlp_engine import NoOpNlpEngine
from presidio_anonymizer import AnonymizerEngine
from presidio_anonymizer.entities import OperatorConfig

from pipeline.stages.mask.addresses import grow
from pipeline.stages.mask.config import (
    MaskPolicy,
)
from pipeline.stages.mask.names import SpacyPersonRecognizer
from pipeline.stages.mask.recognizers import (
    RECOGNIZERS_REVISION,
    MaskFailed,
    model_recognizers,
    presidio_recognizers,
    project_recognizers,
)

log = logging.getLogger(__name__)

LANGUAGE = "en"  # every recognizer is pattern-based and registered under one language code


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
        self.ner = bool(policy.spacy_model and SpacyPersonRecognizer.available(policy.spacy_model))
        if policy.spacy_model and not self.ner:
            log.warning("mask: spaCy model %r is not installed; English names without a cue go unmasked",
                        policy.spacy_model)
        # no NLP engine: the recognizers that need a model run it themselves, on demand
        nlp = NoOpNlpEngine([{"lang_code": LANGUAGE, "model_name": "none"}])
        registry = RecognizerRegistry(supported_languages=[LANGUAGE])
        recognizers: list[EntityRecognizer] = [
            *presidio_recognizers(LANGUAGE, policy.phone_regions),
            *project_recognizers(LANGUAGE),
            *model_recognizers(LANGUAGE, policy.spacy_model if self.ner else None),
        ]
        for rec in recognizers:
            registry.add_recognizer(rec)
        self.analyzer = AnalyzerEngine(registry=registry, nlp_engine=nlp, supported_languages=[LANGUAGE])
        self.anonymizer = AnonymizerEngine()
        # one analysis at a time per process: threads gain nothing on CPU-bound work under the GIL, and
        # the regex module stops a scan on the process's CPU clock, which other threads' analyses would
        # spend (failclosed.py then retries on the thread's own clock; a 0.2 s budget ran out on a
        # 286-request burst with six threads analysing at once, before the budget was per thread)
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Load every model and list the recognizers use and run each pattern once, so the first
        request does not pay seconds of loading. The warm-up text is no request: if masking it
        fails (a budget run out while the host loads everything at once), say so and go on; a
        request that fails the same way is answered `mask_failed`."""
        for rec in self.analyzer.registry.recognizers:
            warm = getattr(rec, "warm", None)
            if warm is not None:
                warm()
        try:
            self.mask(["warm-up a@b.co 010-0000-0000 김철수님 Jane Doe 12 Main Street"])
        except MaskFailed as exc:
            log.warning("mask: the warm-up text did not mask (%s); starting anyway", exc)

    @property
    def revision(self) -> str:
        presidio = importlib.metadata.version("presidio-analyzer")
        return f"presidio-{presidio}+{RECOGNIZERS_REVISION}" + (f"+{self.policy.spacy_model}" if self.ner else "")

    def analyze(self, text: str) -> list[RecognizerResult]:
        """Entities in `text`, window by window; raises MaskFailed rather than ever skipping detection."""
        try:
            with self._lock:
                found = self._analyze_windows(text)
        except MaskFailed:
            raise
        except Exception as exc:
            raise MaskFailed(f"PII detection failed: {type(exc).__name__}") from exc
        for r in found:  # an address's unit, postcode and city belong to it
            if r.entity_type == "LOCATION":
                r.start, r.end = grow(text, r.start, r.end)
        # the overlaps find an entity twice, or a cut-off piece of it: keep the whole ones
        return EntityRecognizer.remove_duplicates(found)

    def _analyze_windows(self, text: str) -> list[RecognizerResult]:
        found: list[RecognizerResult] = []
        for start, end in windows(text):
            for r in self.analyzer.analyze(text=text[start:end], language=LANGUAGE, entities=self.policy.entities,
                                           score_threshold=self.policy.score_threshold):
                r.start, r.end = r.start + start, r.end + start
                found.append(r)
        return found

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
