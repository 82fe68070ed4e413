"""What the actor serves, on the running stack (real vLLM with enable_lora; two tiny adapters made with
peft at test time): base answers under mixed base/LoRA traffic equal base-only answers, adapters
really change the output, unauthorised adapters never run, cold -> warm -> hot moves land in
evidence and `weight_events` with their load times; and RL rollouts: n scored samples per prompt
with provenance, exported to parquet/jsonl and checked against a teacher-forced recompute."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import yaml

from pipeline.engines.lora_factory import make_adapter
from pipeline.stages.adapters import adapter_digest
from pipeline.stages.tenants import key_hash, new_api_key
from tests.test_cli_stack import last_json, llmpipe

pytestmark = pytest.mark.integration

PROMPTS = ["What is the capital of France?", "Name three colors.", "What is 2+2?", "Say hello.",
           "Who wrote Hamlet?", "What is water made of?"]


@pytest.fixture(scope="module")
def lora_stack(tmp_path_factory, prepared_model):
    data_dir = tmp_path_factory.mktemp("lora")
    roots = data_dir / "adapters-store"
    for name, seed in (("lora-a", 1), ("lora-b", 2), ("lora-c", 3)):
        make_adapter(prepared_model, roots / name, seed=seed)
    keys = {t: new_api_key() for t in ("ta", "tb", "plain")}
    allowed = {"lora-a": ["ta"], "lora-b": ["tb"], "lora-c": ["tb"]}
    config = {
        "auth": {"required": True},
        "lora": {"enabled": True, "max_loras": 1, "max_cpu_loras": 2, "max_lora_rank": 8,
                 "allowed_roots": [str(roots)]},
        "adapters": [{"name": n, "revision": "r1", "path": str(roots / n), "rank": 8,
                      "sha256": adapter_digest(roots / n), "tenants": t} for n, t in allowed.items()],
        "tenants": [{"name": t, "api_keys": [{"key_sha256": key_hash(k)}]} for t, k in keys.items()],
        "deployments": [{"name": "local-vllm", "engine": "vllm", "lora": True}],
        # no cache stage: a repeated prompt must reach the model every time
        "stages": [{"name": "mask"}, {"name": "route"}, {"name": "admit"}, {"name": "generate"},
                   {"name": "postprocess"}],
    }
    cfg = data_dir / "llmpipe.yaml"
    cfg.write_text(yaml.safe_dump(config))
    up = llmpipe("up", "--detach", "--processes", "--config", str(cfg), "--json", data_dir=data_dir, timeout=600)
    assert up.returncode == 0, up.stderr
    try:
        yield last_json(up), keys, data_dir, roots
    finally:
        assert llmpipe("down", data_dir=data_dir, timeout=180).returncode == 0


def ask(info, key: str, prompt: str, model: str = "default"):
    c = openai.OpenAI(base_url=info["http_url"] + "/v1", api_key=key, max_retries=0, timeout=300)
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=24,
                                  temperature=0, logprobs=True)
    return r.choices[0].message.content, [t.token for t in r.choices[0].logprobs.content], r


def sql(data_dir, query: str) -> list[dict]:
    return last_json(llmpipe("sql", query, "--format", "json", data_dir=data_dir))


def test_base_rows_stay_exact_under_mixed_traffic_and_adapters_apply(lora_stack):
    info, keys, data_dir, _ = lora_stack
    with ThreadPoolExecutor(18) as pool:
        base_only = list(pool.map(lambda p: ask(info, keys["plain"], p), PROMPTS))
        jobs = [pool.submit(ask, info, keys["plain"], p) for p in PROMPTS]
        jobs += [pool.submit(ask, info, keys["ta"], p, "lora-a") for p in PROMPTS]
        jobs += [pool.submit(ask, info, keys["tb"], p, "lora-b") for p in PROMPTS]
        mixed = [j.result() for j in jobs]
    base_mixed, a_out, b_out = mixed[:6], mixed[6:12], mixed[12:]
    for p, alone, together in zip(PROMPTS, base_only, base_mixed):
        assert together[1] == alone[1], f"{p!r}: base tokens changed under mixed traffic: {alone[0]!r} -> {together[0]!r}"
        assert together[2].model_extra["llmpipe"]["adapter"] is None
    # the adapters really ran: their answers differ from the base model's, and the answer says which one
    assert sum(a[1] != b[1] for a, b in zip(a_out, base_only)) >= 4
    assert sum(a[1] != b[1] for a, b in zip(b_out, base_only)) >= 4
    assert {r[2].model_extra["llmpipe"]["adapter"] for r in a_out} == {"lora-a"}
    assert {r[2].model_extra["llmpipe"]["adapter"] for r in b_out} == {"lora-b"}

    # residency moves: each adapter loaded once (cold -> warm, with its load time), activated, and with
    # one engine slot the two adapters displaced each other (hot -> warm)
    deadline = time.monotonic() + 60
    while True:
        moves = sql(data_dir, "SELECT labels['adapter'] AS adapter, decision, scores FROM decisions FINAL "
                              "WHERE stage = 'generate.adapter'")
        events = sql(data_dir, "SELECT name, transition, duration_ms, request_id FROM weight_events FINAL "
                               "WHERE kind = 'adapter'")
        if len(events) == len(moves) and {m["decision"] for m in moves} >= {"cold->warm", "warm->hot", "hot->warm"}:
            break
        assert time.monotonic() < deadline, (moves, events)
        time.sleep(1)
    loads = [m for m in moves if m["decision"] == "cold->warm"]
    assert sorted(m["adapter"] for m in loads) == ["lora-a@r1", "lora-b@r1"]
    assert all(m["scores"]["load_ms"] > 0 for m in loads)
    assert sorted((e["name"], e["duration_ms"] > 0) for e in events if e["transition"] == "cold->warm") == \
        [("lora-a", True), ("lora-b", True)]
    assert all(e["request_id"] for e in events)
    rows = sql(data_dir, "SELECT adapter, count() AS n FROM requests FINAL WHERE status = 'ok' GROUP BY adapter "
                         "ORDER BY adapter")
    assert {r["adapter"]: r["n"] for r in rows} == {"": 12, "lora-a": 6, "lora-b": 6}
    gen = sql(data_dir, "SELECT labels['adapter_state'] AS state, scores['adapter_load_ms'] AS load_ms "
                        "FROM decisions FINAL WHERE stage = 'generate' AND labels['adapter_applied'] != ''")
    assert len(gen) == 12 and {g["state"] for g in gen} <= {"cold", "warm", "hot"} and \
        sum(g["state"] == "cold" for g in gen) >= 2 and max(g["load_ms"] for g in gen) > 0


def test_an_unauthorised_adapter_never_runs(lora_stack):
    info, keys, data_dir, _ = lora_stack
    with pytest.raises(openai.PermissionDeniedError) as e:
        ask(info, keys["ta"], "Say hello.", "lora-b")
    assert e.value.body["code"] == "adapter_forbidden"
    rid = e.value.response.headers["x-request-id"]
    deadline = time.monotonic() + 30
    while not (stages := {r["stage"] for r in sql(data_dir, f"SELECT stage FROM decisions FINAL WHERE request_id = '{rid}'")}) \
            or "admit" not in stages:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert not any(s.startswith("generate") for s in stages), stages


def test_a_tampered_adapter_is_refused_and_marked_incompatible(lora_stack):
    info, keys, data_dir, roots = lora_stack
    weights = roots / "lora-c" / "adapter_model.safetensors"
    backup = roots.parent / "lora-c.safetensors"
    shutil.copy(weights, backup)
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # changed after registration
    try:
        with pytest.raises(openai.InternalServerError) as e:
            ask(info, keys["tb"], "Say hello.", "lora-c")
        assert e.value.body["code"] == "adapter_unavailable" and "checksum mismatch" in e.value.body["message"]
        listed = {r["name"]: r for r in last_json(llmpipe("adapters", "list", "--config", str(data_dir / "llmpipe.yaml"), "--json",
                                                                 data_dir=data_dir))}
        assert listed["lora-c"]["state"] == "incompatible"
    finally:
        shutil.move(backup, weights)


ROLLOUT_PROMPTS = [
    {"id": "capital", "prompt": "What is the capital of France? Answer with one word.", "pattern": "Paris"},
    {"id": "sum", "prompt": "What is 2+2? Answer with a number.", "pattern": "4"},
    {"id": "color", "prompt": "What color is the sky on a clear day? One word.", "pattern": "(?i)blue"},
]


def submit_rollouts(data_dir, key, prompts_file, *extra):
    return llmpipe("rollouts", "submit", "--file", str(prompts_file), "--n", "4", "--temperature", "1.0",
                   "--max-tokens", "16", "--seed", "7", "--verifier", "regex", "--reward", "length_penalty",
                   "--reward-arg", "per_token=0.01", "--dataset-revision", "ds-1", "--api-key", key, "--json", *extra,
                   data_dir=data_dir, timeout=600)


def test_rollouts_are_sampled_scored_exported_and_their_logprobs_recompute(lora_stack, prepared_model, tmp_path):
    import orjson
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.rollouts import read_export

    info, keys, data_dir, _ = lora_stack
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"\n".join(orjson.dumps(p) for p in ROLLOUT_PROMPTS) + b"\n")
    run = submit_rollouts(data_dir, keys["plain"], prompts)
    assert run.returncode == 0, run.stderr
    summary = last_json(run)
    assert summary["by_status"] == {"ok": 3} and summary["samples"] == 12, summary
    (actor,) = summary["actor_revisions"]  # every sample from the one actor that served them
    assert actor.startswith("smollm2-135m-instruct@sha256:") and summary["actor_revisions"][actor] == 12

    refused = submit_rollouts(data_dir, keys["plain"], prompts, "--actor-revision", "smollm2@not-served")
    assert last_json(refused)["by_error_class"] == {"actor_revision_unavailable": 3}

    deadline = time.monotonic() + 60
    while sql(data_dir, "SELECT count() AS n FROM rollouts FINAL")[0]["n"] < 12:
        assert time.monotonic() < deadline, "the 12 samples did not reach the warehouse"
        time.sleep(1)
    exported = {}
    for fmt in ("parquet", "jsonl"):
        out = tmp_path / f"samples.{fmt}"
        res = llmpipe("rollouts", "export", "--format", fmt, "--out", str(out), "--actor-revision", actor, "--json",
                      data_dir=data_dir)
        assert res.returncode == 0, res.stderr
        assert last_json(res)["rows"] == 12 and last_json(res)["groups"] == 3
        exported[fmt] = {r["sample_id"]: r for r in read_export(out)}
    assert exported["parquet"].keys() == exported["jsonl"].keys()
    for sid, p in exported["parquet"].items():  # the round trip keeps ids, logprobs and scores exactly
        j = exported["jsonl"][sid]
        for col in ("generated_token_ids", "prompt_token_ids", "logprobs", "score", "advantage", "seed", "actor_revision"):
            assert p[col] == j[col], (sid, col)
    rows = list(exported["jsonl"].values())
    for r in rows:
        assert len(r["logprobs"]) == len(r["generated_token_ids"]) > 0
        assert r["tokenizer_revision"] and r["chat_template_revision"] and r["runtime"] and r["hardware"]
        assert r["verifier_revision"].startswith("regex@") and r["reward_revision"].startswith("length_penalty@")
        assert r["group_size"] == 4 and orjson.loads(r["batch_context"])["n"] == 4
        assert r["prompt_dataset_revision"] == "ds-1" and r["temperature"] == 1.0
    by_group: dict[str, list[dict]] = {}
    for r in rows:
        by_group.setdefault(r["group_id"], []).append(r)
    for group in by_group.values():
        assert sorted(r["seed"] for r in group) == [7, 8, 9, 10]
        assert abs(sum(r["advantage"] for r in group)) < 1e-9

    # teacher-forced recompute with transformers (fp32) of every exported sample's logprobs
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(prepared_model), dtype=torch.float32).eval()
    deltas = []
    with torch.no_grad():
        for r in rows:
            ids = list(r["prompt_token_ids"]) + list(r["generated_token_ids"])
            logits = model(torch.tensor([ids])).logits[0].float()
            logp = torch.log_softmax(logits, dim=-1)
            start = len(r["prompt_token_ids"])
            for k, tok in enumerate(r["generated_token_ids"]):
                deltas.append(abs(float(logp[start + k - 1, tok]) - r["logprobs"][k]))
    deltas.sort()
    p50, p99, worst = deltas[len(deltas) // 2], deltas[int(len(deltas) * 0.99)], deltas[-1]
    print(f"\nlogprob recompute over {len(deltas)} tokens: |d| p50 {p50:.4f}, p99 {p99:.4f}, max {worst:.4f}")
    assert p50 < 0.05 and worst < 1.0, (p50, p99, worst)
