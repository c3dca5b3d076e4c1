"""Rewards for a rollout: accuracy (kept separate: dynamic sampling filters on it), plus the
shaping terms (format, soft overlong punishment, user terms) that make up the total.

Every reward function is called as TRL's GRPOTrainer calls one (`rlvr.rewards.combine`
documents the keyword arguments). "Correct", for dynamic sampling and the accuracy metrics,
is the task verifier's verdict under `reward.accuracy: task`, and otherwise an accuracy score
above `reward.correct_threshold` (default 0: a score > 0 is correct). Under `reward.accuracy:
none` the run has no notion of correctness: the total is the other rewards' sum, nothing counts
as correct, and dynamic sampling keeps the groups whose rewards differ.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.algos import soft_overlong_penalty
from rlvr.config.schema import Config, ConfigError, RewardConfig
from rlvr.data.prompts import Prompt
from rlvr.rewards.combine import RESERVED_KWARGS, combine_rewards
from rlvr.rewards.limits import with_time_limit
from rlvr.rollout import Rollout


@dataclass(frozen=True)
class Scores:
    """total: (B,) shaped reward the advantages use; correct: (B,) bool accuracy;
    terms: each term's unweighted (B,) values by name; failures: reward errors scored 0;
    errors: each failing reward's first error message; functions: the terms that are reward
    functions, by the function's name (TRL's `rewards/<name>/mean`)."""

    total: torch.Tensor
    correct: torch.Tensor
    terms: dict[str, torch.Tensor]
    failures: dict[str, int]
    errors: dict[str, str] = field(default_factory=dict)
    functions: dict[str, str] = field(default_factory=dict)


@dataclass
class TrainerState:
    """The `trainer_state` rewards receive (TRL's names): the step being scored (0 before
    the first step) and the run's length, for rewards that change with progress."""

    global_step: int = 0
    max_steps: int = 0


def _reward_fn(spec: str, r: RewardConfig) -> Callable:
    """The reward `spec` names, configured from `r.params`, under `r.timeout_s`: user
    functions in a killable worker process when `r.isolate_user`, else in-process."""
    from rlvr.rewards import make_reward
    from rlvr.rewards.limits import ProcessReward
    from rlvr.rewards.sandbox import SandboxUnavailable, resolve_isolation

    params = dict(r.params.get(spec, {}))
    if spec == "code":
        if "isolation" in params:
            raise ValueError("params.code.isolation: set reward.sandbox_isolation instead")
        try:
            resolve_isolation(r.sandbox_isolation)  # refuse now, not at the first step
        except SandboxUnavailable as e:
            raise ValueError(str(e)) from None
        params["isolation"] = r.sandbox_isolation
    if ":" in spec and r.isolate_user:
        return ProcessReward(spec, params, _term_name(spec), r.timeout_s, r.python_path)
    return with_time_limit(make_reward(spec, **params), _term_name(spec), r.timeout_s)


def needs_reference(fn: Callable) -> bool:
    """True when `fn` cannot score without the reference answer: it takes `answer` with no
    default, or says so itself (`fn.needs_reference`, as the `math` reward does)."""
    if getattr(fn, "needs_reference", False):
        return True
    try:
        param = inspect.signature(fn).parameters.get("answer")
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return param is not None and param.default is inspect.Parameter.empty and param.kind in kinds


def _term_name(spec: str) -> str:
    """A user function is logged under its own name, not its file path."""
    return spec.rsplit(":", 1)[-1]


