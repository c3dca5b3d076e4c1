"""Collection: prompts -> G responses each -> scores -> kept groups
(docs/algorithms.md#dynamic-sampling).

Under data parallelism every rank draws the same prompt batch and generates for its own
contiguous share of it (whole groups); the correctness of every group is gathered so that
dynamic sampling keeps the same groups on every rank. A kept group lives on the rank that
generated it, numbered by its place among the kept groups of all ranks (`Batch`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from rlvr.algos import DynamicSamplingBuffer, keep_groups, keep_groups_with_spread, refill_size
from rlvr.config.algorithm import Algorithm
from rlvr.data.prompts import Prompt, PromptSource
from rlvr.rewards.scoring import Scores
from rlvr.rollout import Rollout, SamplingParams, derive_seed
from rlvr.run.distributed import Dist
from rlvr.training.batch import Batch, Sample
from rlvr.training.overlap import Generation, Timing, generate_and_score, overlap_parts
from rlvr.training.settings import CollectSettings


class PromptSampler:
    """Epoch-wise shuffled order over the training prompts; its whole state is `position`."""

    def __init__(self, num_prompts: int, seed: int, position: int = 0):
        self.num_prompts, self.seed, self.position = num_prompts, seed, position
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, self.num_prompts)
            if epoch != self._epoch:
                g = torch.Generator().manual_seed(derive_seed(self.seed, "data", epoch))
                self._epoch, self._order = epoch, torch.randperm(self.num_prompts, generator=g)
            out.append(int(self._order[i]))
            self.position += 1
        return out


class Collecting(Generation, Protocol):
    """The parts of a run (`rlvr.training.setup.Run`, built once) that collection reads:
    the engine, tokenizer and scorer, the training prompts and their sampler, the ranks, the
    run's `Algorithm` and `CollectSettings`."""

    source: PromptSource
    sampler: PromptSampler
    d: Dist
    algorithm: Algorithm
    collect_settings: CollectSettings


@dataclass
class Collected:
    """A rollout batch ready for the update (this rank's kept groups), with what its
    collection saw."""

    batch: Batch
    metrics: dict[str, float]
    examples: list[dict]


def _one_token_repeated(ids: list[int], min_len: int = 4) -> bool:
    """A degenerate response: at least `min_len` copies of one token (a final EOS aside)."""
    core = ids if len(set(ids)) == 1 else ids[:-1]
    return len(core) >= min_len and len(set(core)) == 1


class Tally:
    """Sums over everything generated in a step (all generation batches, all ranks).
    `graded`: the run has a notion of correctness; without one the step reports no
    accuracy and counts the groups whose G rewards are equal instead."""

    def __init__(self, graded: bool = True) -> None:
        self.sums: Counter[str] = Counter()
        self.len_max = 0
        self.graded = graded

    def add(self, rollout: Rollout, scores: Scores, completions: list[str], G: int) -> None:
        per_group = scores.correct.view(-1, G).sum(1)
        lengths = rollout.lengths.tolist()
        s = self.sums
        s["n"] += len(lengths)
        s["correct"] += int(scores.correct.sum())
        s["all_correct"] += int((per_group == G).sum()) * G
        s["all_wrong"] += int((per_group == 0).sum()) * G
        lone = G == 1  # a lone sample (PPO) is no group of identical responses
        s["identical"] += G * sum(
            not lone and len(set(completions[g * G : (g + 1) * G])) == 1
            for g in range(len(per_group))
        )
        s["repeat"] += sum(
            _one_token_repeated(rollout.completion_ids[i, :n].tolist())
            for i, n in enumerate(lengths)
        )
        s["truncated"] += int(rollout.truncated.sum())
        s["tokens"] += sum(lengths)
        s["reward_sum"] += float(scores.total.sum())
        s["reward_sq"] += float((scores.total**2).sum())
        for name, values in scores.terms.items():
            s[f"reward/{name}"] += float(values.sum())
        for term, name in scores.functions.items():  # TRL's rewards/<name>/mean and /std
            s[f"rewards/{name}/sum"] += float(scores.terms[term].sum())
            s[f"rewards/{name}/sq"] += float((scores.terms[term] ** 2).sum())
        if not self.graded:
            spread = keep_groups_with_spread(scores.total, G) if G > 1 else torch.ones(0)
            s["equal_reward"] += int((~spread.bool()).sum()) * G
        for name, count in scores.failures.items():
            s[f"failures/{name}"] += count
        self.len_max = max(self.len_max, max(lengths, default=0))
        if rollout.tool_calls is not None:
            for key, value in tool_sums(rollout, scores.correct).items():
                s[key] += value

    def metrics(self, d: Dist) -> dict[str, float]:
        keys = sorted(set().union(*d.gather(sorted(self.sums))))  # every rank's names
        total = dict(zip(keys, d.sum([float(self.sums[k]) for k in keys])))
        n = max(total["n"], 1.0)
        mean = total["reward_sum"] / n
        out = {
            "reward/mean": mean,
            "reward/std": math.sqrt(max(total["reward_sq"] / n - mean**2, 0.0)),
            **{k: v / n for k, v in total.items() if k.startswith("reward/")},
            **{k: v for k, v in total.items() if k.startswith("failures/")},
            **_function_means(total, n),
            **(
                {
                    "accuracy": total["correct"] / n,
                    "groups/all_correct_frac": total["all_correct"] / n,
                    "groups/all_wrong_frac": total["all_wrong"] / n,
                }
                if self.graded
                else {"groups/equal_reward_frac": total["equal_reward"] / n}
            ),
            "groups/identical_frac": total["identical"] / n,
            "response/length_mean": total["tokens"] / n,
            "response/length_max": d.max(self.len_max),
            "response/truncation_rate": total["truncated"] / n,
            "response/repeat_frac": total["repeat"] / n,
            "generated_tokens": total["tokens"],
            "responses": total["n"],
        }
        if "tools/samples" in total:
            out.update(tool_metrics(total))
        if "env/rollouts" in total:
            out.update(env_metrics(total))
        return out


