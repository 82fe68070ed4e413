"""The chat tokenizer the gateway counts prompt tokens with (admit's TPM and budget reservations,
generate's context check): the served model's own, from the prepared model directory."""

from __future__ import annotations

from pipeline.config.settings import Settings
from pipeline.engines.model_prep import resolve


def load_chat_tokenizer(settings: Settings):
    from transformers import AutoTokenizer

    path, _ = resolve(settings.resolved_data_dir(), settings.engine.model_dir, settings.engine.dtype)
    return AutoTokenizer.from_pretrained(str(path))
