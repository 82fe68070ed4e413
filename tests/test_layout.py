"""The layout's import rules (docs/design.md, "Import rules"), read from the source with ast.

- every module lives in a package (no loose modules under `pipeline/`);
- `config` and `contracts` import nothing else from `pipeline` (config may read contracts);
- the top layer (`app`, the one assembly point; `analysis`; `training`; `demo`; `evaluation`; `cli`) is imported
  by nothing below it, and only the CLI imports the CLI;
- `registries` import only `config` and `contracts`; `security` only those and `registries`;
- `engines`, `stores`, `ingress` and `runtime` never import a stage (the runtime loads stages
  by name, through the topology);
- a stage package imports another stage only for a concept that stage owns (ALLOWED_STAGE_EDGES).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "pipeline"
ONLY = {  # package -> the packages it may import (itself always)
    "config": {"contracts"},
    "contracts": set(),
    "registries": {"config", "contracts"},
    "security": {"config", "contracts", "registries"},
}
TOP = {"app", "analysis", "training", "demo", "evaluation", "cli"}
NO_STAGES = {"engines", "stores", "ingress", "runtime", "registries", "security", "config", "contracts",
             "analysis", "training", "demo"}
ALLOWED_STAGE_EDGES = {
    ("postprocess", "cache"): "writes generated answers back to the cache, under the cache's policy",
    ("route", "cache"): "reuses the embedding the cache computed for the same text",
    ("admit", "generate"): "refuses an adapter (LoRA is generate's) and prices the deployments it may run on",
    ("generate", "postprocess"): "un-masks the deltas it streams under postprocess's un-mask policy (one source)",
    ("feedback", "mask"): "authenticates the giver and masks feedback text with mask's own code and policy",
}


def imports_of(source: str) -> list[str]:
    """Every `pipeline...` module a source imports, top-level or inside a function."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return [m for m in out if m == "pipeline" or m.startswith("pipeline.")]