@dataclass(frozen=True)
class Scorer:
    cfg: Config
    task: object | None
    accuracy_fn: Callable | None
    shaping: list[tuple[str, float, Callable]]
    state: TrainerState = field(default_factory=TrainerState)

    @classmethod
    def build(
        cls,
        cfg: Config,
        task,
        functions: Mapping[str, Callable] | None = None,
        *,
        has_answer: bool = True,
        scored_by_agents: bool = False,
    ) -> Scorer:
        """`functions` maps names used in `cfg.reward` to callables handed in by the Python
        API (they take precedence over the registry's names). `has_answer=False` (a
        prompt-only dataset) refuses, by name, a reward that needs the reference answer.
        `scored_by_agents`: an environment's agents give the accuracy scores (`given`), so
        reward.accuracy "task" needs no built-in task."""
        from rlvr.config.callables import extend_sys_path

        r, functions = cfg.reward, dict(functions or {})
        extend_sys_path(r.python_path)
        if r.accuracy == "task" and task is None and not scored_by_agents:
            raise ConfigError(
                "reward.accuracy: 'task' needs a built-in task (data.path is set); "
                "name a reward such as 'math' instead"
            )

        if not (math.isfinite(r.timeout_s) and r.timeout_s >= 0):
            raise ConfigError(
                f"reward.timeout_s: expected seconds >= 0 (0: none), got {r.timeout_s}"
            )

        def fn(spec: str) -> Callable:
            if spec in functions:
                return with_time_limit(functions[spec], _term_name(spec), r.timeout_s)
            return _reward_fn(spec, r)

        try:
            accuracy_fn = None if r.accuracy in ("task", "none") else fn(r.accuracy)
            shaping = [("format", r.format_weight, fn("format"))] if r.format_weight else []
            for item in r.extra:
                name, weight = item.rsplit("=", 1)
                shaping.append((_term_name(name), float(weight), fn(name)))
        except (ValueError, ImportError, AttributeError, FileNotFoundError) as e:
            raise ConfigError(f"reward: {e}") from None
        if not has_answer:
            named = [(r.accuracy, accuracy_fn)] + [(n, f) for n, _, f in shaping]
            for spec, f in named:
                if f is not None and needs_reference(f):
                    raise ConfigError(
                        f"reward {_term_name(spec)!r} needs the reference answer (its argument "
                        f"'answer'), but {cfg.data.path} has no 'answer' column (a prompt-only "
                        "dataset); name the column holding it with data.answer_field=COLUMN, "
                        "or use a reward that needs no reference"
                    )
        names = [s[0] for s in shaping]
        if len(set(names)) != len(names) or "accuracy" in names:
            raise ConfigError(f"reward.extra: reward names must be unique, got {names}")
        state = TrainerState(max_steps=cfg.train.max_steps)
        return cls(cfg, task, accuracy_fn, shaping, state)

    @property
    def graded(self) -> bool:
        """Whether the run has a notion of correctness (`reward.accuracy` is not "none")."""
        return self.cfg.reward.accuracy != "none"

    def functions(self) -> dict[str, str]:
        """The terms that are reward functions, by the function's name."""
        r = self.cfg.reward
        out = {} if self.accuracy_fn is None else {"accuracy": _term_name(r.accuracy)}
        return {**out, **{name: name for name, _, _ in self.shaping}}

    def sandbox_bytes(self) -> float:
        """What the rewards' sandboxes may hold at once (`code`: its workers x one sandbox's
        budget), for the memory guard."""
        fns = [self.accuracy_fn] + [f for _, _, f in self.shaping]
        return float(sum(getattr(f, "sandbox_bytes", 0) for f in fns if f is not None))

    def runs_programs(self) -> bool:
        """Whether a reward of the run scores by running programs in sandboxes (`code`)."""
        return self.sandbox_bytes() > 0

    def _prompt(self, p: Prompt) -> str | list[dict]:
        """The prompt as rewards see it: the dataset's chat messages, or its string through
        `data.prompt_template`; a built-in task's question; else the rendered text."""
        from rlvr.data.dataset import PromptExample, build_messages

        d = self.cfg.data
        if isinstance(p.example, PromptExample):
            if p.example.messages is not None:
                return build_messages(p.example, system_prompt=d.system_prompt)
            return d.prompt_template.replace("{question}", p.example.prompt)
        if self.task is not None and p.example is not None:
            return self.task.prompt_messages(p.example)[-1]["content"]
        return p.text

    def reward_kwargs(
        self, prompts: list[Prompt], completions: list[str], rollout: Rollout
    ) -> dict[str, Any]:
        """Every keyword argument a reward function receives for this batch."""
        raw = [self._prompt(p) for p in prompts]
        lengths = rollout.lengths.tolist()
        kwargs: dict[str, Any] = dict(
            prompts=raw,
            completions=[
                [{"role": "assistant", "content": c}] if isinstance(p, list) else c
                for p, c in zip(raw, completions)
            ],
            completion_ids=[rollout.completion_ids[i, :n].tolist() for i, n in enumerate(lengths)],
            prompt_texts=[p.text for p in prompts],
            completion_lengths=lengths,
            truncated=rollout.truncated.tolist(),
            group_ids=[i // rollout.group_size for i in range(len(prompts))],
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            trainer_state=self.state,
        )
        if any(p.answer is not None for p in prompts):  # none in a prompt-only dataset
            kwargs["answer"] = [p.answer for p in prompts]
        columns = dict.fromkeys(k for p in prompts for k in p.columns)
        for key in columns:
            if key in RESERVED_KWARGS:  # the loader refuses these; a hand-built Prompt may not
                raise ConfigError(
                    f"dataset column {key!r} has a name reserved for the trainer's reward "
                    f"arguments ({', '.join(RESERVED_KWARGS)}); rename the column"
                )
            kwargs[key] = [p.columns.get(key) for p in prompts]
        return kwargs

    def accuracy(
        self, prompts: list[Prompt], completions: list[str], rollout: Rollout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) accuracy reward values and (B,) bool correctness."""
        values, correct, _ = self._accuracy(prompts, completions, rollout, None)
        return values, correct

    def _accuracy(self, prompts, completions, rollout, kwargs):
        """`accuracy`, plus the result of the accuracy reward (failures, errors) when it is
        a function."""
        r = self.cfg.reward
        if not self.graded:  # what a held-out answer scores: the rewards' total
            kwargs = kwargs or self.reward_kwargs(prompts, completions, rollout)
            res = combine_rewards(self.shaping, kwargs, on_error=r.on_error)
            wrong = torch.zeros(len(prompts), dtype=torch.bool)
            return torch.tensor(res.total, dtype=torch.float32), wrong, None
        if self.accuracy_fn is None:  # the task's score s in [0, 1]: 1 correct, 0 wrong
            score = torch.tensor(
                [self.task.score(c, p.example) for p, c in zip(prompts, completions)],
                dtype=torch.float32,
            )
            between = r.wrong_score + (r.correct_score - r.wrong_score) * score
            accuracy = torch.where(score >= 1.0, r.correct_score, r.wrong_score)
            accuracy = torch.where((score > 0) & (score < 1), between, accuracy)
            return accuracy.float(), score >= 1.0, None
        kwargs = kwargs or self.reward_kwargs(prompts, completions, rollout)
        name = _term_name(r.accuracy)  # errors and failures/* name the user's reward
        res = combine_rewards([(name, 1.0, self.accuracy_fn)], kwargs, on_error=r.on_error)
        accuracy = torch.tensor(res.total, dtype=torch.float32)
        return accuracy, accuracy > r.correct_threshold, res

    def __call__(
        self,
        prompts: list[Prompt],
        completions: list[str],
        rollout: Rollout,
        step: int | None = None,
        given: torch.Tensor | None = None,
        given_terms: Mapping[str, torch.Tensor] | None = None,
    ) -> Scores:
        """`given`: (B,) accuracy scores from elsewhere (an agent's rewards, env.agent), in
        place of the accuracy reward; correct where above reward.correct_threshold.
        `given_terms`: the named terms `given` is the weighted sum of (an environment's), each
        (B,), kept as terms of their own (logged as reward/<name>, read by GDPO)."""
        r, a = self.cfg.reward, self.cfg.algo
        if step is not None:
            self.state.global_step = step
        kwargs = self.reward_kwargs(prompts, completions, rollout)
        if given is not None:
            res, terms, total = None, {"accuracy": given}, r.accuracy_weight * given
            terms.update(given_terms or {})
            correct = given > r.correct_threshold
        elif self.graded:
            accuracy, correct, res = self._accuracy(prompts, completions, rollout, kwargs)
            terms, total = {"accuracy": accuracy}, r.accuracy_weight * accuracy
        else:
            res, terms, total = None, {}, torch.zeros(len(prompts))
            correct = torch.zeros(len(prompts), dtype=torch.bool)
        failures = dict(res.failures) if res else {}
        errors = dict(res.errors) if res else {}
        if self.shaping:
            res = combine_rewards(self.shaping, kwargs, on_error=r.on_error)
            total = total + torch.tensor(res.total, dtype=torch.float32)
            terms.update(
                {k: torch.tensor(v, dtype=torch.float32) for k, v in res.per_reward.items()}
            )
            failures.update(res.failures)
            errors.update(res.errors)
        if a.soft_overlong:
            penalty = soft_overlong_penalty(
                # the model's own tokens: tool turns are not the model's length
                rollout.model_lengths,
                max_len=self.cfg.rollout.max_new_tokens,
                cache_len=a.overlong_cache,
            ).float()
            terms["soft_overlong"] = penalty
            total = total + penalty
        return Scores(
            total=total,
            correct=correct,
            terms=terms,
            failures=failures,
            errors=errors,
            functions=self.functions(),
        )
