"""Can PPO's critic predict the built-in task's returns? The information there is, what the
critic's starting features hold, and what the critic learns from a stream of rollouts.

    python bench/critic_probe.py                       # 4,096 + 512 rollouts, writes OUT/probe.json
    python bench/critic_probe.py --set critic.lr=3e-3 --set algo.mu=4 --out runs/critic_probe/mu4
    python bench/critic_probe.py --rollouts 512 --test 128 --out /tmp/x   # test the script

Rollouts are sampled at temperature 1 from a fixed policy (the ppo preset's model, rlvr-tiny by
default) with the run's own engine and scorer. The return of every response token is its
score (gamma = lam = 1, no KL: the Monte Carlo target), and every figure is explained
variance per token over the valid tokens of the held-out rollouts, 1 - Var(R - V) / Var(R),
as `critic/explained_variance` is computed:

- `on_track`: the information bound's floor. V_t = the training rollouts' mean score of the
  tokens whose prefix still equals the task's reference completion, or of those whose prefix
  has left it (two numbers fitted on the training rollouts).
- `linear_probe`: a ridge regression of R on the critic's starting last hidden state (what the
  value head reads), fitted on the training rollouts.
- `surprise`: a ridge regression of R on what the policy thought of the tokens it sampled
  before t: the lowest log-probability among them (raw, floored at -3, below -0.7, below
  -1.5), how many fell below -0.7 (capped at 3, and whether any did) and t / 20.
- `critic`: the critic (the plain head, `critic.arch=head`) as `rlvr train --preset ppo` builds and trains it (`build_critic`,
  `critic_update` with the preset's lr, clip and mini-batches), fed the training rollouts once
  in steps of `rollout.prompts_per_step`, as a run with a fixed policy would be.
- `control`: the same critic fed the same rollouts with the return 1 when the prompt is an
  addition and 0 otherwise, a target its input shows plainly.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch
from rich.console import Console

from rlvr.algos import explained_variance
from rlvr.config.load import load_config, parse_overrides
from rlvr.models import load_model, load_tokenizer
from rlvr.run.distributed import Dist
from rlvr.tasks.arithmetic import ArithmeticTask
from rlvr.tasks.base import Example
from rlvr.training.batch import Sample, collate, token_log_probs
from rlvr.training.collect import collect
from rlvr.training.critic import CriticTargets, critic_update, predict_values
from rlvr.training.policy import build_critic
from rlvr.training.settings import CriticContext
from rlvr.training.setup import setup

ROOT = Path(__file__).resolve().parent.parent


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=4096, help="training rollouts")
    p.add_argument("--test", type=int, default=512, help="held-out rollouts")
    p.add_argument("--model", default="rlvr-tiny", help="the fixed policy")
    p.add_argument("--evals", type=int, default=8, help="held-out evaluations of the critic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a config change for the critic, e.g. critic.lr=3e-3 or algo.mu=4")  # fmt: skip
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "critic_probe")
    return p.parse_args()


def _rollouts(cfg, n: int) -> list[Sample]:
    run, _ = setup(cfg, None, Console(stderr=True, quiet=True))
    out, step = [], 0
    with torch.no_grad():
        while len(out) < n:
            step += 1
            got = collect(step, run)
            out += got.batch.samples
    return out[:n]


def _reference(tokenizer, prompt_ids: list[int]) -> list[int]:
    a, op, b = re.search(r"Compute (\d+)([+-])(\d+)", tokenizer.decode(prompt_ids)).groups()
    a, b = int(a), int(b)
    value = a + b if op == "+" else a - b
    example = Example(f"{a}{op}{b}", str(value), {"a": a, "b": b, "op": op})
    text = ArithmeticTask().reference_completion(example)
    return tokenizer.encode(text, add_special_tokens=False)


def _grid(samples: list[Sample], score) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) returns (the score on every token) and the valid-token mask."""
    width = max(len(s.completion_ids) for s in samples)
    mask = torch.zeros(len(samples), width)
    for i, s in enumerate(samples):
        mask[i, : len(s.completion_ids)] = 1
    returns = torch.tensor([score(s) for s in samples])[:, None] * mask
    return returns, mask


def _on_track(tokenizer, train: list[Sample], test: list[Sample]) -> float:
    def flags(samples):
        rows = []
        for s in samples:
            ref, on = _reference(tokenizer, s.prompt_ids), []
            for t in range(len(s.completion_ids)):  # V_t sees completion[:t]
                on.append(s.completion_ids[:t] == ref[:t])
            rows.append(on)
        width = max(len(r) for r in rows)
        return torch.tensor([r + [False] * (width - len(r)) for r in rows])

    f_train, f_test = flags(train), flags(test)
    r_train, m_train = _grid(train, lambda s: s.reward)
    r_test, m_test = _grid(test, lambda s: s.reward)
    on, off = f_train & m_train.bool(), ~f_train & m_train.bool()
    v_on = float(r_train[on].mean()) if on.any() else 0.0
    v_off = float(r_train[off].mean()) if off.any() else 0.0
    values = torch.where(f_test, torch.tensor(v_on), torch.tensor(v_off))
    return explained_variance(values, r_test, m_test)


def _features(critic, samples: list[Sample], pad_id: int) -> torch.Tensor:
    mb = collate(samples, pad_id, "cpu")
    with torch.no_grad():
        hidden = critic.model.backbone(
            input_ids=mb.input_ids,
            attention_mask=mb.attention_mask,
            position_ids=mb.position_ids,
            use_cache=False,
        ).last_hidden_state
    width = mb.response_mask.shape[1]
    states = hidden[:, mb.prompt_width - 1 : mb.prompt_width - 1 + width]
    return states[mb.response_mask.bool()].double()


