"""Faults tell the truth (issue 22): the broker lost under load, an external broker that stops
answering and comes back, a worker in a crash loop. Each against a real stack (`llmpipe up`) with
the product's postprocess and a model-free generate (tests.stages:FakeGenerate), so a fault, not
a model, is what the callers wait on."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from pipeline.ingress.http import GRACE_S
from pipeline.registries.tenants import new_api_key
from pipeline.runtime.broker.embedded import EmbeddedBroker
from tests.support.callers import SLACK_S, TIMEOUT_S, Load, chat, gateway_config
from tests.support.cli import last_json, llmpipe, running
from tests.support.waits import poll

pytestmark = pytest.mark.integration

def readyz_false_within(url: str, t0: float, within_s: float) -> float | None:
    """Poll /readyz every 0.1 s; seconds from t0 to the first 503, or None."""
    while time.monotonic() - t0 < within_s:
        if httpx.get(url + "/readyz", timeout=5).status_code == 503:
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def until_ok(url: str, key: str, t0: float, within_s: float) -> float:
    """Seconds from t0 until a new request is answered 200."""
    while True:
        status, _, _ = chat(url, key, 5.0)
        if status == 200:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < within_s, f"no request succeeded within {within_s:.0f} s"
        time.sleep(0.2)


def assert_every_caller_told_the_truth(results) -> None:
    assert results
    for _sent, status, code, seconds in results:
        assert status in (200, 503, 504), (status, code)  # never a bare 500, never a dropped connection
        assert seconds <= TIMEOUT_S + GRACE_S + SLACK_S, (status, code, seconds)


def test_the_embedded_broker_killed_under_load_is_restarted_and_every_caller_gets_an_answer(tmp_path):
    key = new_api_key()
    with running(gateway_config(key), tmp_path, "--processes") as info:
        url = info["http_url"]
        assert chat(url, key)[0] == 200
        broker_pid = json.loads((tmp_path / "stack.json").read_text())["pids"]["broker"]
        with Load(url, key) as load:
            before = poll(lambda: len(load.results), lambda n: n >= 2, 30, "answers under load before the kill", 0.1)
            os.kill(broker_pid, signal.SIGKILL)
            t_kill = time.monotonic()
            unready_at = readyz_false_within(url, t_kill, 5)
            ok_after = until_ok(url, key, t_kill, 30)
            poll(lambda: [r[1] for r in load.results if r[0] > t_kill + ok_after], lambda s: 200 in s, 30,
                 "a caller of the load answered after the restart")
        assert before > 0, "the load ran before the kill"
        assert unready_at is not None, "/readyz never said not ready within 5 s"
        assert ok_after <= 30
        assert_every_caller_told_the_truth(load.results)
        statuses = {r[1] for r in load.results}
        assert 200 in statuses and statuses & {503, 504}, statuses  # it served, and the loss showed
        status = last_json(llmpipe("status", "--json", data_dir=tmp_path))
        assert status["health"]["broker"]["restarts"] == 1 and status["health"]["broker"]["last_exit_code"] == -9
        assert status["pids"]["broker"] != broker_pid and status["health"]["ready"]["ready"] is True
        # the report shows the event (the sink writes in batches)
        events = poll(lambda: last_json(llmpipe("report", "--since", "1h", "--json", data_dir=tmp_path))
                      ["sections"]["stack_events"], bool, 60, "a stack event in the report", 1)
        (ev,) = events
        assert ev["decision"] == "broker_restarted" and ev["exit_code"] == "-9"
        assert "got no pipeline answer" in ev["reason"]


def test_an_external_broker_that_stops_answering_and_returns_needs_no_restart_of_any_process(tmp_path):
    """SIGSTOP/SIGCONT: the broker keeps its storage, as a real cluster's does."""
    key = new_api_key()
    broker = EmbeddedBroker(tmp_path / "external")
    asyncio.run(broker.start())
    try:
        with running(gateway_config(key), tmp_path, "--processes", "--bootstrap", broker.bootstrap) as info:
            url = info["http_url"]
            assert chat(url, key)[0] == 200
            pids = json.loads((tmp_path / "stack.json").read_text())["pids"]
            with Load(url, key, n=3) as load:
                poll(lambda: len(load.results), bool, 30, "a first answer under load", 0.1)
                assert broker.proc is not None
                os.kill(broker.proc.pid, signal.SIGSTOP)
                t_stop = time.monotonic()
                unready_at = readyz_false_within(url, t_stop, 5)

                def health() -> dict:
                    return json.loads((tmp_path / "run" / "health.json").read_text())

                # the broker stays stopped until the door and every worker say so, and a caller sent
                # after the door noticed was refused (not a fixed 8 and 10 s)
                during = poll(health, lambda h: h["door"]["broker"]["state"] == "down" and
                              {w["broker"]["state"] for w in h["workers"].values()} == {"down"}, 30,
                              "the door and every worker to report the broker down")
                poll(lambda: [r[1] for r in load.results if r[0] > t_stop + 2], lambda s: 503 in s, 30,
                     "a 503 for a request sent while the broker was down")
                os.kill(broker.proc.pid, signal.SIGCONT)
                t_cont = time.monotonic()
                ok_after = until_ok(url, key, t_cont, 30)
                poll(lambda: [r[1] for r in load.results if r[0] > t_cont], lambda s: 200 in s, 30,
                     "a caller of the load answered after the broker came back")
            assert unready_at is not None, "/readyz never said not ready within 5 s"
            assert_every_caller_told_the_truth(load.results)
            assert 503 in {r[1] for r in load.results if t_stop + 2 < r[0] < t_cont}, "the door refused while down"
            assert ok_after <= 30
            after = json.loads((tmp_path / "stack.json").read_text())["pids"]
            assert after == pids, "no llmpipe process was restarted"
            assert during["door"]["broker"]["state"] == "down", during
            # a worker's probe backs off to 5 s while the broker is down
            status = poll(lambda: last_json(llmpipe("status", "--json", data_dir=tmp_path))["health"],
                          lambda h: {w["broker"]["state"] for w in h["workers"].values()} == {"up"}, 20,
                          "every worker to see the broker up again")
            assert status["broker"]["state"] == "external"
            assert all(w["restarts"] == 0 for w in status["workers"].values()), status["workers"]
    finally:
        broker.stop()


