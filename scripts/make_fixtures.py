"""Write the small dataset fixtures in tests/fixtures/ (all text made up here, seeded).

    python scripts/make_fixtures.py            # rewrite the files
    python scripts/make_fixtures.py --check    # exit 1 if a file differs (tests call this)

gsm8k_sample.jsonl: GSM8K-format word problems ("question"; "answer" = reasoning then
    "#### N") with small numbers, which configs/gsm8k_tiny.yaml trains the tiny model on;
gsm8k_eval_sample.jsonl: 32 more from another seed, its held-out set.
dapo_math_sample.jsonl / .parquet: DAPO-Math-17k format (a chat-messages "prompt",
    "reward_model.ground_truth"), each prompt repeated 3 times as in the public copy.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

_NAMES = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana"]
_ITEMS = ["apples", "pens", "stamps", "marbles", "books", "shells"]

DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should "
    "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
    'problem.\n\n{problem}\n\nRemember to put your answer on its own line after "Answer:".'
)
DAPO_PROBLEMS = [
    ("What is the sum of the first 10 positive odd integers?", "100"),
    ("Find the remainder when $2^{10}$ is divided by 7.", "2"),
    ("If $3x + 5 = 20$, what is $x$?", "5"),
    ("How many positive divisors does 36 have?", "9"),
    ("Compute $\\binom{6}{2}$.", "15"),
    ("What is the least common multiple of 4 and 6?", "12"),
]


def gsm8k_rows(n: int = 64, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        if rng.random() < 0.5:
            q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have?"
            ans = f"{name} has {a} + {b} = {a + b} {item}.\n#### {a + b}"
        else:
            a, b = max(a, b), min(a, b)
            q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
            ans = f"{name} has {a} - {b} = {a - b} {item} left.\n#### {a - b}"
        rows.append({"question": q, "answer": ans})
    return rows


def dapo_rows(repeats: int = 3) -> list[dict]:
    rows = []
    for r in range(repeats):
        for i, (problem, answer) in enumerate(DAPO_PROBLEMS):
            rows.append(
                {
                    "data_source": "math_dapo",
                    "prompt": [
                        {"role": "user", "content": DAPO_INSTRUCTION.format(problem=problem)}
                    ],
                    "ability": "MATH",
                    "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
                    "extra_info": {"index": f"fixture-{i}-{r}"},
                }
            )
    return rows


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main(check: bool) -> int:
    texts = {
        "gsm8k_sample.jsonl": jsonl(gsm8k_rows()),
        "gsm8k_eval_sample.jsonl": jsonl(gsm8k_rows(32, seed=1)),
        "dapo_math_sample.jsonl": jsonl(dapo_rows()),
    }
    stale = [n for n, t in texts.items() if not (FIXTURES / n).exists() or
             (FIXTURES / n).read_text() != t]  # fmt: skip
    if check:
        print("stale:", stale) if stale else None
        return 1 if stale else 0
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (FIXTURES / name).write_text(text)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(dapo_rows()), FIXTURES / "dapo_math_sample.parquet")
    return 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv))
