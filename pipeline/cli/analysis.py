"""Ask the warehouse and the evidence: sql, report, cache-eval, replay, profile."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.app import app
from pipeline.cli.common import (
    Bootstrap,
    CliError,
    ConfigFile,
    DataDir,
    Json,
    _print_json,
    _progress,
    _query_fn,
    _settings,
    _stack_bootstrap,
    _stage_policy,
    command,
    err,
    out,
    parse_since,
)

# ---- analysts ----------------------------------------------------------------------------------


@app.command()
@command
def sql(query: Annotated[str | None, typer.Argument(help="one read-only statement")] = None,
        file: Annotated[Path | None, typer.Option("--file", exists=True, dir_okay=False,
                                                     help="read the statement from a file (e.g. a shipped query)")] = None,
        param: Annotated[list[str] | None, typer.Option("--param", help="NAME=VALUE for {NAME:Type} in the "
                                                                           "query; repeatable")] = None,
        data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
        format: Annotated[str, typer.Option("--format", help="table | json | csv")] = "table") -> None:
    """Query the warehouse (through the running stack in embedded mode)."""
    import csv
    import io

    from rich.table import Table

    from pipeline.stores.sql_gateway import check_read_only, jsonable

    if format not in ("table", "json", "csv"):
        raise CliError("--format must be table, json or csv")
    if (query is None) == (file is None):
        raise CliError("give a query or --file, not both")
    if file is not None:
        from pipeline.analysis.report import sql_from_file

        query = sql_from_file(file)
    params = {}
    for p in param or []:
        name, eq, value = p.partition("=")
        if not eq or not name.isidentifier():
            raise CliError(f"--param: expected NAME=VALUE, got {p!r}")
        params[name] = value
    s = _settings(data_dir, config, bootstrap)
    assert query is not None
    check_read_only(query.strip())
    res = _query_fn(s)(query, params)
    rows = [jsonable(list(r)) for r in res.rows]
    if format == "json":
        _print_json([dict(zip(res.columns, r)) for r in rows])
    elif format == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(res.columns)
        w.writerows(rows)
        sys.stdout.write(buf.getvalue())
    else:
        t = Table(*res.columns)
        for r in rows:
            t.add_row(*(str(v) for v in r))
        out.print(t)


@app.command()
@command
def report(data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           since: Annotated[str, typer.Option("--since", help="a duration back from now (30m, 2h, 7d) or an ISO "
                                                           "time (UTC unless it says otherwise)")] = "24h",
           html: Annotated[Path | None, typer.Option("--html", dir_okay=False,
                                                        help="also write one self-contained HTML file")] = None,
           json: Json = False) -> None:
    """The analyst report: stage latency and capacity with the bottleneck named, TTFT/TPOT/E2E, cache by
    domain, routes and cost, rejections, retries, models. Each section is a query in
    schemas/clickhouse/queries/ (rerun one with `llmpipe sql --file ... --param since=...`)."""
    from pipeline.analysis.render import print_report, render_html
    from pipeline.analysis.report import build_report

    s = _settings(data_dir, config, bootstrap)
    doc = build_report(_query_fn(s), parse_since(since))
    if html is not None:
        html.write_text(render_html(doc), encoding="utf-8")
    if json:
        _print_json(doc)
        return
    print_report(doc, out)
    if html is not None:
        out.print(f"HTML report: {html}")




@app.command()
@command
def plan(rate: Annotated[float, typer.Option("--rate", help="requests per second to plan for")],
         bench: Annotated[Path | None, typer.Option("--from", exists=True, dir_okay=False,
                                                       help="a bench/peer_bench.py result (JSON; the last line "
                                                            "of its output): CPU per request per process")] = None,
         system: Annotated[str, typer.Option("--system", help="which system of the bench result")] = "product",
         gpu_tok_s: Annotated[float | None, typer.Option("--gpu-tok-s", help="output tokens/s of one engine "
                                                                               "replica under continuous batching")] = None,
         tokens: Annotated[float, typer.Option("--tokens-per-request", help="output tokens per request")] = 200.0,
         utilization: Annotated[float, typer.Option("--utilization", help="planned busy share of a worker")] = 0.7,
         since: Annotated[str, typer.Option("--since", help="without --from: the warehouse window to measure")] = "1h",
         data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
         json: Json = False) -> None:
    """Workers per stage, partitions, engine replicas and the limiting stage for a request rate, from
    measured cost per request: a bench result (--from) or the warehouse's stage_capacity query."""
    import dataclasses

    from rich.table import Table

    from pipeline.analysis.capacity import plan as make_plan

    s = _settings(data_dir, config, bootstrap)
    costs, source = _plan_costs(s, bench, system, since)
    try:
        p = make_plan(rate, costs, utilization=utilization, engine_tok_s=gpu_tok_s, tokens_per_request=tokens)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if json:
        _print_json({"source": source, **dataclasses.asdict(p)})
        return
    t = Table(title=f"plan for {rate:g} req/s at {utilization:.0%} busy ({source})")
    for c in ("stage / process", "ms per request", "workers", "partitions now", "needed", "tops out now at req/s"):
        t.add_column(c, justify="right")
    dash = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    for r in p.stages:
        t.add_row(r.stage, dash(r.ms_per_request), str(r.workers), dash(r.partitions_now), dash(r.partitions_needed),
                  dash(r.top_rps_now))
    out.print(t)
    out.print(f"cores at {utilization:.0%} busy: {p.cores:g}; limiting stage with today's partitions: "
              f"{p.limiting_stage or '-'} ({dash(p.top_rps_now)} req/s)")
    if p.engine_replicas is not None:
        out.print(f"engine replicas: {p.engine_replicas} ({tokens:g} output tokens per request at {gpu_tok_s:g} "
                  "tok/s each)")
    for n in p.notes:
        out.print(f"note: {n}")


