"""Write GSM8K-format problems the built-in tiny model can learn (seeded, offline).

    python examples/word_problems.py        # writes examples/data/word_problems_{train,test}.jsonl

Each row is what GSM8K holds: a "question" and an "answer" whose worked solution ends with
"#### <number>" (the `gsm8k` dataset format splits the number off). The questions are
two-digit sums and differences phrased as the tiny model's warm-up task ("Compute 47+85."),
so RL has partial competence to sharpen (about 23% of sampled answers right at the start).
Prose word problems are beyond a 0.8M-parameter character-level model: with a one-sentence
story in front of the same sum ("Gus has 47 marbles and gets 85 more. Compute 47+85.") it
answers 0.5% of samples right and never the greedy answer, too little for RL to start from.
Train and test draw from disjoint sums.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Gus", "Hana", "Dev", "Ines", "Kofi", "Mara", "Olu", "Priya", "Sam", "Tove"]
THINGS = ["marbles", "books", "stamps", "apples", "coins", "shells", "cards", "pens"]


def problem(rng: random.Random) -> tuple[str, dict]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if rng.random() < 0.5:
        expr, value = f"{a}+{b}", a + b
        how = f"{name} has {a} {thing} and gets {b} more: {a} + {b} = {value}."
    else:
        a, b = max(a, b), min(a, b)
        expr, value = f"{a}-{b}", a - b
        how = f"{name} has {a} {thing} and gives away {b}: {a} - {b} = {value}."
    return expr, {"question": f"Compute {expr}.", "answer": f"{how}\n#### {value}"}


def write(out_dir: Path, n_train: int = 2000, n_test: int = 128, seed: int = 0) -> None:
    rng, seen = random.Random(seed), {}
    while len(seen) < n_train + n_test:
        expr, row = problem(rng)
        seen.setdefault(expr, row)  # one story per sum: test sums never appear in training
    rows = list(seen.values())
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", rows[:n_train]), ("test", rows[n_train:])):
        path = out_dir / f"word_problems_{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part))


if __name__ == "__main__":
    write(Path(__file__).resolve().parent / "data")