def _linear_probe(cfg, train, test, pad_id: int) -> float:
    critic = build_critic(cfg, torch.device("cpu"), Dist())
    return _ridge(_features(critic, train, pad_id), train, _features(critic, test, pad_id), test)


def _surprise_features(lm, samples: list[Sample], pad_id: int) -> torch.Tensor:
    mb = collate(samples, pad_id, "cpu")
    with torch.no_grad():
        lp, _ = token_log_probs(lm, mb, temperature=1.0)
    m = mb.response_mask.bool()
    lp = torch.where(m, lp.float(), torch.zeros_like(lp, dtype=torch.float32))
    before = torch.cat([torch.zeros(len(samples), 1), lp[:, :-1]], 1)  # V_t sees tokens < t
    low = torch.cummin(before, 1).values
    slips = torch.cumsum((before < -0.7).float(), 1)
    t = torch.arange(lp.shape[1]).expand_as(lp).float()
    cols = [low, low.clamp(min=-3), (low < -0.7).float(), (low < -1.5).float(),
            slips.clamp(max=3), (slips > 0).float(), t / 20]  # fmt: skip
    return torch.stack([c[m] for c in cols], 1).double()


def _ridge(x_train, train, x_test, test) -> float:
    r_train, m_train = _grid(train, lambda s: s.reward)
    r_test, m_test = _grid(test, lambda s: s.reward)
    y = r_train[m_train.bool()].double()
    x1 = torch.cat([x_train, torch.ones(len(x_train), 1, dtype=torch.float64)], 1)
    w = torch.linalg.solve(x1.T @ x1 + 1e-2 * torch.eye(x1.shape[1], dtype=torch.float64), x1.T @ y)
    pred = torch.cat([x_test, torch.ones(len(x_test), 1, dtype=torch.float64)], 1) @ w
    values = torch.zeros_like(r_test)
    values[m_test.bool()] = pred.float()
    return explained_variance(values, r_test, m_test)


def _critic_curve(cfg, train, test, score, pad_id: int, evals: int) -> list[dict]:
    critic = build_critic(cfg, torch.device("cpu"), Dist())
    c = CriticContext.from_config(cfg, pad_id, "cpu", Dist())
    per_step = cfg.rollout.prompts_per_step
    steps = len(train) // per_step
    r_test, m_test = _grid(test, score)
    curve = []

    def evaluate(step: int) -> None:
        v = predict_values(critic, test, r_test.shape[1], c)
        ev = explained_variance(v, r_test, m_test)
        curve.append({"step": step, "rollouts": step * per_step, "ev": ev})

    evaluate(0)
    for k in range(steps):
        batch = [Sample(s.prompt_ids, s.completion_ids, s.truncated, score(s), s.correct, i)
                 for i, s in enumerate(train[k * per_step : (k + 1) * per_step])]  # fmt: skip
        returns, mask = _grid(batch, lambda s: s.reward)
        old = predict_values(critic, batch, returns.shape[1], c)
        t = CriticTargets(old_values=old, returns=returns, mask=mask)
        critic_update(critic, batch, len(batch), t, c)
        if (k + 1) % max(1, steps // evals) == 0 or k + 1 == steps:
            evaluate(k + 1)
    return curve


def main() -> None:
    a = _args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(a.seed)
    overrides = {
        "model": {"name_or_path": a.model},
        "train": {"output_dir": str(a.out / "rollouts"), "seed": a.seed, "eval_size": 0},
    }
    cfg = load_config(overrides=overrides, preset="ppo")
    t0 = time.perf_counter()
    samples = _rollouts(cfg, a.rollouts + a.test)
    overrides["critic"] = {"arch": "head"}  # the plain head: no reference log-probs here
    for section, changes in parse_overrides([f"--{x}" for x in a.set]).items():
        overrides.setdefault(section, {}).update(changes)
    cfg = load_config(overrides=overrides, preset="ppo")  # the critic's settings
    train, test = samples[: a.rollouts], samples[a.rollouts :]
    tokenizer = load_tokenizer(a.model)
    lm = load_model(a.model).eval()
    pad_id = tokenizer.pad_token_id
    plus = tokenizer.convert_tokens_to_ids("+")
    result = {
        "model": a.model,
        "rollouts": len(train),
        "test": len(test),
        "test_accuracy": sum(s.correct for s in test) / len(test),
        "critic_lr": cfg.critic.lr,
        "mini_batches": cfg.algo.mini_batches,
        "mu": cfg.algo.mu,
        "set": a.set,
        "on_track": _on_track(tokenizer, train, test),
        "linear_probe": _linear_probe(cfg, train, test, pad_id),
        "surprise": _ridge(
            _surprise_features(lm, train, pad_id), train, _surprise_features(lm, test, pad_id), test
        ),
        "critic": _critic_curve(cfg, train, test, lambda s: s.reward, pad_id, a.evals),
        "control": _critic_curve(
            cfg, train, test, lambda s: float(plus in s.prompt_ids), pad_id, a.evals
        ),
    }
    result["wall_s"] = time.perf_counter() - t0
    (a.out / "probe.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("critic", "control")}))
    for name in ("critic", "control"):
        print(name, " ".join(f"{p['rollouts']}:{p['ev']:.3f}" for p in result[name]))


if __name__ == "__main__":
    main()