def _plan_costs(s: Any, bench: Path | None, system: str, since: str) -> tuple[list, str]:
    """Measured cost per request per stage: a bench result, else the warehouse's stage_capacity query."""
    import json as jsonlib

    from pipeline.analysis.capacity import chain_costs, costs_from_bench, costs_from_capacity
    from pipeline.analysis.report import query_text, run_query, since_param
    from pipeline.app.assemble import topology_for

    registry = topology_for(s).topic_registry()
    partitions = {name.removeprefix("stage."): spec.partitions for name, spec in registry.items()
                  if name.startswith("stage.")}
    partitions["sink"] = registry["evidence"].partitions
    if bench is not None:
        lines = [ln for ln in bench.read_text().splitlines() if ln.strip().startswith("{")]
        if not lines:
            raise CliError(f"{bench}: no JSON result in it")
        try:
            return (costs_from_bench(jsonlib.loads(lines[-1]), system, partitions),
                    f"CPU per request, {bench.name}, system {system}")
        except (ValueError, KeyError) as exc:
            raise CliError(f"{bench}: {exc}") from None
    rows = run_query(_query_fn(s), query_text("stage_capacity"), {"since": since_param(parse_since(since))})
    costs = costs_from_capacity(rows, partitions)
    if not costs:
        raise CliError(f"no stage decisions in the warehouse since {since}: run traffic first, or give --from")
    topology = topology_for(s)  # a bench result is per process already: one per chain
    costs = chain_costs(costs, {head: topology.chain(head) for head in topology.groups()})
    return costs, f"worker busy time per request, warehouse, since {since}"


