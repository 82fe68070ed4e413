"""The base of every stage's policy model: a key the model does not know is an error, not a setting
silently ignored (a misspelt `treshold:` would otherwise leave the default in force)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class PolicyModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