def test_a_crash_looping_worker_is_restarted_with_a_growing_backoff_and_status_says_so(tmp_path):
    key = new_api_key()
    flag = tmp_path / "crash"
    gen = {"name": "fakegen", "class": "tests.stages:CrashWhileFlagged", "policy": {"flag": str(flag)}}
    with running(gateway_config(key, gen), tmp_path, "--processes") as info:
        assert chat(info["http_url"], key)[0] == 200
        flag.touch()
        os.kill(json.loads((tmp_path / "stack.json").read_text())["pids"]["worker:fakegen"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            w = last_json(llmpipe("status", "--json", data_dir=tmp_path))["health"]["workers"]["fakegen"]
            if w["deaths_in_a_row"] >= 4:
                break
            assert time.monotonic() < deadline, w
            time.sleep(0.5)
        assert w["last_exit_code"] == 3 and w["restarts"] >= 3
        waits = [float(x) for x in re.findall(r"worker fakegen exited with \S+ \(\d+ in a row within 60 s of their "
                                              r"start\); restarting in (\d+) s",
                                              (tmp_path / "logs" / "stack.log").read_text())]
        assert waits[:4] == [0, 1, 2, 4], waits  # not a 1 s loop: each death in a row waits twice as long
        flag.unlink()
        deadline = time.monotonic() + 90
        while chat(info["http_url"], key, 5.0)[0] != 200:  # back once it can start
            assert time.monotonic() < deadline, "the worker did not come back"
            time.sleep(1)
        w = last_json(llmpipe("status", "--json", data_dir=tmp_path))["health"]["workers"]["fakegen"]
        assert w["state"] == "running"
        deadline = time.monotonic() + 60
        while True:  # each restart is a stack event in the warehouse
            rows = last_json(llmpipe("sql", "SELECT labels['exit_code'] AS code FROM decisions FINAL WHERE "
                                     "stage = 'stack.worker' AND labels['worker'] = 'fakegen'", "--format", "json",
                                     data_dir=tmp_path))
            if len(rows) >= w["restarts"]:
                break
            assert time.monotonic() < deadline, rows
            time.sleep(1)
        assert {r["code"] for r in rows} == {"-9", "3"}


def test_down_reaps_every_process_of_a_stack_whose_supervisor_was_killed(tmp_path):
    import psutil

    key = new_api_key()
    with running(gateway_config(key), tmp_path, "--processes") as info:
        assert chat(info["http_url"], key)[0] == 200
        pids = json.loads((tmp_path / "stack.json").read_text())["pids"]
        tree = [p for pid in pids.values() for p in (psutil.Process(pid), *psutil.Process(pid).children(recursive=True))]
        os.kill(pids["supervisor"], signal.SIGKILL)
        time.sleep(1)
        assert any(p.is_running() for p in tree if p.pid != pids["supervisor"]), "workers outlive their supervisor"
        down = llmpipe("down", data_dir=tmp_path, timeout=120)
        assert down.returncode == 0, down.stderr
        left = []
        for p in tree:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append((p.pid, p.name()))
            except psutil.Error:
                pass
        assert not left, f"`llmpipe down` left {left}"


def test_the_sink_killed_during_500_requests_loses_no_row(tmp_path):
    """Rows wait on their topics while the sink is down; it commits only what it inserted, so the
    restarted sink writes each answered request once (ReplacingMergeTree keys absorb a re-insert)."""
    from concurrent.futures import ThreadPoolExecutor

    key = new_api_key()
    n = 500
    with running(gateway_config(key), tmp_path, "--processes") as info:
        url = info["http_url"]
        sink_pid = json.loads((tmp_path / "stack.json").read_text())["pids"]["worker:sink"]
        answered: list[str] = []

        def one(i: int) -> None:
            r = httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=60,
                           json={"messages": [{"role": "user", "content": f"q{i}"}]})
            assert r.status_code == 200, r.text
            answered.append(r.headers["x-request-id"])

        with ThreadPoolExecutor(8) as pool:
            futs = [pool.submit(one, i) for i in range(n)]
            while len(answered) < n // 3:
                time.sleep(0.05)
            os.kill(sink_pid, signal.SIGKILL)
            killed_at = len(answered)
            for f in futs:
                f.result()
        assert killed_at < n and len(set(answered)) == n
        deadline = time.monotonic() + 120
        while True:  # the restarted sink catches up
            rows = last_json(llmpipe("sql", "SELECT request_id, count() AS n FROM requests WHERE replay_id = '' "
                                     "GROUP BY request_id", "--format", "json", data_dir=tmp_path))
            if len(rows) >= n:
                break
            assert time.monotonic() < deadline, f"{len(rows)} of {n} rows after the sink came back"
            time.sleep(1)
        assert {r["request_id"] for r in rows} == set(answered), "exactly the answered requests, none missing"
        final = last_json(llmpipe("sql", "SELECT count() AS n FROM requests FINAL WHERE replay_id = ''",
                                  "--format", "json", data_dir=tmp_path))
        assert final[0]["n"] == n, "one row per request once deduplicated"
        health = last_json(llmpipe("status", "--json", data_dir=tmp_path))["health"]
        assert health["workers"]["sink"]["restarts"] == 1 and health["workers"]["sink"]["last_exit_code"] == -9


def test_a_reduced_chaos_run_answers_every_caller_loses_no_row_and_leaks_no_hold():
    """`bench/chaos_bench.py --light` for 60 s: the sink, a stage worker and the broker killed, 12 s apart
    (then 15 s of traffic to see the last one's recovery)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, str(root / "bench" / "chaos_bench.py"), "--light", "--minutes", "1",
                          "--rate", "5", "--fault-every-s", "12"], cwd=root, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["sent"] >= 200 and doc["unanswered_by_deadline_plus_grace"] == 0, doc["by_status"]
    assert doc["holds_leaked"] == 0 and doc["warehouse"]["missing"] == 0, doc
    assert {f["kind"] for f in doc["faults"]} == {"worker", "sink", "broker"}, doc["faults"]
    # recovered within 30 s of the last fault before it recovered: a worker killed 12 s before the broker
    # waits out the broker's restart too (seen: generate back 34 s after its kill, 22 s after the broker's)
    starts = [f["at_s"] for f in doc["faults"]]
    for f in doc["faults"]:
        assert f["recovery_s"] is not None, doc["faults"]
        back = f["at_s"] + f["recovery_s"]
        assert back - max(t for t in starts if t <= back) <= 30, doc["faults"]
    assert doc["restarts"]["broker"] == 1 and doc["passed"]