@app.command("cache-eval")
@command
def cache_eval(pairs: Annotated[Path, typer.Option("--pairs", exists=True, dir_okay=False, help="labelled JSONL")],
               data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
               gate_only: Annotated[bool, typer.Option("--gate-only", help="without the verifier")] = False,
               json: Json = False) -> None:
    """Precision, recall and false hits of the cache policy on labelled pairs (embedded index)."""
    import tempfile

    from rich.table import Table

    from pipeline.engines.embedder import Embedder
    from pipeline.evaluation.cache import evaluate, read_pairs
    from pipeline.security.sealing import Keyring
    from pipeline.stages.cache.config import CachePolicy
    from pipeline.stages.cache.semantic import KEYWORD_FIELDS, NUMERIC_FIELDS, SemanticCache
    from pipeline.stores.index_spec import open_index

    policy = _stage_policy(_settings(data_dir, config, bootstrap), "cache", CachePolicy)
    if gate_only:
        policy = policy.model_copy(update={"verifier": False})
    try:
        rows = read_pairs(pairs)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    embedder = Embedder()
    with tempfile.TemporaryDirectory() as tmp:
        index = open_index(f"edge:{tmp}", embedder.dim, KEYWORD_FIELDS, NUMERIC_FIELDS)
        cache = SemanticCache(index, embedder, policy, Keyring.ephemeral())
        progress, advance = _progress("cache-eval", len(rows))
        with progress:
            report = evaluate(cache, rows, on_pair=advance)
        index.close()
    if not json:
        t = Table("domain", "pairs", "same", "hits", "precision", "recall", "false hits", "lookup p50 ms", "p95 ms")
        for name, sc in [*report["by_domain"].items(), ("overall", report["overall"])]:
            t.add_row(name, str(sc["pairs"]), str(sc["same"]), str(sc["hits"]), str(sc["precision"]),
                      str(sc["recall"]), str(sc["false_hits"]), str(sc["lookup_ms"]["p50"]), str(sc["lookup_ms"]["p95"]))
        out.print(t)
        k = Table("kind", "pairs", "same", "hits", "false hits")
        for name, sc in report["by_kind"].items():
            k.add_row(name, str(sc["pairs"]), str(sc["same"]), str(sc["hits"]), str(sc["false_hits"]))
        out.print(k)
        o = report["overall"]
        out.print(f"cross-tenant hits: {o['cross_tenant_hits']}; volatile hits: {o['volatile_hits']}; "
                  f"verifier: {report['verifier']}")
        report = {k: v for k, v in report.items() if k != "pairs"}
    _print_json(report)


@app.command("tool-eval")
@command
def tool_eval(cases: Annotated[Path, typer.Option("--cases", exists=True, dir_okay=False, help="labelled JSONL")],
              catalog: Annotated[Path, typer.Option("--catalog", exists=True, dir_okay=False,
                                                    help='{"tools": [...]} the cases name')],
              k: Annotated[int | None, typer.Option("--k", help="candidates kept (default: the route policy's)")] = None,
              data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, json: Json = False) -> None:
    """How often tool narrowing keeps the tools a conversation needs (recall at k), by kind and language."""
    from rich.table import Table

    from pipeline.evaluation.tools import evaluate, read_cases, read_catalog
    from pipeline.stages.route.config import RoutePolicy
    from pipeline.stages.route.tools import narrower_for

    policy = _stage_policy(_settings(data_dir, config, None), "route", RoutePolicy).tools
    try:
        rows = read_cases(cases, read_catalog(catalog))
    except (ValueError, KeyError) as exc:
        raise CliError(str(exc)) from None
    report = evaluate(narrower_for(policy), rows, k or policy.max_candidates)
    if not json:
        t = Table("by", "value", "recall")
        for dim in ("by_kind", "by_lang"):
            for name, r in report[dim].items():
                t.add_row(dim[3:], name, str(r))
        out.print(t)
        out.print(f"recall at {report['k']}: {report['recall']} over {report['cases']} cases; "
                  f"{report['ms_p50']} ms p50, {report['ms_p95']} ms p95 per request")
    _print_json(report)


