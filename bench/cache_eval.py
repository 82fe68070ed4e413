"""Semantic cache on every labelled pair set: precision, recall and false hits, tuned and held out side by side.

    .venv/bin/python bench/cache_eval.py            # all 10 sets, 3,701 pairs (~4 min)
    .venv/bin/python bench/cache_eval.py --quick    # the shipped set and the held-out set (~1 min)
    .venv/bin/python bench/cache_eval.py --sets cache_pairs_unseen5 --gate-only   # the gate without the verifier

What `llmpipe cache-eval --pairs F` does per file, for every file of tests/data/cache_pairs*.jsonl, with
one embedder loaded once: each pair's `a` is written as a fresh entry (its own data version) into a
fresh embedded index, `b` is looked up, hit/miss is compared to the label (pipeline/evaluation/cache.py).
Default cache policy and the shipped verifier. Per set: precision, recall, false hits, cross-tenant
and volatile hits, lookup ms, then per kind and per language; why the `same` pairs missed (bypass,
below threshold, the gate's failed checks, the verifier); where the false hits are (line and kind,
never the text: a held-out set is not read for failure patterns). Sets are marked `tuned` (the gate's
lexicon and rules or the verifier were fitted on them) or `held_out` (never tuned on), and each role
is also pooled. `make test` keeps floors on two of these sets (tests/test_cache_eval.py); this is
the full report. Prints rich tables, writes the JSON to bench/results/, and prints it as the last line.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import orjson  # noqa: E402
import typer  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._common import code_state, fmt, print_result, wide_console  # noqa: E402

DATA = ROOT / "tests" / "data"
console = wide_console()

# name -> (role, history). Role: "held_out" = never tuned on; "tuned" = rules, lexicon or the verifier
# were fitted on it (bench/results/README.md, "Semantic cache"; tests/data/CACHE_PAIRS*.md say how each was written)
SETS: dict[str, tuple[str, str]] = {
    "cache_pairs": ("tuned", "the shipped set: lexicon, stop words and thresholds were set reading it"),
    "cache_pairs_holdout": ("tuned", "old holdout, tuned on since 2026-12-02"),
    "cache_pairs_rules": ("tuned", "the pairs the 2026-12-03 negation, prohibitive and question-type rules were written against"),
    "cache_pairs_unseen": ("tuned", "held out until 2026-12-03; shaped the gate's rules and trains the verifier since"),
    "cache_pairs_train2": ("tuned", "training set (hard negatives)"),
    "cache_pairs_train3": ("tuned", "training set written to break the gate (negations, traded roles)"),
    "cache_pairs_unseen2": ("tuned", "judged one change (2026-12-03), trained on since"),
    "cache_pairs_unseen3": ("tuned", "judged one change (2026-12-03), trained on since"),
    "cache_pairs_unseen4": ("tuned", "judged one change (2026-12-03), trained on since"),
    "cache_pairs_unseen5": ("held_out", "written apart, committed before the change it judged (0991a78); never tuned on"),
}
QUICK = ("cache_pairs", "cache_pairs_unseen5")  # what tests/test_cache_eval.py holds at a floor


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _pool(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Precision and recall over several sets' overall scores, pair-weighted."""
    same = sum(r["same"] for r in rows)
    hits = sum(r["hits"] for r in rows)
    fh = sum(r["false_hits"] for r in rows)
    return {"sets": len(rows), "pairs": sum(r["pairs"] for r in rows), "same": same, "hits": hits,
            "false_hits": fh, "precision": _ratio(hits - fh, hits), "recall": _ratio(hits - fh, same),
            "cross_tenant_hits": sum(r["cross_tenant_hits"] for r in rows),
            "volatile_hits": sum(r["volatile_hits"] for r in rows)}


