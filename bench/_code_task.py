"""The code task of `tests/test_code_learns.py`, for benches that run it as `rlvr train`: one-line
Python functions written as HumanEval rows (400 to train on, 64 held out), the built-in model
warmed by a short supervised phase on them, and the `code` reward (each completion run against
its three assertions in the sandbox).

    python bench/_code_task.py DIR     # DIR/train.jsonl, DIR/test.jsonl, DIR/warm (the model)

`train_args(DIR)` is the run's `rlvr train` arguments (the test's, less the step count and
output directory). The warm-up runs in its own process so a caller that samples a run's
resources never holds torch itself.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = {"+": "plus", "-": "minus", "*": "times"}
SFT_STEPS, SFT_LR, SFT_BATCH = 30, 1e-3, 32
RL_LR = 4e-4


def problem(rng: random.Random, i: int) -> dict:
    """One HumanEval row: `f(x)` described in words, its one-line body, three assertions."""
    op1, k1, op2, k2 = rng.choice("+-*"), rng.randint(1, 9), rng.choice("+-"), rng.randint(1, 9)
    expr = f"x{op1}{k1}{op2}{k2}"
    xs = [rng.randint(-9, 9) for _ in range(3)]
    checks = "".join(f"    assert candidate({x}) == {eval(expr, {'x': x})}\n" for x in xs)
    return {
        "task_id": f"line/{i}",
        "prompt": f'def f(x):\n    """Return x {WORDS[op1]} {k1} {WORDS[op2]} {k2}."""\n',
        "canonical_solution": f"    return {expr}\n",
        "test": "def check(candidate):\n" + checks,
        "entry_point": "f",
    }


def write_rows(path: Path, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = [problem(rng, i) for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def warm_up(rows: list[dict], out: Path) -> None:
    """A short supervised phase: the prompt in the chat template, the loss on the body."""
    import torch
    import torch.nn.functional as F

    from rlvr.models import ASSETS_DIR, TINY_MODEL_NAME, build_tokenizer, load_model

    torch.manual_seed(0)
    tok = build_tokenizer()
    model = load_model(str(ASSETS_DIR / TINY_MODEL_NAME))
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR)
    rng = random.Random(0)
    for _ in range(SFT_STEPS):
        seqs = []
        for r in rng.sample(rows, SFT_BATCH):
            chat = [{"role": "user", "content": r["prompt"]}]
            prompt = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            c = tok(r["canonical_solution"].rstrip("\n"), add_special_tokens=False)["input_ids"]
            c = [*c, tok.eos_token_id]
            seqs.append((p + c, [-100] * len(p) + c))
        width = max(len(ids) for ids, _ in seqs)
        ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s, _ in seqs])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in seqs])
        mask = (torch.arange(width) < torch.tensor([len(s) for s, _ in seqs])[:, None]).long()
        logits = model(input_ids=ids, attention_mask=mask).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)


def train_args(d: Path) -> list[str]:
    """The test's `rlvr train` arguments on the data and model in `d`."""
    return [
        f"--model.name_or_path={d / 'warm'}",
        f"--data.path={d / 'train.jsonl'}", "--data.format=humaneval",
        f"--data.eval_path={d / 'test.jsonl'}", "--train.eval_size=64",
        "--rollout.group_size=8", "--rollout.prompts_per_step=8",
        "--preset=grpo", "--rollout.max_new_tokens=24", f"--optim.lr={RL_LR}",
    ]  # fmt: skip


def main(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    rows = write_rows(d / "train.jsonl", 400, seed=0)
    write_rows(d / "test.jsonl", 64, seed=1)
    warm_up(rows, d / "warm")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
