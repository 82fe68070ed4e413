"""What the actor serves, on the running stack (real vLLM with enable_lora; two tiny adapters made with
peft at test time): base answers under mixed base/LoRA traffic equal base-only answers, adapters
really change the output, unauthorised adapters never run, cold -> warm -> hot moves land in
evidence and `weight_events` with their load times; and RL rollouts: n scored samples per prompt
with provenance, exported to parquet/jsonl and checked against a teacher-forced recompute."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import yaml

from pipeline.engines.lora_factory import make_adapter
from pipeline.registries.adapters import adapter_digest
from pipeline.registries.tenants import key_hash, new_api_key
from tests.support.cli import last_json, llmpipe
from tests.support.paths import ROOT
from tests.support.waits import poll

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
        "tenants": [{"name": t, "api_keys": [{"key_sha256": key_hash(k), "roles": ["rollouts"]}]}  # rollouts: plain
                    for t, k in keys.items()],
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
        loaded = {m["adapter"] for m in moves if m["decision"] == "cold->warm"}
        if len(events) == len(moves) and {m["decision"] for m in moves} >= {"cold->warm", "warm->hot", "hot->warm"} \
                and loaded >= {"lora-a@r1", "lora-b@r1"}:  # both loads written, not just the first (sink batches)
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
        listed = {r["name"]: r for r in last_json(llmpipe("adapters", "list", "--config", str(data_dir / "llmpipe.yaml"),
                                                                 "--json", data_dir=data_dir))}
        assert listed["lora-c"]["state"] == "incompatible"
    finally:
        shutil.move(backup, weights)



def test_promote_and_demote_move_an_adapter_in_the_engine(lora_stack):
    info, keys, data_dir, _ = lora_stack
    cfg = str(data_dir / "llmpipe.yaml")

    def events(detail: str) -> set[str]:
        return {e["transition"] for e in sql(data_dir, "SELECT transition FROM weight_events FINAL WHERE "
                                                       f"name = 'lora-b' AND detail = '{detail}'")}

    def wait_for(detail: str, want: set[str]) -> set[str]:
        deadline = time.monotonic() + 60
        while not (want <= (got := events(detail)) and got):
            assert time.monotonic() < deadline, (detail, got)
            time.sleep(1)
        return got

    # serve lora-b now, so it is in the engine whatever the earlier tests' mixed traffic evicted (with
    # two CPU slots and three adapters, lora-b could be cold already: a demote then moves nothing);
    # demote sends it to disk
    ask(info, keys["tb"], "Say hello.", "lora-b")
    assert llmpipe("adapters", "demote", "lora-b", "--to", "cold", "--config", cfg, data_dir=data_dir).returncode == 0
    assert wait_for("cold by the operator", set()) <= {"warm->cold", "hot->cold"}
    assert llmpipe("adapters", "promote", "lora-b", "--to", "hot", "--config", cfg, data_dir=data_dir).returncode == 0
    wait_for("hot by the operator", {"cold->warm", "warm->hot"})
    loads = sql(data_dir, "SELECT duration_ms FROM weight_events FINAL WHERE name = 'lora-b' AND "
                          "detail = 'hot by the operator' AND transition = 'cold->warm'")
    assert loads and loads[0]["duration_ms"] > 0
    # a request right after finds it hot: no load on its path
    _, _, r = ask(info, keys["tb"], "Say hello.", "lora-b")
    rid = r.id.removeprefix("chatcmpl-")
    deadline = time.monotonic() + 60
    while not (rows := sql(data_dir, "SELECT labels['adapter_state'] AS state FROM decisions FINAL WHERE "
                                     f"stage = 'generate' AND request_id = '{rid}'")):
        assert time.monotonic() < deadline
        time.sleep(1)
    assert rows[0]["state"] == "hot"


def test_a_thumbs_down_on_an_adapter_answer_is_found_by_adapter_and_actor_and_exported(lora_stack, tmp_path):
    import httpx

    from pipeline.training.samples import read_export

    info, keys, data_dir, _ = lora_stack
    _, tokens, r = ask(info, keys["ta"], "Name a fruit.", "lora-a")
    rid = r.model_extra["llmpipe"]["request_id"]
    down = httpx.post(f"{info['http_url']}/v1/feedback", headers={"Authorization": f"Bearer {keys['ta']}"}, timeout=60,
                      json={"request_id": rid, "metric": "thumbs_up", "value": False})
    assert down.status_code == 200, down.text
    actor = sql(data_dir, f"SELECT actor_revision FROM requests FINAL WHERE request_id = '{rid}'")[0]["actor_revision"]
    assert actor.endswith("+lora-a@r1") and actor.startswith("smollm2-135m-instruct@sha256:")
    deadline = time.monotonic() + 60
    while not (found := sql(data_dir, "SELECT request_id FROM feedback_joined WHERE metric = 'thumbs_up' AND "
                                      f"value_float = 0 AND adapter = 'lora-a' AND actor_revision = '{actor}'")):
        assert time.monotonic() < deadline, "the feedback did not reach feedback_joined"
        time.sleep(1)
    assert found == [{"request_id": rid}]
    out = tmp_path / "liked-not.jsonl"
    res = llmpipe("rollouts", "export", "--from-feedback", "thumbs_up<=0", "--tenant", "ta", "--format", "jsonl",
                  "--out", str(out), "--json", data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    (row,) = [x for x in read_export(out) if x["request_id"] == rid]
    assert row["actor_revision"] == actor and row["score"] == 0.0 and len(row["generated_token_ids"]) == len(tokens)
    assert len(row["logprobs"]) == len(tokens) and row["prompt_token_ids"] and row["chat_template_revision"]


ROLLOUT_PROMPTS = [
    {"id": "capital", "prompt": "What is the capital of France? Answer with one word.", "pattern": "Paris"},
    {"id": "sum", "prompt": "What is 2+2? Answer with a number.", "pattern": "4"},
    {"id": "color", "prompt": "What color is the sky on a clear day? One word.", "pattern": "(?i)blue"},
]


def submit_rollouts(data_dir, key, prompts_file, *extra):
    return llmpipe("rollouts", "submit", "--file", str(prompts_file), "--n", "4", "--temperature", "1.0",
                   "--max-tokens", "16", "--seed", "7", "--verifier", "regex", "--reward", "length_penalty",
                   "--reward-arg", "per_token=0.01", "--api-key", key, "--json", *extra,
                   data_dir=data_dir, timeout=600)


def test_rollouts_are_sampled_scored_exported_and_their_logprobs_recompute(lora_stack, prepared_model, tmp_path):
    import orjson
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.training.samples import dataset_revision_of, read_export

    info, keys, data_dir, _ = lora_stack
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"\n".join(orjson.dumps(p) for p in ROLLOUT_PROMPTS) + b"\n")
    run = submit_rollouts(data_dir, keys["plain"], prompts)
    assert run.returncode == 0, run.stderr
    summary = last_json(run)
    assert summary["by_status"] == {"ok": 3} and summary["samples"] == 12, summary
    dataset = dataset_revision_of(prompts)  # no --dataset-revision: the file's digest
    assert summary["dataset_revision"] == dataset and dataset.startswith("prompts@sha256:")
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
        res = llmpipe("rollouts", "export", "--tenant", "plain", "--format", fmt, "--out", str(out),
                      "--actor-revision", actor, "--json", data_dir=data_dir)
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
        assert r["prompt_dataset_revision"] == dataset and r["temperature"] == 1.0
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


SWITCH_PROMPTS = [f"Write one word about the number {i}." for i in range(8)]


def rollout_file(path, prompts, repeat: int = 1, prefix: str = ""):
    import orjson

    path.write_bytes(b"\n".join(orjson.dumps({"id": f"{prefix}p{i % len(prompts)}-{k}", "prompt": p})
                                for k in range(repeat) for i, p in enumerate(prompts)) + b"\n")
    return path


def greedy_rollouts(data_dir, key, file, dataset: str):
    return llmpipe("rollouts", "submit", "--file", str(file), "--n", "2", "--temperature", "0", "--max-tokens", "6",
                   "--reward", "length_penalty", "--dataset-revision", dataset, "--concurrency", "4", "--api-key", key, "--json",
                   data_dir=data_dir, timeout=900)


def wait_rows(data_dir, dataset: str, n: int, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(rows := sql(data_dir, "SELECT sample_id, actor_revision, prompt_token_ids, generated_token_ids, "
                                    "batch_context "
                                    f"FROM rollouts FINAL WHERE prompt_dataset_revision = '{dataset}'")) < n:
        assert time.monotonic() < deadline, f"{len(rows)} of {n} samples of {dataset} in the warehouse"
        time.sleep(1)
    return rows


@contextlib.contextmanager
def second_generate_worker(info, data_dir, cfg: str):
    """Another member of generate's consumer group (what an operator runs to scale out): a second
    engine, a second replica of the actor lifecycle."""
    ready = data_dir / "run" / "worker-generate-2.ready"
    ready.unlink(missing_ok=True)
    env = {**os.environ, "LLMPIPE_BOOTSTRAP": info["bootstrap"], "LLMPIPE_TOPIC_PREFIX": info["topic_prefix"]}
    with open(data_dir / "logs" / "worker-generate-2.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "worker", "generate", "--config", cfg,
                                 "--data-dir", str(data_dir), "--ready-file", str(ready)], env=env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert proc.poll() is None, "the second generate worker exited; see worker-generate-2.log"
            assert time.monotonic() < deadline, "the second generate worker did not start"
            time.sleep(0.5)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


# Its own waits (barriers of 120 s, rows 300 s, the load 900 s) exceed the suite's 600 s default; on
# the 2-core AVX2 host four validations alone took 74-150 s each while two engines shared the cores.
@pytest.mark.timeout(1500)
def test_actor_weight_switch_under_load_tags_every_sample_with_the_revision_that_made_it(lora_stack, prepared_model,
                                                                                           tmp_path):
    info, keys, data_dir, _ = lora_stack
    with second_generate_worker(info, data_dir, str(data_dir / "llmpipe.yaml")):
        switch_actor_under_load(lora_stack, prepared_model, tmp_path)


def switch_actor_under_load(lora_stack, prepared_model, tmp_path):
    import threading

    info, keys, data_dir, roots = lora_stack
    cfg = str(data_dir / "llmpipe.yaml")
    for rev, seed in (("act-1", 11), ("act-2", 12)):
        make_adapter(prepared_model, roots / rev, seed=seed)
    bad_checks = tmp_path / "bad.jsonl"
    bad_checks.write_text('{"prompt": "Say hello.", "expected": "zzz never said zzz"}\n')
    any_answer = tmp_path / "any.jsonl"
    any_answer.write_text('{"prompt": "Say hello.", "expected": ".", "match": "regex"}\n')

    def actor(*args):
        return llmpipe("actor", *args, "--config", cfg, "--json", data_dir=data_dir, timeout=400)

    # a revision whose validation fails is rejected by the replica, and the barrier refuses it
    assert actor("prepare", "act-bad", "--path", str(roots / "act-1"), "--rank", "8",
                 "--validation", str(bad_checks)).returncode == 0
    refused = actor("activate", "act-bad", "--replicas", "2", "--timeout", "120")
    assert refused.returncode != 0 and "rejected by" in refused.stderr, refused.stderr
    for rev in ("act-1", "act-2"):
        assert actor("prepare", rev, "--path", str(roots / rev), "--rank", "8", "--validation",
                     str(any_answer)).returncode == 0
    on1 = actor("activate", "act-1", "--replicas", "2", "--timeout", "120")
    assert on1.returncode == 0, on1.stderr

    # references: each revision's greedy samples while it alone is active
    ref_file = rollout_file(tmp_path / "ref.jsonl", SWITCH_PROMPTS)
    assert greedy_rollouts(data_dir, keys["plain"], ref_file, "ref-1").returncode == 0
    # the switch, while a stream of rollouts runs: rounds of 40 requests until one round has started
    # after act-2 went active (how long the barrier takes against one round varies from host to host)
    switched = threading.Event()
    rounds: list = []

    def load() -> None:
        for k in range(8):
            after = switched.is_set()
            file = rollout_file(tmp_path / f"load-{k}.jsonl", SWITCH_PROMPTS, repeat=5, prefix=f"r{k}-")
            rounds.append(greedy_rollouts(data_dir, keys["plain"], file, "switch"))
            if after:
                return

    runner = threading.Thread(target=load)
    runner.start()
    wait_rows(data_dir, "switch", 10, timeout=300)
    on2 = actor("activate", "act-2", "--replicas", "2", "--timeout", "120")
    switched.set()
    assert on2.returncode == 0, on2.stderr
    runner.join(900)
    assert not runner.is_alive() and rounds
    for done in rounds:  # in-flight requests completed across the switch
        assert last_json(done)["by_status"] == {"ok": 40}, done.stderr
    assert greedy_rollouts(data_dir, keys["plain"], ref_file, "ref-2").returncode == 0

    def by_prompt(rows):
        return {tuple(r["prompt_token_ids"]): (r["actor_revision"], tuple(r["generated_token_ids"])) for r in rows}

    ref1, ref2 = by_prompt(wait_rows(data_dir, "ref-1", 16)), by_prompt(wait_rows(data_dir, "ref-2", 16))
    tag1, tag2 = {a for a, _ in ref1.values()}, {a for a, _ in ref2.values()}
    assert len(tag1) == 1 and len(tag2) == 1 and tag1 != tag2 and next(iter(tag2)).endswith("+actor@act-2")
    distinct = [p for p in ref1 if ref1[p][1][:3] != ref2[p][1][:3]]
    assert len(distinct) >= 6, "the two revisions must answer differently to tell them apart"
    switch = wait_rows(data_dir, "switch", 80 * len(rounds))
    import orjson

    workers = {orjson.loads(r["batch_context"])["worker"] for r in switch}
    assert len(workers) == 2, workers  # both replicas sampled during the switch
    seen = {"act-1": 0, "act-2": 0}
    for r in switch:  # each sample's tokens are those of the revision it is tagged with
        p = tuple(r["prompt_token_ids"])
        rev = r["actor_revision"].rsplit("@", 1)[-1]
        ref = ref1 if rev == "act-1" else ref2
        assert rev in seen and r["actor_revision"] == ref[p][0], r["actor_revision"]
        if p in distinct:
            assert tuple(r["generated_token_ids"])[:3] == ref[p][1][:3], (rev, r["sample_id"])
        seen[rev] += 1
    assert seen["act-1"] > 0 and seen["act-2"] > 0, seen  # the switch happened under load

    events = sql(data_dir, "SELECT revision, transition, replica FROM weight_events FINAL WHERE kind = 'actor'")
    got = {(e["revision"], e["transition"]) for e in events}
    # the barrier: both generate replicas validated act-2 before it went active, and both switched
    validated = {e["replica"] for e in events if (e["revision"], e["transition"]) == ("act-2", "validated")}
    active = {e["replica"] for e in events if (e["revision"], e["transition"]) == ("act-2", "active")}
    assert len(validated) == 2 and active == validated, events
    assert {("act-2", s) for s in ("prepared", "transferred", "loaded", "validated", "active")} <= got, got
    assert {("act-1", "draining"), ("act-1", "retired"), ("act-bad", "rejected")} <= got, got

    # rollback: act-2 is rejected, act-1 serves again, act-2's samples are marked and left out of exports
    back = actor("rollback", "--reason", "reward regressed")
    assert back.returncode == 0 and last_json(back) == {"rejected": "act-2", "active": "act-1"}, back.stderr
    # the command publishes the decision; each replica switches when it reads it and then reports
    # act-2 draining: sample only once both did (the samples in between are act-2's, tagged so)
    poll(lambda: sql(data_dir, "SELECT DISTINCT replica FROM weight_events FINAL WHERE kind = 'actor' "
                               "AND revision = 'act-2' AND transition = 'draining'"),
         lambda rows: len(rows) == 2, 120, "both replicas off act-2 after the rollback", 1)
    again = greedy_rollouts(data_dir, keys["plain"], ref_file, "ref-3")
    assert last_json(again)["actor_revisions"] == {next(iter(tag1)): 16}
    out = tmp_path / "all.jsonl"
    assert llmpipe("rollouts", "export", "--tenant", "plain", "--format", "jsonl", "--out", str(out), "--include-rejected",
                   data_dir=data_dir).returncode == 0
    from pipeline.training.samples import read_export

    rows = read_export(out)
    assert sum(r["actor_weights"] == "act-2" for r in rows) >= 16
    assert {r["rejected"] for r in rows if r["actor_weights"] == "act-2"} == {1}
    assert {r["rejected"] for r in rows if r["actor_weights"] != "act-2"} == {0}
    kept = tmp_path / "kept.jsonl"
    assert llmpipe("rollouts", "export", "--tenant", "plain", "--format", "jsonl", "--out", str(kept),
                   data_dir=data_dir).returncode == 0
    assert not [r for r in read_export(kept) if r["actor_weights"] == "act-2"]
