"""What the agent path costs over the engine alone: one generation batch of the built-in
`arithmetic` prompts (rlvr-tiny, fast engine, rollout.max_new_tokens 24) sampled by
`engine.generate` directly, and by the tests' arithmetic agent (one chat completion per row
through the run's endpoint: HTTP, the chat template, the batcher, the recorder, the trajectory).
A and B alternate, REPS times each; prints the median seconds of each and their ratio.

    python bench/agent_endpoint.py                 # 16 prompts x 4 responses, 5 reps
    python bench/agent_endpoint.py --prompts 64 --group 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()

    import agent_funcs
    from rlvr.config import load_config
    from rlvr.data.prompts import load_prompts
    from rlvr.environments.runner import build_agents
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import SamplingParams, build_engine

    cfg = load_config(None, [f"--data.train_size={args.prompts}", "--train.eval_size=0"])
    tokenizer, model = load_tokenizer("rlvr-tiny"), load_model("rlvr-tiny")
    source = load_prompts(cfg, tokenizer, None)
    engine = build_engine(cfg, model, tokenizer)
    runner = build_agents(cfg, engine, tokenizer, model, source, agent_funcs.arithmetic)
    prompts = source.train[: args.prompts]
    params = SamplingParams(n=args.group, max_new_tokens=24, seed=0)
    times: dict[str, list[float]] = {"engine": [], "agent": []}
    try:
        for rep in range(args.reps + 1):  # the first of each is a warm-up, not counted
            t0 = time.perf_counter()
            engine.generate([q.ids for q in prompts], params)
            t1 = time.perf_counter()
            runner.run(prompts, params, step=rep)
            t2 = time.perf_counter()
            if rep:
                times["engine"].append(t1 - t0)
                times["agent"].append(t2 - t1)
    finally:
        runner.close()
    engine_s, agent_s = (statistics.median(times[k]) for k in ("engine", "agent"))
    rows = args.prompts * args.group
    print(
        f"{rows} rows: engine.generate {engine_s:.3f} s, agent path {agent_s:.3f} s, ratio {agent_s / engine_s:.2f}"
    )


if __name__ == "__main__":
    main()
