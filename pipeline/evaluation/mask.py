"""`llmpipe mask-eval`: recall per PII type, false positives on negatives, and ms per request.

A labelled value counts as caught only when every letter and digit of it lies inside a detected
span (any type: a leak is a leak, and a street masked as a person leaks nothing). A value that is
half masked ("<PERSON_1> Smith") is a miss. A negative sentence (no labelled value) with any
detection is a false positive; detections on positive sentences that touch no labelled value are
counted as `spurious` (over-masking costs the model context, not privacy).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pipeline.runtime.serve.metrics import percentile
from pipeline.stages.mask.pii import Masker


@dataclass(frozen=True)
class Labelled:
    text: str
    lang: str
    pii: tuple[tuple[str, str], ...]  # (type, value), value a substring of text


def read_sentences(path: Path) -> list[Labelled]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            o = orjson.loads(line)
            text = o["text"]
            pii = tuple((p["type"], p["value"]) for p in o["pii"])
            for _, value in pii:
                if not value or value not in text:
                    raise ValueError(f"value {value!r} is not in the text")
            lang = o.get("lang") or ("ko" if any("\uac00" <= ch <= "\ud7a3" for ch in text) else "en")
            rows.append(Labelled(text, lang, pii))
        except (orjson.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: {exc}") from None
    return rows


def _covered(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> bool:
    return all(any(s <= i < e for s, e in spans) for i in range(start, end) if text[i].isalnum())


def _occurrences(text: str, value: str) -> list[int]:
    out, i = [], text.find(value)
    while i >= 0:
        out.append(i)
        i = text.find(value, i + 1)
    return out


def evaluate(masker: Masker, rows: list[Labelled], on_row: Callable[[], None] | None = None) -> dict[str, Any]:
    total: Counter[str] = Counter()
    caught: Counter[str] = Counter()
    by_lang: dict[str, Counter[str]] = defaultdict(Counter)
    misses: list[dict[str, str]] = []
    negatives = false_positive = spurious = 0
    fp_types: Counter[str] = Counter()
    ms: list[float] = []
    masker.warm()  # as the stage does at start: models and lists load before the first request
    for row in rows:
        t0 = time.perf_counter()
        found = masker.analyze(row.text)
        masker.mask([row.text])  # the full per-request path, anonymizer included, is what is timed
        ms.append((time.perf_counter() - t0) * 1000)
        spans = [(r.start, r.end) for r in found]
        labelled_spans = []
        for kind, value in row.pii:
            starts = _occurrences(row.text, value)
            labelled_spans += [(s, s + len(value)) for s in starts]
            ok = all(_covered(row.text, s, s + len(value), spans) for s in starts)
            total[kind] += 1
            by_lang[row.lang]["total"] += 1
            if ok:
                caught[kind] += 1
                by_lang[row.lang]["caught"] += 1
            else:
                misses.append({"type": kind, "lang": row.lang})
        if not row.pii:
            negatives += 1
            if found:
                false_positive += 1
                fp_types.update(r.entity_type for r in found)
        else:
            spurious += sum(not any(s < le and ls < e for ls, le in labelled_spans) for s, e in spans)
        if on_row:
            on_row()
    return {
        "sentences": len(rows),
        "recall": {k: {"values": total[k], "caught": caught[k], "recall": round(caught[k] / total[k], 4)}
                   for k in sorted(total)},
        "recall_overall": round(sum(caught.values()) / max(1, sum(total.values())), 4),
        "recall_by_lang": {lang: round(c["caught"] / max(1, c["total"]), 4) for lang, c in sorted(by_lang.items())},
        "negatives": negatives,
        "false_positives": false_positive,
        "false_positive_rate": round(false_positive / negatives, 4) if negatives else None,
        "false_positive_types": dict(fp_types),
        "spurious_spans_on_positives": spurious,
        "ms_per_request": {"p50": percentile(ms, 50), "p95": percentile(ms, 95), "max": round(max(ms), 2) if ms else None},
        # types and languages only: the report never holds a PII value or a sentence
        "misses": misses,
    }
