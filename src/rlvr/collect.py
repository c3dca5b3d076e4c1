"""Collection: prompts -> G responses each -> scores -> kept groups (ALGORITHMS.md §5.3)."""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

import torch

from rlvr.algos import DynamicSamplingBuffer, keep_groups
from rlvr.batching import Sample
from rlvr.config import Config
from rlvr.evaluation import decode_completions
from rlvr.prompts import Prompt
from rlvr.rollout import RolloutEngine, SamplingParams
from rlvr.scoring import Scorer


def derive_seed(*parts: int | str) -> int:
    """A stable 31-bit seed from (run seed, step, batch, ...): every draw of the run is a pure
    function of its coordinates, so a resumed run replays exactly."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


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


@dataclass
class Collected:
    """A rollout batch ready for the update, with what its collection saw."""

    samples: list[Sample]
    metrics: dict[str, float]
    examples: list[dict]


def collect(
    step: int,
    cfg: Config,
    engine: RolloutEngine,
    tokenizer,
    scorer: Scorer,
    prompts: list[Prompt],
    sampler: PromptSampler,
) -> Collected:
    """Generate and score until `prompts_per_step` groups are in hand (ALGORITHMS.md §5.3)."""
    r, G = cfg.rollout, cfg.rollout.group_size
    target = r.prompts_per_step
    buffer = DynamicSamplingBuffer(
        target, cfg.algo.max_gen_batches if cfg.algo.dynamic_sampling else 1
    )
    seen = {
        "n": 0,
        "all_correct": 0,
        "all_wrong": 0,
        "correct": 0,
        "truncated": 0,
        "len_sum": 0,
        "len_max": 0,
        "tokens": 0,
        "reward_sum": 0.0,
        "repeat": 0,
        "identical": 0,
        "reward_sq": 0.0,
    }
    terms_sum: dict[str, float] = {}
    examples: list[dict] = []
    t_gen = t_score = 0.0
    while not buffer.ready:
        batch_prompts = [prompts[i] for i in sampler.take(target)]
        t0 = time.perf_counter()
        params = SamplingParams(
            n=G,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            min_new_tokens=r.min_new_tokens,
            seed=derive_seed(cfg.train.seed, "gen", step, buffer.num_gen_batches),
        )
        rollout = engine.generate([p.ids for p in batch_prompts], params)
        t1 = time.perf_counter()
        rows = [p for p in batch_prompts for _ in range(G)]
        completions = decode_completions(tokenizer, rollout)
        scores = scorer(rows, completions, rollout)
        t_score += time.perf_counter() - t1
        t_gen += t1 - t0
        per_group = scores.correct.view(-1, G).sum(1)
        seen["repeat"] += sum(
            _one_token_repeated(rollout.completion_ids[i, :n].tolist())
            for i, n in enumerate(rollout.lengths.tolist())
        )
        seen["identical"] += sum(
            len(set(completions[g * G : (g + 1) * G])) == 1 for g in range(len(batch_prompts))
        )
        seen["n"] += len(rows)
        seen["all_correct"] += int((per_group == G).sum())
        seen["all_wrong"] += int((per_group == 0).sum())
        seen["correct"] += int(scores.correct.sum())
        seen["truncated"] += int(rollout.truncated.sum())
        seen["len_sum"] += int(rollout.lengths.sum())
        seen["len_max"] = max(seen["len_max"], int(rollout.lengths.max()))
        seen["reward_sum"] += float(scores.total.sum())
        seen["reward_sq"] += float((scores.total**2).sum())
        for name, values in scores.terms.items():
            terms_sum[name] = terms_sum.get(name, 0.0) + float(values.sum())
        for name, count in scores.failures.items():
            terms_sum[f"failures/{name}"] = terms_sum.get(f"failures/{name}", 0.0) + count
        if len(examples) < cfg.train.log_samples:
            examples += [
                {
                    "prompt": rows[i].text,
                    "completion": completions[i],
                    "answer": rows[i].answer,
                    "reward": float(scores.total[i]),
                    "correct": bool(scores.correct[i]),
                    "length": int(rollout.lengths[i]),
                }
                for i in range(0, min(len(rows), cfg.train.log_samples - len(examples)))
            ]
        groups = [
            [
                Sample(
                    prompt_ids=rows[i].ids,
                    completion_ids=rollout.completion_ids[i, : rollout.lengths[i]].tolist(),
                    truncated=bool(rollout.truncated[i]),
                    reward=float(scores.total[i]),
                    correct=bool(scores.correct[i]),
                    group=g,
                )
                for i in range(g * G, (g + 1) * G)
            ]
            for g in range(len(batch_prompts))
        ]
        if cfg.algo.dynamic_sampling:
            keep = keep_groups(scores.correct, G)
        else:
            keep = torch.ones(len(groups), dtype=torch.bool)
        buffer.add(groups, keep)
    result = buffer.pop()
    n = seen["n"]
    mean = seen["reward_sum"] / n
    metrics = {
        "reward/mean": mean,
        "reward/std": math.sqrt(max(seen["reward_sq"] / n - mean**2, 0.0)),
        **{f"reward/{k}": v / n for k, v in terms_sum.items() if not k.startswith("failures/")},
        **{k: v for k, v in terms_sum.items() if k.startswith("failures/")},
        "accuracy": seen["correct"] / n,
        "groups/all_correct_frac": seen["all_correct"] * G / n,
        "groups/all_wrong_frac": seen["all_wrong"] * G / n,
        "groups/identical_frac": seen["identical"] * G / n,
        "groups/kept": len(result.groups),
        "groups/gen_batches": result.num_gen_batches,
        "groups/incomplete": float(not result.complete),
        "response/length_mean": seen["len_sum"] / n,
        "response/length_max": seen["len_max"],
        "response/truncation_rate": seen["truncated"] / n,
        "response/repeat_frac": seen["repeat"] / n,
        "generated_tokens": seen["len_sum"],
        "time/generation": t_gen,
        "time/scoring": t_score,
    }
    samples = [s for group in result.groups for s in group]
    return Collected(samples=samples, metrics=metrics, examples=examples)


def _one_token_repeated(ids: list[int], min_len: int = 4) -> bool:
    """A degenerate response: at least `min_len` copies of one token (a final EOS aside)."""
    core = ids if len(set(ids)) == 1 else ids[:-1]
    return len(core) >= min_len and len(set(core)) == 1
