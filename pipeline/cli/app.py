"""`llmpipe`: run the stack and its workers, send traffic, query the warehouse, replay decisions.

Conventions (README.md, "CLI"): every command takes --data-dir, --config and --bootstrap; --json prints
one JSON document as the last line of stdout; exit 0 on success, non-zero with a one-line reason
on stderr.
"""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
topics_app = typer.Typer(no_args_is_help=True, help="Topic registry (topics/topics.yaml).")
app.add_typer(topics_app, name="topics")
cache_app = typer.Typer(no_args_is_help=True, help="Semantic cache operations.")
app.add_typer(cache_app, name="cache")
models_app = typer.Typer(no_args_is_help=True, help="Model files (prepared once, offline).")
app.add_typer(models_app, name="models")
tenants_app = typer.Typer(no_args_is_help=True, help="Tenants, API keys and limits (published on control).")
app.add_typer(tenants_app, name="tenants")
adapters_app = typer.Typer(no_args_is_help=True, help="LoRA adapter registry (published on control).")
app.add_typer(adapters_app, name="adapters")
rollouts_app = typer.Typer(no_args_is_help=True, help="RL rollouts: submit prompts for n scored samples, export them.")
app.add_typer(rollouts_app, name="rollouts")
blobs_app = typer.Typer(no_args_is_help=True, help="Claim-check blobs (images a request refers to by blob://).")
app.add_typer(blobs_app, name="blobs")