def _function_means(total: dict[str, float], n: float) -> dict[str, float]:
    """TRL's `rewards/<name>/mean` and `/std` (population) of each reward function."""
    out = {}
    for key in total:
        if key.startswith("rewards/") and key.endswith("/sum"):
            name = key[: -len("/sum")]
            mean = total[key] / n
            out[f"{name}/mean"] = mean
            out[f"{name}/std"] = math.sqrt(max(total[f"{name}/sq"] / n - mean**2, 0.0))
    return out


def tool_sums(rollout: Rollout, correct: torch.Tensor) -> dict[str, float]:
    """What the tool metrics add up over a rollout with tools (docs/tools.md#metrics)."""
    called = rollout.tool_calls > 0
    correct = correct.bool().cpu()
    return {
        "tools/samples": float(len(called)),
        "tools/calls": float(rollout.tool_calls.sum()),
        "tools/errors": float(rollout.tool_errors.sum()),
        "tools/seconds": float(rollout.tool_seconds.sum()),
        "tools/tokens": float(rollout.tool_mask.sum()),
        "tools/with_call": float(called.sum()),
        "tools/correct_with_call": float((correct & called).sum()),
        "tools/correct_without_call": float((correct & ~called).sum()),
    }


def tool_metrics(total: dict[str, float]) -> dict[str, float]:
    """Per-sample tool metrics from the step's `tool_sums` (all ranks): calls, errors and
    turns per sample, the tool time, the share of samples that called a tool, and the
    accuracy of the samples with a call and of those without (0 where there are none)."""
    n = max(total["tools/samples"], 1.0)
    with_call = total["tools/with_call"]
    without = total["tools/samples"] - with_call
    return {
        "tools/calls_per_sample": total["tools/calls"] / n,
        "tools/errors_per_sample": total["tools/errors"] / n,
        "tools/turns_per_sample": 1.0 + total["tools/calls"] / n,
        "tools/call_frac": with_call / n,
        "tools/time_s": total["tools/seconds"],
        "tools/tokens_per_sample": total["tools/tokens"] / n,
        "tools/accuracy_with_call": total["tools/correct_with_call"] / max(with_call, 1.0),
        "tools/accuracy_without_call": total["tools/correct_without_call"] / max(without, 1.0),
    }


def env_metrics(total: dict[str, float]) -> dict[str, float]:
    """The agents' counts over a step (docs/environments.md#metrics): rollouts dropped, by
    fault, the mean turns and tool calls of a kept rollout, replies that did not parse, the
    seconds spent in agent calls and the requests one engine call answered."""
    kept = max(total["env/rollouts"] - total["env/dropped"], 1.0)
    out = {k: v for k, v in total.items() if k.startswith("env/faults/")}
    out["env/dropped"] = total["env/dropped"]
    out["env/turns_per_rollout"] = total.get("env/turns", 0.0) / kept
    # replies to requests with tools: the calls parsed, and those that opened a call that
    # did not parse (returned as text)
    out["env/tool_calls_per_rollout"] = total.get("env/tool_calls", 0.0) / kept
    out["env/tool_parse_failures"] = total.get("env/tool_parse_failures", 0.0)
    out["time/agents"] = total["env/seconds"]
    # requests answered per engine call: how well the endpoint batches the agents' requests
    out["env/requests_per_batch"] = total["env/requests"] / max(total["env/engine_calls"], 1.0)
    return out