def _miss_reasons(pairs: list[dict[str, Any]]) -> dict[str, int]:
    """Why the `same` pairs missed; a pair the gate refused on several checks counts once per check."""
    c: Counter[str] = Counter()
    for p in pairs:
        if p["label"] != "same" or p["hit"]:
            continue
        reason = p["reason"] or "?"
        if reason.startswith("gate_failed:"):
            c.update(f"gate:{check}" for check in reason.removeprefix("gate_failed:").split(","))
        else:
            c[reason] += 1
    return dict(c.most_common())


def _by_lang(pairs: list[dict[str, Any]], langs: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p, lang in zip(pairs, langs):
        out[lang].append(p)
    res = {}
    for lang, ps in sorted(out.items()):
        same = sum(p["label"] == "same" for p in ps)
        tp = sum(p["hit"] and p["label"] == "same" for p in ps)
        fp = sum(p["hit"] and p["label"] == "different" for p in ps)
        res[lang] = {"pairs": len(ps), "same": same, "hits": tp + fp, "false_hits": fp,
                     "precision": _ratio(tp, tp + fp), "recall": _ratio(tp, same)}
    return res


def evaluate_set(embedder: Any, name: str, gate_only: bool) -> dict[str, Any]:
    from pipeline.evaluation.cache import evaluate, read_pairs
    from pipeline.security.sealing import Keyring
    from pipeline.stages.cache.config import CachePolicy
    from pipeline.stages.cache.semantic import (
        KEYWORD_FIELDS,
        NUMERIC_FIELDS,
        SemanticCache,
    )
    from pipeline.stores.index_spec import open_index

    path = DATA / f"{name}.jsonl"
    lines = [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]
    policy = CachePolicy(verifier=False) if gate_only else CachePolicy()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        index = open_index(f"edge:{tmp}", embedder.dim, KEYWORD_FIELDS, NUMERIC_FIELDS)
        try:
            report = evaluate(SemanticCache(index, embedder, policy, Keyring.ephemeral()), read_pairs(path))
        finally:
            index.close()
    pairs = report["pairs"]
    role, history = SETS[name]
    return {
        "file": str(path.relative_to(ROOT)), "role": role, "history": history, "eval_s": round(time.perf_counter() - t0, 1),
        "verifier": report["verifier"], "overall": report["overall"],
        "by_kind": report["by_kind"], "by_domain": report["by_domain"],
        "by_lang": _by_lang(pairs, [str(o.get("lang") or "?") for o in lines]),
        "miss_reasons": _miss_reasons(pairs),
        # 1-based line numbers, the kind and the scores; the text stays in the file
        "false_hit_pairs": [{"line": n, "kind": p["kind"], "similarity": p["similarity"], "verifier_p": p["verifier_p"]}
                            for n, p in enumerate(pairs, start=1) if p["hit"] and p["label"] == "different"],
    }


def show(result: dict[str, Any]) -> None:
    sets = result["sets"]
    t = Table(title=f"cache-eval, default policy{' without the verifier' if result['gate_only'] else ''}, "
                    f"verifier {result['verifier']}, {result['embedding']}")
    for col in ("set", "role", "pairs", "same", "hits", "false hits", "precision", "recall", "x-tenant hits",
                "volatile hits", "lookup p50 / p95 ms", "s"):
        t.add_column(col, justify="left" if col in ("set", "role") else "right")
    for role in ("tuned", "held_out"):
        names = [n for n, s in sets.items() if s["role"] == role]
        for n in names:
            o = sets[n]["overall"]
            t.add_row(n, role, str(o["pairs"]), str(o["same"]), str(o["hits"]), str(o["false_hits"]),
                      fmt(o["precision"]), fmt(o["recall"]), str(o["cross_tenant_hits"]), str(o["volatile_hits"]),
                      f"{fmt(o['lookup_ms']['p50'], 1)} / {fmt(o['lookup_ms']['p95'], 1)}", fmt(sets[n]["eval_s"], 0))
        if names:
            p = result["by_role"][role]
            t.add_row(f"[b]all {role} ({p['sets']})[/b]", role, str(p["pairs"]), str(p["same"]), str(p["hits"]),
                      str(p["false_hits"]), fmt(p["precision"]), fmt(p["recall"]), str(p["cross_tenant_hits"]),
                      str(p["volatile_hits"]), "", "", end_section=True)
    console.print(t)
    # per kind: `same` kinds show hits/pairs, `different` kinds their false hits
    kinds = sorted({k for s in sets.values() for k in s["by_kind"]})
    k = Table(title="per kind: same pairs hit / same pairs; different pairs: false hits (of pairs)")
    k.add_column("kind")
    for n in sets:
        k.add_column(n.removeprefix("cache_pairs_") if n != "cache_pairs" else n, justify="right")
    for kind in kinds:
        cells = []
        for s in sets.values():
            sc = s["by_kind"].get(kind)
            if sc is None:
                cells.append("")
            elif sc["same"]:
                false_hits = f" FH {sc['false_hits']}" if sc["false_hits"] else ""
                cells.append(f"{sc['hits'] - sc['false_hits']}/{sc['same']}{false_hits}")
            else:
                cells.append(f"[red]FH {sc['false_hits']}[/red]/{sc['pairs']}" if sc["false_hits"] else f"0/{sc['pairs']}")
        k.add_row(kind, *cells)
    console.print(k)
    m = Table(title="why `same` pairs missed (top 4 per set)", show_lines=False)
    m.add_column("set")
    m.add_column("recall by language")
    m.add_column("miss reasons")
    for n, s in sets.items():
        langs = ", ".join(f"{lang} {fmt(v['recall'])}" for lang, v in s["by_lang"].items())
        reasons = ", ".join(f"{r} {c}" for r, c in list(s["miss_reasons"].items())[:4])
        m.add_row(n, langs, reasons)
    console.print(m)


app = typer.Typer(add_completion=False)


@app.command()
def main(quick: bool = typer.Option(False, "--quick", help=f"only {', '.join(QUICK)}"),
         sets: str = typer.Option("", help="comma-separated set names (default: all)"),
         gate_only: bool = typer.Option(False, "--gate-only", help="the gate without the verifier"),
         out: Path = typer.Option(None, help="result file (default bench/results/cache_eval_<date>.json)"),
         save: bool = typer.Option(True, help="write the result file")) -> None:
    """Precision, recall and false hits of the semantic cache on every labelled pair set."""
    from pipeline.engines.embedder import Embedder

    t0 = time.perf_counter()
    names = [s for s in sets.split(",") if s] or list(QUICK if quick else SETS)
    unknown = [n for n in names if n not in SETS]
    if unknown:
        raise typer.BadParameter(f"unknown sets {unknown}; known: {', '.join(SETS)}")
    embedder = Embedder()
    result: dict[str, Any] = {"bench": "cache_eval", "date": datetime.date.today().isoformat(), **code_state(ROOT),
                              "policy": "CachePolicy() defaults", "gate_only": gate_only,
                              "embedding": embedder.revision, "sets": {}}
    for n in names:
        console.print(f"{n} ...", end=" ")
        result["sets"][n] = evaluate_set(embedder, n, gate_only)
        o = result["sets"][n]["overall"]
        console.print(f"precision {fmt(o['precision'])}, recall {fmt(o['recall'])}, {o['false_hits']} false hits")
    result["verifier"] = next(iter(result["sets"].values()))["verifier"]
    result["by_role"] = {role: _pool([s["overall"] for s in result["sets"].values() if s["role"] == role])
                         for role in ("tuned", "held_out") if any(s["role"] == role for s in result["sets"].values())}
    show(result)
    path = out or ROOT / "bench" / "results" / f"cache_eval_{result['date']}.json"
    if save:
        console.print(f"result file: {path}")
    print_result(console, result, t0)  # the JSON line stays the last line of stdout
    if save:
        path.write_text(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    app()