def area(module: str) -> tuple[str, str | None]:
    """(top-level package or module under pipeline, stage name for stages.*)."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    # a module directly under stages/ (the catalog) belongs to no one stage
    return top, (parts[2] if top == "stages" and len(parts) > 2 and (ROOT / "stages" / parts[2]).is_dir() else None)


def violations(module: str, source: str) -> list[str]:
    top, stage = area(module)
    found = []
    for target in imports_of(source):
        t_top, t_stage = area(target)
        if t_top == top and (top != "stages" or t_stage == stage or t_stage is None):
            continue
        if t_top in TOP and (top not in TOP or (t_top == "cli" and top != "cli")):
            found.append(f"{module} imports {target}: {t_top} is above {top}; nothing below imports it")
        elif top in ONLY and t_top not in ONLY[top]:
            found.append(f"{module} imports {target}: {top} may import only {sorted(ONLY[top]) or 'nothing'}")
        elif top in NO_STAGES and t_top == "stages":
            found.append(f"{module} imports {target}: {top} never imports a stage")
        elif top == "stages" and t_top == "stages" and (stage, t_stage) not in ALLOWED_STAGE_EDGES:
            found.append(f"{module} imports {target}: stage {stage} may not use stage {t_stage}")
    return found


def modules() -> dict[str, str]:
    return {".".join(("pipeline", *p.relative_to(ROOT).with_suffix("").parts)): p.read_text()
            for p in ROOT.rglob("*.py")}


def test_every_module_keeps_the_import_rules():
    found = [v for m, src in sorted(modules().items()) for v in violations(m, src)]
    assert not found, "\n".join(found)


def test_the_rules_catch_a_wrong_import():
    """A deliberately wrong import in each kind of module is reported."""
    assert violations("pipeline.config.settings", "from pipeline.stages.mask.stage import MaskStage")
    assert violations("pipeline.contracts.request", "import pipeline.runtime.codec")
    assert violations("pipeline.registries.tenants", "from pipeline.runtime.stage import Outcome")
    assert violations("pipeline.ingress.http", "def f():\n    from pipeline.stages.tenants import X\n")
    assert violations("pipeline.runtime.topology", "from pipeline.stages.cache.stage import CacheStage")
    assert violations("pipeline.stages.cache.stage", "from pipeline.stages.generate.stage import GenerateStage")
    assert violations("pipeline.stores.sql_gateway", "from pipeline.analysis.profiling import ProfileRun")
    assert violations("pipeline.runtime.worker", "from pipeline.app.launch import stage_worker")
    assert violations("pipeline.app.stack", "from pipeline.cli.common import console")
    assert not violations("pipeline.cli.stack", "from pipeline.app.stack import run_stack")
    assert not violations("pipeline.stages.postprocess.stage", "from pipeline.stages.cache.policy import CachePolicy")
    assert not violations("pipeline.stages.cache.stage", "from pipeline.stages.cache.policy import CachePolicy")


def test_every_module_lives_in_a_package():
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside a package (give each a package that names its concern): {loose}"


def test_every_package_says_what_lives_there():
    """A newcomer's walk: each package's __init__ docstring names its concern."""
    bare = sorted(str(p.parent.relative_to(ROOT)) for p in ROOT.rglob("__init__.py")
                  if "_bundled" not in p.parts and not ast.get_docstring(ast.parse(p.read_text())))
    assert not bare, f"packages whose __init__.py has no docstring: {bare}"


# Loose smell detectors, not shapes to code to: ruff and mypy (`make lint`, run by `make test`) hold the style; a
# module or function past these has usually grown a second concept.
def test_no_module_is_over_800_lines():
    long = {m: n for m, src in modules().items() if (n := src.count("\n")) > 800}
    assert not long, long


def test_no_function_is_over_120_lines():
    long = {}
    for m, src in modules().items():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 120:
                long[f"{m}.{node.name}"] = node.end_lineno - node.lineno + 1
    assert not long, long


def test_no_asyncio_wait_for():
    """On Python 3.11, asyncio.wait_for returns the inner result instead of raising CancelledError
    when its task is cancelled just as the inner await completes (bpo-42130); a loop over it may
    then never stop (a test client hung in stop() this way). asyncio.timeout() has no such race."""
    calls = [f"{m}:{node.lineno}" for m, src in modules().items() for node in ast.walk(ast.parse(src))
             if isinstance(node, ast.Attribute) and node.attr == "wait_for"
             and isinstance(node.value, ast.Name) and node.value.id == "asyncio"]
    assert not calls, calls


def test_one_definition_of_the_shared_helpers():
    defs = {}
    for m, src in modules().items():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef) and node.name in ("now_ms", "free_port", "percentile"):
                defs.setdefault(node.name, []).append(m)
    assert {k: len(v) for k, v in defs.items()} == {"now_ms": 1, "free_port": 1, "percentile": 1}, defs


def test_every_cli_group_is_reachable():
    """Splitting the CLI into modules once left `blobs` defined but never added to the app."""
    import importlib
    import pkgutil

    import typer

    import pipeline.cli
    from pipeline.cli import app

    groups = {g.typer_instance for g in app.registered_groups}
    defined = {f"{info.name}.{name}": t
               for info in pkgutil.iter_modules(pipeline.cli.__path__) if info.name != "__main__"
               for name, t in vars(importlib.import_module(f"pipeline.cli.{info.name}")).items()
               if isinstance(t, typer.Typer) and t is not app}
    assert len(defined) >= 8 and all(t in groups for t in defined.values()), \
        [n for n, t in defined.items() if t not in groups]
    assert all(t.registered_commands for t in defined.values())


def test_every_bench_script_imports():
    """The store split once left bench/cache_bench.py importing names that had moved."""
    import importlib

    bench = Path(__file__).resolve().parents[1] / "bench"
    failed = {}
    for f in sorted(bench.glob("*.py")):
        try:
            importlib.import_module(f"bench.{f.stem}")
        except Exception as exc:
            failed[f.name] = repr(exc)[:200]
    assert not failed, failed


TESTS = Path(__file__).resolve().parent


def test_imports_between_tests(tmp_path):
    """No test module (nor conftest) is imported by another: what tests share is in tests/support.
    Seen failing on a planted `from tests.test_cli_stack import llmpipe` (below, and before the
    helpers moved: nine files did)."""

    def bad(source: str) -> list[str]:
        mods = []
        for node in ast.walk(ast.parse(source)):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            mods += [m for m in names if m.startswith(("tests.test_", "tests.conftest", "tests.security.test_",
                                                        "tests.security.conftest"))]
        return mods

    assert bad("from tests.test_cli_stack import llmpipe\nimport tests.conftest") == ["tests.test_cli_stack",
                                                                                       "tests.conftest"]
    found = {str(f.relative_to(TESTS)): m for f in TESTS.rglob("*.py") if (m := bad(f.read_text()))}
    assert not found, f"tests import other test modules (move the helper to tests/support): {found}"


def stage_layout_problems(name: str, stage_src: str, other_modules: dict[str, str]) -> list[str]:
    """A stage package: `policy_model` in stage.py comes from the package's config.py, and no class
    named *Policy lives anywhere else in the package."""
    problems = []
    tree = ast.parse(stage_src)
    imported = {a.asname or a.name: n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "policy_model" for t in node.targets)
                and isinstance(node.value, ast.Name)):
            source = imported.get(node.value.id)
            if source != f"pipeline.stages.{name}.config":
                problems.append(f"stages/{name}: policy_model {node.value.id} comes from {source or 'stage.py'}, "
                                f"not stages/{name}/config.py")
    for module, src in other_modules.items():
        problems += [f"{module}: {n.name} is a policy model outside config.py" for n in ast.parse(src).body
                     if isinstance(n, ast.ClassDef) and n.name.endswith("Policy")]
    return problems


def test_every_stage_keeps_one_layout():
    """stages/<name>/: config.py (the policy model, parse-only), policy.py (pure decisions), stage.py (the
    adapter), other modules by concept; every product stage of the catalog has its config.py model."""
    from pipeline.stages.catalog import PRODUCT_STAGES

    found = []
    for name in PRODUCT_STAGES:
        pkg = ROOT / "stages" / name
        others = {f"stages/{name}/{p.relative_to(pkg)}": p.read_text() for p in pkg.rglob("*.py")
                  if p.name not in ("config.py",)}
        found += stage_layout_problems(name, (pkg / "stage.py").read_text(), others)
        assert PRODUCT_STAGES[name].policy.startswith(f"pipeline.stages.{name}.config:")
    assert not found, "\n".join(found)
    # and the check itself fails on the layout this replaced (admit's model in stage.py)
    planted = "class AdmitPolicy(BaseModel):\n    pass\n\nclass AdmitStage:\n    policy_model = AdmitPolicy\n"
    assert len(stage_layout_problems("admit", planted, {"stages/admit/stage.py": planted})) == 2
