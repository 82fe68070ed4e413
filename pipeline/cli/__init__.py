"""The `llmpipe` command: one sub-app module per concern, registered on one root app."""

# Importing a module registers its commands; this order is the order `llmpipe --help` lists them.
from pipeline.cli import stack  # noqa: F401, I001
from pipeline.cli import analysis, traffic, feedback, admin, rollouts, demo  # noqa: F401
from pipeline.cli.actor import actor_app
from pipeline.cli.app import app

app.add_typer(actor_app, name="actor")

__all__ = ["app"]
