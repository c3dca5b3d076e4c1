"""Rewards for a rollout: accuracy (kept separate: dynamic sampling filters on it), plus the
shaping terms (format, soft overlong punishment, user terms) that make up the total."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlvr.algos import soft_overlong_penalty
from rlvr.config import Config, ConfigError
from rlvr.prompts import Prompt
from rlvr.rollout import Rollout


@dataclass(frozen=True)
class Scores:
    """total: (B,) shaped reward the advantages use; correct: (B,) bool accuracy;
    terms: each term's unweighted (B,) values by name; failures: reward errors scored 0."""

    total: torch.Tensor
    correct: torch.Tensor
    terms: dict[str, torch.Tensor]
    failures: dict[str, int]


def _reward_fn(spec: str, params: dict[str, dict]) -> Callable:
    from rlvr.rewards import make_reward

    return make_reward(spec, **params.get(spec, {}))


@dataclass(frozen=True)
class Scorer:
    cfg: Config
    task: object | None
    accuracy_fn: Callable | None
    shaping: list[tuple[str, float, Callable]]

    @classmethod
    def build(cls, cfg: Config, task) -> Scorer:
        r = cfg.reward
        if r.accuracy == "task" and task is None:
            raise ConfigError(
                "reward.accuracy: 'task' needs a built-in task (data.path is set); "
                "name a reward such as 'math' instead"
            )
        try:
            accuracy_fn = None if r.accuracy == "task" else _reward_fn(r.accuracy, r.params)
            shaping = (
                [("format", r.format_weight, _reward_fn("format", r.params))]
                if r.format_weight
                else []
            )
            for item in r.extra:
                name, weight = item.rsplit("=", 1)
                # a user function is logged under its own name, not its file path
                shaping.append((name.rsplit(":", 1)[-1], float(weight), _reward_fn(name, r.params)))
        except (ValueError, ImportError, AttributeError, FileNotFoundError) as e:
            raise ConfigError(f"reward: {e}") from None
        return cls(cfg, task, accuracy_fn, shaping)

    def _kwargs(self, prompts: list[Prompt], rollout: Rollout) -> dict:
        kwargs = dict(
            group_ids=[i // rollout.group_size for i in range(len(prompts))],
            completion_lengths=rollout.lengths.tolist(),
            truncated=rollout.truncated.tolist(),
            max_new_tokens=self.cfg.rollout.max_new_tokens,
        )
        for key in prompts[0].columns:
            kwargs[key] = [p.columns.get(key) for p in prompts]
        return kwargs

    def accuracy(
        self, prompts: list[Prompt], completions: list[str], rollout: Rollout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) accuracy reward values and (B,) bool correctness (value > 0 for a reward fn)."""
        values, correct, _ = self._accuracy(prompts, completions, rollout)
        return values, correct

    def _accuracy(
        self, prompts: list[Prompt], completions: list[str], rollout: Rollout
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
        """`accuracy`, plus the failures of the accuracy reward (scored 0 under on_error=zero)."""
        r, failures = self.cfg.reward, {}
        if self.accuracy_fn is None:
            correct = torch.tensor(
                [self.task.verify(c, p.example) for p, c in zip(prompts, completions)],
                dtype=torch.bool,
            )
            accuracy = torch.where(correct, r.correct_score, r.wrong_score)
        else:
            from rlvr.rewards import combine_rewards

            res = combine_rewards(
                [("accuracy", 1.0, self.accuracy_fn)],
                [p.text for p in prompts],
                completions,
                [p.answer for p in prompts],
                on_error=r.on_error,
                **self._kwargs(prompts, rollout),
            )
            accuracy = torch.tensor(res.total, dtype=torch.float32)
            correct = accuracy > 0
            failures = dict(res.failures)
        return accuracy.float(), correct, failures

    def __call__(self, prompts: list[Prompt], completions: list[str], rollout: Rollout) -> Scores:
        r, a = self.cfg.reward, self.cfg.algo
        accuracy, correct, failures = self._accuracy(prompts, completions, rollout)
        terms = {"accuracy": accuracy}
        total = accuracy.clone()
        if self.shaping:
            from rlvr.rewards import combine_rewards

            res = combine_rewards(
                self.shaping,
                [p.text for p in prompts],
                completions,
                [p.answer for p in prompts],
                on_error=r.on_error,
                **self._kwargs(prompts, rollout),
            )
            total += torch.tensor(res.total, dtype=torch.float32)
            terms.update(
                {k: torch.tensor(v, dtype=torch.float32) for k, v in res.per_reward.items()}
            )
            failures.update(res.failures)
        if a.soft_overlong:
            penalty = soft_overlong_penalty(
                rollout.lengths, max_len=self.cfg.rollout.max_new_tokens, cache_len=a.overlong_cache
            ).float()
            terms["soft_overlong"] = penalty
            total += penalty
        return Scores(total=total, correct=correct, terms=terms, failures=failures)
