"""What an OpenEnv episode costs over a plain agent call: one generation batch of rows
(rlvr-tiny, fast engine, rollout.max_new_tokens 24) made by the tests' async arithmetic agent
(one chat completion through the run's endpoint), and by OpenEnv episodes of one turn on
examples/openenv_arithmetic.py's server, a process on 127.0.0.1 (the same chat completion,
plus a WebSocket session, its reset and one step). A and B alternate, REPS times each; prints
the median seconds of each and their ratio. Needs `pip install "rlvr[openenv]"`.

    python bench/openenv_episodes.py                 # 16 prompts x 4 responses, 5 reps
    python bench/openenv_episodes.py --prompts 32 --group 8
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def serve() -> tuple[subprocess.Popen, str]:
    """The example environment's server on a free loopback port, once /health answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    example = ROOT / "examples" / "openenv_arithmetic.py"
    proc = subprocess.Popen(
        [sys.executable, str(example), "--port", str(port)], env=env, stderr=subprocess.DEVNULL
    )
    url, end = f"http://127.0.0.1:{port}", time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).close()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > end:
                proc.kill()
                raise SystemExit(f"the OpenEnv server did not start at {url}") from None
            time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()

    import agent_funcs
    from rlvr.config import load_config
    from rlvr.data.prompts import load_prompts
    from rlvr.environments.openenv_env import OpenEnv, adapt
    from rlvr.environments.runner import build_agents
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import SamplingParams, build_engine

    cfg = load_config(None, [f"--data.train_size={args.prompts}", "--train.eval_size=0"])
    tokenizer, model = load_tokenizer("rlvr-tiny"), load_model("rlvr-tiny")
    source = load_prompts(cfg, tokenizer, None)
    engine = build_engine(cfg, model, tokenizer)
    prompts = source.train[: args.prompts]
    params = SamplingParams(n=args.group, max_new_tokens=24, seed=0)
    proc, url = serve()
    try:
        episode = adapt(OpenEnv(url, max_turns=1), cfg).agent
        seeds = itertools.count()

        async def openenv_episode(client, row):
            return await episode(client, {"seed": next(seeds)})

        runners = {
            "agent": build_agents(
                cfg, engine, tokenizer, model, source, agent_funcs.arithmetic_async
            ),
            "openenv": build_agents(cfg, engine, tokenizer, model, source, openenv_episode),
        }
        times: dict[str, list[float]] = {k: [] for k in runners}
        try:
            for rep in range(args.reps + 1):  # the first of each is a warm-up, not counted
                for name, runner in runners.items():
                    t0 = time.perf_counter()
                    batch = runner.run(prompts, params, step=rep)
                    assert not batch.dropped.any(), name
                    if rep:
                        times[name].append(time.perf_counter() - t0)
        finally:
            for runner in runners.values():
                runner.close()
    finally:
        proc.terminate()
        proc.wait(10)
    agent_s, openenv_s = (statistics.median(times[k]) for k in ("agent", "openenv"))
    rows = args.prompts * args.group
    print(
        f"{rows} rows: agent {agent_s:.3f} s, OpenEnv episodes {openenv_s:.3f} s, "
        f"ratio {openenv_s / agent_s:.2f}, {1000 * (openenv_s - agent_s) / rows:.1f} ms a row more"
    )


if __name__ == "__main__":
    main()