def _groups(rows: list[Prompt], rollout: Rollout, scores: Scores, G: int) -> list[list[Sample]]:
    def cut(per_token: torch.Tensor | None, i: int) -> torch.Tensor | None:
        """Row i's values over its response's tokens (None where the rollout has none)."""
        return None if per_token is None else per_token[i, : rollout.lengths[i]]

    return [
        [
            Sample(
                prompt_ids=rollout.prompt_ids[i],  # an agent's own first prompt, else the row's
                completion_ids=rollout.completion_ids[i, : rollout.lengths[i]].tolist(),
                truncated=bool(rollout.truncated[i]),
                reward=float(scores.total[i]),
                correct=bool(scores.correct[i]),
                group=g,
                sampling_log_probs=cut(rollout.sampling_log_probs, i),
                token_versions=cut(rollout.token_versions, i),
                tool_mask=cut(rollout.tool_mask, i),
                reward_terms={k: float(v[i]) for k, v in scores.terms.items()},
            )
            for i in range(g * G, (g + 1) * G)
        ]
        for g in range(len(rows) // G)
    ]


def _gathered(d: Dist, parts: list[torch.Tensor]) -> torch.Tensor:
    """This rank's values of a generation batch joined with every other rank's, in order."""
    return torch.cat(d.gather(torch.cat(parts)))


def _sampling_params(
    c: CollectSettings, step: int, gen_batch: int, prompts: list[int] | None, first: int
) -> SamplingParams:
    """One generation batch's sampling; with `prompts` (the dataset indices of this rank's
    prompts, the first at place `first` in the batch) one seed per prompt."""
    row_seeds = None
    if prompts is not None:
        row_seeds = tuple(
            derive_seed(c.seed, "gen", step, gen_batch, p, first + k) for k, p in enumerate(prompts)
        )
    return replace(c.params, seed=derive_seed(c.seed, "gen", step, gen_batch), row_seeds=row_seeds)


def _examples(rows: list[Prompt], completions: list[str], rollout: Rollout, scores: Scores):
    """The first len(rows) responses as the samples log shows them."""
    return [
        {
            "prompt": row.text,
            "completion": completions[i],
            "answer": row.answer,
            "reward": float(scores.total[i]),
            "correct": bool(scores.correct[i]),
            "length": int(rollout.lengths[i]),
        }
        for i, row in enumerate(rows)
    ]


def collect(step: int, run: Collecting) -> Collected:
    """Generate and score until `prompts_per_step` groups are in hand
    (docs/algorithms.md#dynamic-sampling)."""
    c, d, scorer, sampler = run.collect_settings, run.d, run.scorer, run.sampler
    prompts = run.source.train
    G, target = c.group_size, c.prompts_per_step
    parts = overlap_parts(c.overlap, scorer)
    # overlapping parts sample each prompt from its own seed, so the parts draw what one
    # whole batch would
    per_prompt_seeds = c.seed_per_prompt or d.enabled or parts > 1
    buffer = DynamicSamplingBuffer(target, c.max_gen_batches)
    tally, examples, timing = Tally(scorer.graded), [], Timing()
    size = target  # prompts in this generation batch: a whole one first, then refills
    while not buffer.ready:
        batch = sampler.take(size)  # the same on every rank
        lo, hi = d.shard(size)
        mine = [prompts[i] for i in batch[lo:hi]]
        gen_batch = buffer.num_gen_batches

        def params_for(a: int, b: int, lo=lo, batch=batch, gen_batch=gen_batch):
            seeds = [batch[g] for g in range(lo + a, lo + b)] if per_prompt_seeds else None
            return _sampling_params(c, step, gen_batch, seeds, lo + a)

        done = generate_and_score(run, mine, params_for, step=step, parts=parts, timing=timing)
        groups: list[list[Sample]] = []
        for part in done:
            tally.add(part.rollout, part.scores, part.completions, G)
            tally.sums.update(part.env)  # env/*: the agents' turns and dropped rollouts
            want = max(c.log_samples - len(examples), 0)
            examples += _examples(part.rows[:want], part.completions, part.rollout, part.scores)
            groups += _groups(part.rows, part.rollout, part.scores, G)
        if c.dynamic_sampling:  # on every group of the batch, in order
            if scorer.graded:
                keep = keep_groups(_gathered(d, [part.scores.correct for part in done]), G)
            else:
                keep = keep_groups_with_spread(_gathered(d, [p.scores.total for p in done]), G)
        else:
            keep = torch.ones(size, dtype=torch.bool)
        if run.agents is not None:  # a group with a dropped rollout is left out of the step
            keep &= ~_gathered(d, [part.dropped for part in done]).view(-1, G).any(1)
        # one payload per group of the batch: this rank's samples of it (none: another rank's)
        others: list[list[Sample]] = [[] for _ in range(size - (hi - lo))]
        buffer.add(others[:lo] + groups + others[lo:], keep)
        if run.algorithm.adaptive_refill:
            size = refill_size(target, len(buffer), buffer.num_groups_seen)
    result = buffer.pop()
    metrics = tally.metrics(d)
    metrics.update(
        {
            "groups/kept": len(result.groups),
            "groups/gen_batches": result.num_gen_batches,
            "groups/generated": result.num_groups_seen,
            "groups/incomplete": float(not result.complete),
            "time/generation": timing.generation,
            "time/scoring": timing.scoring,
            # what of time/scoring the step spent blocked (all of it unless parts overlap)
            "time/scoring_wait": timing.wait,
            "time/programs_per_s": timing.scored / max(timing.scoring, 1e-9),  # scored /s
        }
    )
    return Collected(batch=Batch.from_groups(result.groups), metrics=metrics, examples=examples)
