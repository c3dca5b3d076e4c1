"""The Python API with a reward function written for TRL, on your own list-of-dicts data.

    python examples/python_api.py            # up to 150 steps on the built-in tiny model
    python examples/python_api.py 2          # a smoke run of 2 steps (what CI runs)

The reward has TRL's signature, so the same function runs under trl.GRPOTrainer unchanged:
keyword arguments `completions` and the dataset's columns (here `answer`), **kwargs for the
rest, one float (or None) per completion.
"""

import random
import re
import sys

import rlvr


def make_rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": f"Compute {a}+{b}. Answer in <answer></answer>.", "answer": a + b})
    return rows


def exact_answer(completions, answer, **kwargs):
    scores = []
    for completion, ref in zip(completions, answer):
        m = re.search(r"<answer>(.*?)</answer>", completion)
        scores.append(1.0 if m and m.group(1).strip() == str(ref) else 0.0)
    return scores


def on_step(step, metrics):
    if metrics.get("eval/accuracy", 0.0) >= 0.9:
        return "stop"  # ends the run (final checkpoint and evaluation still happen)


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 150
    result = rlvr.train(
        model="rlvr-tiny",
        reward_funcs=[exact_answer],
        train_dataset=make_rows(2000, seed=1),
        eval_dataset=make_rows(128, seed=2),
        preset="dapo",
        config={"train.max_steps": steps, "train.eval_every": 10},
        callbacks=[on_step],
    )
    before = result.summary["eval_before"]["accuracy"]
    after = result.summary["eval_after"]["accuracy"]
    print(f"run directory: {result.run_dir}")
    print(f"held-out accuracy: {before:.3f} -> {after:.3f} in {len(result.metrics)} steps")