@app.command("cache-fit")
@command
def cache_fit(pairs: Annotated[list[Path], typer.Option("--pairs", exists=True, dir_okay=False,
                                                         help="labelled JSONL to train on (repeat)")],
              out_file: Annotated[Path, typer.Option("--out", help="where the fitted verifier goes")],
              target_precision: Annotated[float, typer.Option(min=0.5, max=0.9999)] = 0.98,
              confidence: Annotated[float, typer.Option(min=0.5, max=0.9999)] = 0.90,
              data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
              json: Json = False) -> None:
    """Fit and calibrate the cache verifier: its hits' false-hit rate bounded at `confidence`.
    Never train on a set you report as held out. Use it with the cache policy's `verifier_path`."""
    import tempfile

    from pipeline.engines.embedder import Embedder
    from pipeline.evaluation.cache_fit import fit
    from pipeline.security.sealing import Keyring
    from pipeline.stages.cache.config import CachePolicy
    from pipeline.stages.cache.semantic import KEYWORD_FIELDS, NUMERIC_FIELDS, SemanticCache
    from pipeline.stores.index_spec import open_index

    policy = _stage_policy(_settings(data_dir, config, bootstrap), "cache", CachePolicy)
    total = sum(1 for f in pairs for line in f.read_text().splitlines() if line.strip())
    embedder = Embedder()
    with tempfile.TemporaryDirectory() as tmp:
        index = open_index(f"edge:{tmp}", embedder.dim, KEYWORD_FIELDS, NUMERIC_FIELDS)
        cache = SemanticCache(index, embedder, policy.model_copy(update={"verifier": False}), Keyring.ephemeral())
        progress, advance = _progress("cache-fit", total)
        try:
            with progress:
                verifier = fit(pairs, cache.pair_evidence, target_precision, confidence, on_pair=advance)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        finally:
            index.close()
    out_file.write_bytes(verifier.to_json())
    report = {"out": str(out_file), "threshold": verifier.threshold, **verifier.fitted}
    if not json:
        oof = verifier.fitted["out_of_fold"]
        out.print(f"verifier {verifier.revision}: threshold {verifier.threshold:.4f} on {verifier.fitted['pairs']} pairs; "
                  f"out of fold: gate {oof['gate_only']}, gate+verifier {oof['gate_and_verifier']}; "
                  f"false-hit bound {verifier.fitted['bound_at_threshold']} -> {out_file}")
        return
    _print_json(report)




# ---- engineers ---------------------------------------------------------------------------------


@app.command()
@command
def replay(topic: Annotated[str, typer.Option("--topic", help="registry name (e.g. stage.route) or full name")],
           stage: Annotated[str, typer.Option("--stage", help="stage whose policy re-decides")],
           from_offset: Annotated[str | None, typer.Option("--from-offset", help="P:O[,P:O...]")] = None,
           from_time: Annotated[str | None, typer.Option("--from-time", help="ISO-8601")] = None,
           to: Annotated[str | None, typer.Option("--to", help="P:O[,P:O...] or ISO-8601, exclusive")] = None,
           policy: Annotated[Path | None, typer.Option("--policy", exists=True, dir_okay=False, help="YAML policy")] = None,
           shadow: Annotated[bool, typer.Option("--shadow", help="evidence only: nothing reaches callers")] = False,
           replay_id: Annotated[str | None, typer.Option("--replay-id")] = None,
           idle_ms: Annotated[int, typer.Option("--idle-ms", help="end of range when no --to: idle this long")] = 1500,
           rerun: Annotated[bool, typer.Option("--rerun", help="re-run a stage before it in its chain that calls "
                                                               "the model or fetches again (docs/design.md)")] = False,
           data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, bootstrap: Bootstrap = None,
           json: Json = False) -> None:
    """Re-run a stage over a topic range (optionally a new policy, in shadow) and diff its decisions.
    A stage chained behind others is replayed from its chain's first topic through them."""
    import asyncio

    import yaml
    from rich.table import Table

    from pipeline.analysis.replay import RangeSpec, parse_bound, parse_offsets, parse_time_ms
    from pipeline.analysis.replay import replay as run_replay

    if (from_offset is None) == (from_time is None):
        raise CliError("give exactly one of --from-offset and --from-time")
    s = _settings(data_dir, config, bootstrap)
    bs, prefix = _stack_bootstrap(s)
    s = s.model_copy(update={"topic_prefix": prefix})
    end_offsets, end_ms = parse_bound(to)
    rng = RangeSpec(start_offsets=parse_offsets(from_offset) if from_offset else None,
                    start_ms=parse_time_ms(from_time) if from_time else None, end_offsets=end_offsets, end_ms=end_ms)
    pol = None
    if policy is not None:
        pol = yaml.safe_load(policy.read_text()) or {}
        if not isinstance(pol, dict):
            raise CliError(f"{policy}: a policy file is a YAML mapping")
    report = asyncio.run(run_replay(s, bs, topic=topic, stage=stage, rng=rng, policy=pol, shadow=shadow,
                                    replay_id=replay_id, query=_query_fn(s), idle_ms=idle_ms, rerun=rerun))
    doc = report.as_json()
    if not json:
        out.print(f"replay {report.replay_id}: {report.records} records through {' -> '.join(report.through)} "
                  f"({'shadow' if shadow else 'live'}); {report.compared} compared, {report.changed} changed, "
                  f"{report.without_original} without original evidence")
        t = Table("stage", "change", "count")
        for (st, change), n in report.transitions.most_common():
            t.add_row(st, change, str(n))
        for (st, reason), n in report.by_reason.most_common():
            t.add_row(st, f"reason: {reason}", str(n))
        out.print(t)
    _print_json(doc)


