"""A code task learns end to end: the built-in model, warmed in this test by a short supervised
phase on one-line Python functions written as HumanEval rows, then trained by RL through the
`code` reward (each completion run against its problem's assertions in the sandbox, scoring
overlapped with generation) raises its held-out pass rate by at least 0.2."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F

from rlvr.cli.main import main
from rlvr.models import ASSETS_DIR, TINY_MODEL_NAME, build_tokenizer, load_model
from rlvr.rewards.sandbox import available_isolation

WORDS = {"+": "plus", "-": "minus", "*": "times"}
# measured on the shipped rlvr-tiny: held-out pass rate 0.547 -> 0.781 (64 problems)
SFT_STEPS, SFT_LR, SFT_BATCH = 30, 1e-3, 32
RL_STEPS, RL_LR = 40, 4e-4


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


def write_rows(path, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = [problem(rng, i) for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def warm_up(rows: list[dict], out) -> None:
    """A short supervised phase: the prompt in the chat template, the loss on the body."""
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


@pytest.mark.slow
@pytest.mark.skipif(available_isolation() != "namespaces", reason="no Linux namespaces here")
def test_rl_raises_the_pass_rate_of_a_warmed_model_on_one_line_functions(tmp_path):
    rows = write_rows(tmp_path / "train.jsonl", 400, seed=0)
    write_rows(tmp_path / "test.jsonl", 64, seed=1)
    warm_up(rows, tmp_path / "warm")
    run = tmp_path / "run"
    argv = ["train", f"--model.name_or_path={tmp_path / 'warm'}", "--no-progress"]
    argv += [f"--data.path={tmp_path / 'train.jsonl'}", "--data.format=humaneval"]
    argv += [f"--data.eval_path={tmp_path / 'test.jsonl'}", "--train.eval_size=64"]
    argv += ["--rollout.group_size=8", "--rollout.prompts_per_step=8"]
    argv += ["--preset=grpo", "--rollout.max_new_tokens=24", f"--optim.lr={RL_LR}"]
    argv += [f"--max-steps={RL_STEPS}"]
    argv += ["--output-dir", str(run)]
    assert main(argv) == 0
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    assert after >= before + 0.2, (before, after)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["time/programs_per_s"] > 0 for r in rows)
