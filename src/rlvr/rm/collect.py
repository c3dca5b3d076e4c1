"""Responses sampled from a policy at its temperature, labelled by the rule.

The sampling is the held-out evaluation's (`rlvr.training.evaluation.evaluate`): every prompt
draws from its own seed, here derived from the run seed and the split, so a resumed run
collects the same responses. The label is the rule's verdict (the task's verifier or
`reward.accuracy`); `well_formed` is the R1 format with one answer block
(`rlvr.tasks.base.format_ok`).
"""

from __future__ import annotations

from dataclasses import replace

from rlvr.config.schema import Config
from rlvr.data.prompts import Prompt
from rlvr.rewards.scoring import Scorer
from rlvr.rm.records import Record
from rlvr.rollout import derive_seed
from rlvr.tasks.base import format_ok
from rlvr.training.evaluation import evaluate
from rlvr.training.overlap import Generator
from rlvr.training.settings import eval_params


def sample_records(
    engine, tokenizer, scorer: Scorer, prompts: list[Prompt], cfg: Config, *, n: int,
    seed: int, split: str, first_group: int = 0,
) -> list[Record]:  # fmt: skip
    """`n` responses per prompt; groups numbered from `first_group` in prompt order."""
    params = replace(eval_params(cfg, n=n), seed=derive_seed(seed, "rm-data", split))
    rows: list[dict] = []
    evaluate(Generator(engine, tokenizer, scorer), prompts, params=params, records=rows)
    return [
        Record(
            prompt=r["prompt"],
            response=r["completion"],
            correct=bool(r["correct"]),
            well_formed=format_ok(r["completion"]),
            group=first_group + r["prompt_index"],
        )
        for r in rows
    ]


def records_from(prompts: list[Prompt], completions: list[str], correct, group_of) -> list[Record]:
    """Records of responses scored during training (`group_of(i)`: the group of row i)."""
    return [
        Record(
            prompt=p.text,
            response=c,
            correct=bool(correct[i]),
            well_formed=format_ok(c),
            group=group_of(i),
        )
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
