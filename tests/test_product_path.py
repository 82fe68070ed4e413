"""The product path on the embedded stack with the real model:
mask → cache → route → generate (vLLM) → postprocess, driven by `llmpipe submit`."""

from __future__ import annotations

import time

import pytest

from tests.test_cli_stack import last_json, llmpipe

pytestmark = pytest.mark.integration


def test_submit_answers_paris_then_the_cache_serves_the_repeat(tmp_path):
    up = llmpipe("up", "--detach", "--processes", "--json", data_dir=tmp_path, timeout=600)
    assert up.returncode == 0, up.stderr
    info = last_json(up)
    try:
        assert info["stages"] == ["mask", "cache", "route", "generate", "postprocess"]
        first = llmpipe("submit", "--prompt", "What is the capital of France?", "--json", data_dir=tmp_path, timeout=300)
        assert first.returncode == 0, first.stderr
        a = last_json(first)
        assert a["status"] == "ok" and "Paris" in a["text"], a
        assert a["cache"] == "miss" and a["route"] and a["model"] == "smollm2-135m-instruct"
        assert a["usage"]["completion_tokens"] > 0 and a["usage"]["prompt_tokens"] > 0
        assert set(a["timings"]) == {"mask", "cache", "route", "generate", "postprocess"}
        # the write-back travels on control to the cache worker; then the same question is a hit
        deadline = time.monotonic() + 60
        while True:
            again = last_json(llmpipe("submit", "--prompt", "What is the capital of France?", "--json",
                                      data_dir=tmp_path, timeout=300))
            if again["cache"] == "hit" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert again["cache"] == "hit" and again["text"] == a["text"]
        assert "generate" not in again["timings"], "a hit skips the model"
        # PII is masked before the model and restored in the answer
        pii = llmpipe("submit", "--prompt", "Repeat exactly: my email is jane.doe@example.com", "--json",
                      data_dir=tmp_path, timeout=300)
        assert pii.returncode == 0, pii.stderr
        rows = last_json(llmpipe("sql", "SELECT stage, decision FROM decisions FINAL ORDER BY stage", "--format",
                                 "json", data_dir=tmp_path))
        stages = {r["stage"] for r in rows}
        assert {"mask", "cache", "route", "route.placement", "generate", "postprocess"} <= stages
        dump = llmpipe("sql", "SELECT * FROM decisions", "--format", "json", data_dir=tmp_path).stdout
        assert "jane.doe@example.com" not in dump
    finally:
        assert llmpipe("down", data_dir=tmp_path, timeout=180).returncode == 0