@app.command()
@command
def profile(stage: Annotated[str, typer.Option("--stage", help="the engine stage to profile")] = "generate",
            seconds: Annotated[float, typer.Option(help="length of the control and of the profiled run")] = 20.0,
            warmup: Annotated[float, typer.Option(help="warm-up seconds before measuring")] = 10.0,
            concurrency: Annotated[int, typer.Option(help="closed-loop clients")] = 8,
            max_tokens: Annotated[int, typer.Option(help="tokens per answer")] = 32,
            data_dir: DataDir = Path(".llmpipe"), config: ConfigFile = None, json: Json = False) -> None:
    """A torch-profiler trace of the engine under fixed traffic, its overhead measured against a control
    run; the run is a `profile_runs` row and the trace lies in DATA_DIR/profiles/<run_id>/."""
    import asyncio

    from rich.table import Table

    from pipeline.analysis.profiling import profile_generate
    from pipeline.app.stack import running_stack
    from pipeline.contracts.profile import PROFILE_COLUMNS
    from pipeline.stores.warehouse import is_embedded, open_warehouse

    if stage != "generate":
        raise CliError(f"profiling runs the engine stage `generate` (torch); {stage!r} is not one")
    if seconds <= 0 or warmup < 0 or concurrency < 1 or max_tokens < 1:
        raise CliError("--seconds and --concurrency and --max-tokens must be positive, --warmup not negative")
    s = _settings(data_dir, config, None)
    run = asyncio.run(profile_generate(s, seconds=seconds, warmup_s=warmup, concurrency=concurrency,
                                       max_tokens=max_tokens, say=lambda m: err.print(m)))
    info = running_stack(s.resolved_data_dir())
    if is_embedded(s.resolved_warehouse_dsn()) and info is not None:
        import httpx

        from pipeline.ingress.admin import admin_token_for, auth_headers

        r = httpx.post(f"{info.admin_url}/profile_runs", content=run.model_dump_json(), timeout=60,
                       headers={"content-type": "application/json", **auth_headers(admin_token_for(s))})
        if r.status_code != 200:
            raise CliError(f"the stack did not record the run: {r.text}")
    else:
        wh = open_warehouse(s)
        try:
            wh.migrate()
            wh.insert("profile_runs", PROFILE_COLUMNS, [run.row()])
        finally:
            wh.close()
    if json:
        _print_json(run.model_dump(mode="json"))
        return
    t = Table("op", "total ms", "calls", title=f"profile {run.run_id}: top ops in the engine", title_justify="left")
    for name, ms, calls in run.top_ops:
        t.add_row(name[:70], str(ms), str(calls))
    out.print(t)
    out.print(f"control {run.control['tokens_per_s']} tok/s, profiled {run.profiled['tokens_per_s']} tok/s: "
              f"profiler overhead {run.overhead_pct}% · trace {run.trace_path}")




