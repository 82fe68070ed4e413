"""The analyst report rendered: for a terminal (rich tables with what each section means), and as
one self-contained HTML file with inline SVG bar charts (no scripts, no external assets: it opens
offline and can be mailed)."""

from __future__ import annotations

from html import escape
from typing import Any

from rich.console import Console
from rich.table import Table

from pipeline.analysis.report import SECTIONS, bottleneck_sentence

# (section, label column, value column, unit) charted as horizontal bars
CHARTS = [
    ("stage_capacity", "stage", "request_capacity_rps", "req/s the stage can carry"),
    ("stage_latency", "stage", "service_p95_ms", "service p95 (ms)"),
    ("stage_latency", "stage", "queue_p95_ms", "queue p95 (ms)"),
    ("route_mix", "route_name", "requests", "requests"),
    ("rejections", "error_class", "requests", "requests"),
]

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em}p.m{color:#555;margin:.2em 0 .6em}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.b{font-size:1.1em;background:#fff4d6;
padding:.6em 1em;border-left:4px solid #e0a800}svg text{font:12px system-ui,sans-serif}"""


def bar_chart(rows: list[dict[str, Any]], label: str, value: str, unit: str, width: int = 640) -> str:
    data = [(str(r.get(label)), float(r[value])) for r in rows if isinstance(r.get(value), (int, float))]
    if not data:
        return ""
    top = max(v for _, v in data) or 1.0
    bar_h, gap, left = 18, 6, 170
    height = len(data) * (bar_h + gap) + 24
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{escape(unit)}">']
    for i, (name, v) in enumerate(data):
        y = i * (bar_h + gap)
        w = max(1.0, (width - left - 90) * v / top)
        parts.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{escape(name[:24])}</text>'
                     f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="#4a7bd0"/>'
                     f'<text x="{left + w + 4:.1f}" y="{y + 13}">{v:g}</text>')
    parts.append(f'<text x="{left}" y="{height - 4}" fill="#666">{escape(unit)}</text></svg>')
    return "".join(parts)


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p class='m'>(no rows in this window)</p>"
    cols = list(rows[0])
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{escape('' if r.get(c) is None else str(r.get(c)))}</td>" for c in cols)
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(doc: dict[str, Any]) -> str:
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>llmpipe report</title><style>{CSS}</style>"
           f"</head><body><h1>llmpipe report</h1><p class='m'>since {escape(doc['since'])} UTC</p>",
           f"<p class='b'>{escape(bottleneck_sentence(doc.get('bottleneck')))}</p>"]
    for sec in SECTIONS:
        rows = doc["sections"].get(sec.name, [])
        out.append(f"<h2>{escape(sec.title)}</h2><p class='m'>{escape(sec.meaning)}</p>")
        for name, label, value, unit in CHARTS:
            if name == sec.name:
                out.append(bar_chart(rows, label, value, unit))
        out.append(table(rows))
        out.append(f"<p class='m'>query: schemas/clickhouse/queries/{escape(sec.name)}.sql</p>")
    out.append("</body></html>")
    return "\n".join(out)


def print_report(doc: dict[str, Any], console: Console) -> None:
    console.print(f"[bold]llmpipe report[/bold] since {doc['since']} UTC")
    for sec in SECTIONS:
        rows = doc["sections"][sec.name]
        t = Table(*(rows[0] if rows else ["(no rows)"]), title=sec.title, caption=sec.meaning, title_justify="left")
        for r in rows:
            t.add_row(*("" if v is None else str(v) for v in r.values()))
        console.print(t)
    console.print(f"[bold]{bottleneck_sentence(doc['bottleneck'])}[/bold]")
