"""The stack as a user runs it: `llmpipe up --detach`, submit, sql while it runs, replay in shadow, down."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import orjson
import pytest
import yaml

from tests.support.cli import last_json, llmpipe
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

CONFIG = ROOT / "tests" / "fixtures" / "two_stage.yaml"
POLICY_V2 = ROOT / "tests" / "fixtures" / "classify_v2.yaml"


@pytest.fixture
def stack(tmp_path):
    up = llmpipe("up", "--detach", "--config", str(CONFIG), "--json", data_dir=tmp_path)
    assert up.returncode == 0, up.stderr
    yield last_json(up)
    down = llmpipe("down", data_dir=tmp_path)
    assert down.returncode == 0, down.stderr
    assert not (tmp_path / "stack.json").exists()


def test_up_submit_sql_replay_down(stack, tmp_path):
    assert stack["stages"] == ["classify", "answer"]
    assert (tmp_path / "stack.json").exists()
    assert stack["doorbell_dir"] and any(Path(stack["doorbell_dir"]).rglob("*.sock")), "the doorbell is on"
    again = llmpipe("up", "--detach", "--config", str(CONFIG), data_dir=tmp_path)
    assert again.returncode == 1 and "already running" in again.stderr

    prompts = ["hi", "hello", "a medium prompt", "a prompt that is clearly long enough"]
    for p in prompts:
        r = llmpipe("submit", "--prompt", p, "--json", data_dir=tmp_path)
        assert r.returncode == 0, r.stderr
        ans = last_json(r)
        assert ans["status"] == "ok" and ans["text"] == p.upper()
        assert set(ans["timings"]) == {"classify", "answer"}
    secret = "sk-live-SECRET123"
    pii = "call me at 010-9876-5432"
    r = llmpipe("submit", "--prompt", pii, "--api-key", secret, "--json", data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    boom = llmpipe("submit", "--prompt", f"explode {pii}", "--api-key", secret, "--json", data_dir=tmp_path)
    assert boom.returncode == 2 and last_json(boom)["error_class"] == "test_explosion"
    assert "test_explosion" in boom.stderr.strip().splitlines()[-1]

    def count() -> int:
        r = llmpipe("sql", "SELECT count() AS n FROM decisions FINAL WHERE replay_id = ''", "--format", "json",
                    data_dir=tmp_path)
        assert r.returncode == 0, r.stderr
        return last_json(r)[0]["n"]

    import time

    deadline = time.monotonic() + 60
    while count() < 12 and time.monotonic() < deadline:  # 6 classify + 5 answered + 1 dlq
        time.sleep(0.5)
    assert count() == 12
    # neither the API key nor the prompt text reaches the warehouse or the logs
    for table in ("decisions", "requests", "dead_letters"):
        dump = llmpipe("sql", f"SELECT * FROM {table}", "--format", "json", data_dir=tmp_path)
        assert dump.returncode == 0 and dump.stdout.strip()
        assert secret not in dump.stdout and "9876" not in dump.stdout, table
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    assert "explode" not in logs and secret not in logs and "9876" not in logs
    csv_out = llmpipe("sql", "SELECT stage, count() FROM decisions FINAL GROUP BY stage ORDER BY stage",
                      "--format", "csv", data_dir=tmp_path)
    assert csv_out.stdout.splitlines()[1:] == ["answer,6", "classify,6"]
    refused = llmpipe("sql", "DROP TABLE decisions", data_dir=tmp_path)
    assert refused.returncode == 1 and "read-only" in refused.stderr

    rep = llmpipe("replay", "--topic", "requests", "--from-offset", ",".join(f"{p}:0" for p in range(6)),
                  "--stage", "classify", "--policy", str(POLICY_V2), "--shadow", "--replay-id", "r-test",
                  "--config", str(CONFIG), "--json", data_dir=tmp_path)
    assert rep.returncode == 0, rep.stderr
    diff = last_json(rep)
    # threshold 20 -> 8: "a medium prompt" (15 chars) flips short -> long; "hi", "hello" stay short
    assert diff["records"] == 6 and diff["compared"] == 6
    assert diff["changes"] == {"classify": {"short -> long": 1}}
    assert diff["examples"][0]["after"] == "long"
    assert "short -> long" in rep.stdout

    def shadow_rows():
        r = llmpipe("sql", "SELECT count(), min(shadow), max(policy_version) FROM decisions FINAL "
                    "WHERE replay_id = 'r-test'", "--format", "json", data_dir=tmp_path)
        return list(last_json(r)[0].values())

    deadline = time.monotonic() + 60
    while shadow_rows()[0] < 6 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert shadow_rows() == [6, 1, "classify-v2"]
    assert count() == 12, "a shadow replay answers nobody and forwards nothing"

    # --stream: these stages send no deltas, so the whole text comes from the terminal answer, as one piece
    r = llmpipe("submit", "--prompt", "stream me", "--stream", "--json", data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [orjson.loads(line) for line in r.stdout.strip().splitlines()]
    assert lines[:-1] == [{"piece": "STREAM ME"}] and lines[-1]["text"] == "STREAM ME"
    assert lines[-1]["stream"]["pieces"] == 1 and lines[-1]["stream"]["error"] is None


def test_cli_errors_are_one_line(tmp_path):
    r = llmpipe("submit", "--prompt", "x", data_dir=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().startswith("error: no broker") and len(r.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("runtime: {queue_bound: -1}\n")
    r = llmpipe("status", "--config", str(bad), data_dir=tmp_path)
    assert r.returncode == 1 and "queue_bound" in r.stderr


def test_processes_mode_replay_by_time_and_live_replay(tmp_path):
    up = llmpipe("up", "--detach", "--processes", "--config", str(CONFIG), "--json", data_dir=tmp_path)
    assert up.returncode == 0, up.stderr
    info = last_json(up)
    try:
        assert {"worker:sink", "worker:classify", "worker:answer"} <= set(info["pids"])
        assert len(set(info["pids"].values())) == len(info["pids"]), "one process per stage group"
        # the embedded stack's doorbell: every stage process and the front door have a bell there
        bells = Path(info["doorbell_dir"])
        belled = {int(p.name.split("-")[0]) for p in bells.rglob("*.sock")}
        assert {info["pids"][k] for k in ("worker:classify", "worker:answer", "supervisor")} <= belled
        import time
        from datetime import datetime

        for p in ("early one", "early two"):
            assert llmpipe("submit", "--prompt", p, data_dir=tmp_path).returncode == 0
        time.sleep(1.0)
        cut = datetime.now(UTC).isoformat()
        time.sleep(0.2)
        for p in ("late one", "late two", "late three"):
            assert llmpipe("submit", "--prompt", p, data_dir=tmp_path).returncode == 0

        def n_decisions() -> int:
            r = llmpipe("sql", "SELECT count() AS n FROM decisions FINAL", "--format", "json", data_dir=tmp_path)
            return last_json(r)[0]["n"]

        deadline = time.monotonic() + 60
        while n_decisions() < 10 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert n_decisions() == 10

        # by time: only records stamped after the cut, checked against each record's own timestamp
        rep = llmpipe("replay", "--topic", "requests", "--from-time", cut, "--stage", "classify", "--shadow",
                      "--config", str(CONFIG), "--json", data_dir=tmp_path)
        assert rep.returncode == 0, rep.stderr
        assert last_json(rep)["records"] == 3 and last_json(rep)["changed"] == 0

        # live (not shadow) replay of `answer` over an explicit offset range: it answers again
        # (the warehouse keeps both: the replay's rows carry its replay_id) and forwards nothing
        rep = llmpipe("replay", "--topic", "stage.answer", "--from-offset", ",".join(f"{p}:0" for p in range(6)),
                      "--to", ",".join(f"{p}:1" for p in range(6)), "--stage", "answer", "--replay-id", "live-1",
                      "--config", str(CONFIG), "--json", data_dir=tmp_path)
        assert rep.returncode == 0, rep.stderr
        live = last_json(rep)
        assert 1 <= live["records"] <= 5 and live["changed"] == 0 and live["compared"] == live["records"]

        def replayed() -> list:
            r = llmpipe("sql", "SELECT (SELECT count() FROM decisions FINAL WHERE replay_id = 'live-1' AND shadow = 0), "
                        "(SELECT count() FROM requests FINAL WHERE replay_id = 'live-1')", "--format", "csv",
                        data_dir=tmp_path)
            return r.stdout.splitlines()[1].split(",")

        deadline = time.monotonic() + 60
        while replayed() != [str(live["records"])] * 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert replayed() == [str(live["records"])] * 2
    finally:
        down = llmpipe("down", data_dir=tmp_path)
        assert down.returncode == 0
    assert not bells.exists(), "down removes the stack's bell dir"
    for pid in info["pids"].values():
        import os

        try:
            os.kill(pid, 0)
            alive = not open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"
        except (ProcessLookupError, FileNotFoundError):
            alive = False
        assert not alive, f"pid {pid} survived llmpipe down"


def test_load_reports_statuses_and_invalid_lines(stack, tmp_path):
    traffic = tmp_path / "traffic.jsonl"
    lines = [orjson.dumps({"messages": [{"role": "user", "content": f"hello {i}"}]}).decode() for i in range(20)]
    lines += [orjson.dumps({"messages": [{"role": "user", "content": "explode"}], "api_key": "k"}).decode(),
              "not json", orjson.dumps({"messages": []}).decode()]
    traffic.write_text("\n".join(lines) + "\n")
    r = llmpipe("load", "--file", str(traffic), "--rate", "100", "--json", data_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = last_json(r)
    assert summary["sent"] == 21
    assert summary["by_status"] == {"ok": 20, "error": 1}
    assert summary["by_error_class"] == {"test_explosion": 1}
    assert summary["invalid_lines"] == 2
    assert summary["latency_ms"]["p50"] is not None and summary["latency_ms"]["p50"] <= summary["latency_ms"]["p99"]
    assert "line 22: not JSON" in r.stderr and "line 23:" in r.stderr


def test_a_door_that_cannot_open_leaves_no_worker_behind(tmp_path):
    """`llmpipe up --processes` fails when its HTTP port is taken, after the workers started: the
    failed start must stop every one of them (a supervisor still watching them restarted each as it
    stopped, and the restarted ones outlived the failed start)."""
    import socket
    import time

    import psutil

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        cfg = yaml.safe_load(CONFIG.read_text()) | {"http": {"port": taken.getsockname()[1]}}
        (tmp_path / "llmpipe.yaml").write_text(yaml.safe_dump(cfg))
        up = llmpipe("up", "--detach", "--processes", "--config", str(tmp_path / "llmpipe.yaml"), "--json",
                     data_dir=tmp_path, timeout=600)
    finally:
        taken.close()
    assert up.returncode != 0
    assert "Address already in use" in (tmp_path / "logs" / "stack.log").read_text()
    logs = sorted(p.name for p in (tmp_path / "logs").glob("worker-*.log"))
    assert {"worker-sink.log", "worker-classify.log", "worker-answer.log"} <= set(logs), "the workers had started"

    def left() -> list[str]:
        out = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if str(tmp_path) in cmd and "pipeline.cli" in cmd:
                out.append(cmd)
        return out

    deadline = time.monotonic() + 60
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), left()
