"""Scores: accuracy kept apart from the shaped total, and reward failures counted."""

from pathlib import Path

import torch

from rlvr.config.load import load_config
from rlvr.data.prompts import Prompt
from rlvr.rewards.scoring import Scorer
from rlvr.rollout import Rollout

ACCURACY = f"{Path(__file__).parent / 'e2e_rewards.py'}:picky_digit"


def test_accuracy_reward_failures_are_counted_when_scored_zero():
    cfg = load_config(
        None,
        {"reward": {"accuracy": ACCURACY, "on_error": "zero"}, "algo": {"soft_overlong": "false"}},
    )
    scorer = Scorer.build(cfg, task=None)
    completions = ["12", "no digits", "7!", "x"]
    prompts = [Prompt(text="q", ids=[5], answer="a", example=None)] * 4
    rollout = Rollout(
        prompt_ids=[[5]] * 4,
        completion_ids=torch.zeros(4, 3, dtype=torch.long),
        lengths=torch.tensor([2, 3, 3, 1]),
        truncated=torch.zeros(4, dtype=torch.bool),
        group_size=4,
    )
    scores = scorer(prompts, completions, rollout)
    assert scores.correct.tolist() == [True, False, False, False]  # the failed one scores 0
    assert scores.failures == {"picky_digit": 1}  # by the reward's own name
    values, correct = scorer.accuracy(prompts, completions, rollout)
    assert torch.equal(correct, scores.correct) and values.tolist() == [1.0, 0.0, 0.0, 0.0]
