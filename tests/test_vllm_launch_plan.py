"""What a launched vLLM server is started with (`rlvr.rollout.vllm_launch`), checked without
vLLM: loopback only, the RL routes, processed log-probs, the weight backend, the CPU flags,
no torchrun variables, and the CPUs or GPUs split evenly in order (tests/test_vllm_server.py
starts real ones)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

import pytest

from rlvr.rollout.vllm_fleet import VLLMServerError
from rlvr.rollout.vllm_launch import (
    Launched,
    LaunchPlan,
    _wait_healthy,
    command,
    environment,
    split,
    stop,
)

PLAN = LaunchPlan(model="/m", dtype="float32", max_model_len=96, kv_bytes=1 << 20, memory=0.4,
                  backend="rlvr_http")  # fmt: skip


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_cpu_server_listens_on_loopback_with_the_flags_rl_needs():
    argv = command(PLAN, 8123, gpus=0)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--host") == "127.0.0.1" and _flag(argv, "--port") == "8123"
    assert _flag(argv, "--logprobs-mode") == "processed_logprobs"
    assert json.loads(_flag(argv, "--weight-transfer-config")) == {"backend": "rlvr_http"}
    assert {"--enforce-eager", "--no-enable-chunked-prefill"} <= set(argv)
    assert _flag(argv, "--kv-cache-memory-bytes") == str(1 << 20)
    assert "--gpu-memory-utilization" not in argv


def test_a_gpu_server_takes_its_share_as_tensor_parallel():
    argv = command(PLAN, 8123, gpus=2)
    assert _flag(argv, "--tensor-parallel-size") == "2"
    assert _flag(argv, "--gpu-memory-utilization") == "0.4"
    assert "--kv-cache-memory-bytes" not in argv and "--enforce-eager" not in argv


def test_the_environment_mounts_the_rl_routes_and_drops_torchrun(monkeypatch):
    for name, value in (("RANK", "3"), ("WORLD_SIZE", "4"), ("MASTER_PORT", "1")):
        monkeypatch.setenv(name, value)
    env = environment([2, 3], None)
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert not {"RANK", "WORLD_SIZE", "MASTER_PORT"} & set(env)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2,3" and env["OMP_NUM_THREADS"] == "2"
    assert environment(None, [1, 2])["CUDA_VISIBLE_DEVICES"] == "1,2"


def test_cpus_and_gpus_split_evenly_in_order():
    assert split([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert split([5], 1) == [[5]]


def test_a_server_that_exits_while_starting_is_named_with_its_output_and_leaves_no_file():
    """The output file is unlinked at start (a SIGKILLed trainer leaves none on disk); its
    last lines still name why the server ended."""
    fd, path = tempfile.mkstemp(prefix="rlvr-vllm-server-", suffix=".log")
    os.unlink(path)
    proc = subprocess.Popen(["sh", "-c", "echo loading; echo 'ValueError: no such model'; exit 3"],
                            stdout=fd, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    server = Launched(proc, "http://127.0.0.1:9", fd)
    try:
        with pytest.raises(VLLMServerError, match=r"exited with 3 while starting: loading \| ValueError: no such model$"):  # fmt: skip
            _wait_healthy(server)
    finally:
        stop([server])
        stop([server])  # idempotent
    assert server.log == -1 and not os.path.exists(path)
