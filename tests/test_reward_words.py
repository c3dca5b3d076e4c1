"""Reward failures in the user's words: the reward's own name, the whole batch when only the
batch fails, and `async def` rewards awaited as TRL awaits them."""

from __future__ import annotations

import asyncio
import warnings

import pytest
import torch

from rlvr.config.load import load_config
from rlvr.data.prompts import Prompt
from rlvr.rewards.combine import RewardError, combine_rewards
from rlvr.rewards.limits import with_time_limit
from rlvr.rewards.scoring import Scorer
from rlvr.rollout import Rollout


def one_short(completions, **kwargs):
    """Right for one completion, one score short for more: only the batch is wrong."""
    return [1.0] * max(len(completions) - 1, 1)


async def async_len(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


def test_a_wrong_count_on_the_batch_names_the_batch_not_a_sample():
    with pytest.raises(RewardError) as info:
        combine_rewards([("one_short", 1.0, one_short)], {"completions": ["a", "b", "c"]})
    text = str(info.value)
    assert text == (
        "reward 'one_short' failed on the whole batch of 3 completions (returned 2 scores "
        "for 3 completions), though it scores each of them alone"
    )
    assert "-1" not in text and info.value.index is None


@pytest.mark.parametrize("timeout_s", [0.0, 5.0])
def test_an_async_reward_is_awaited(timeout_s):
    fn = with_time_limit(async_len, "async_len", timeout_s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail here
        res = combine_rewards([("async_len", 1.0, fn)], {"completions": ["ab", "abcd"]})
    assert res.total == [2.0, 4.0] and res.failures == {"async_len": 0}


def test_an_async_reward_is_awaited_inside_a_running_event_loop():
    async def notebook_cell():  # Jupyter runs cells inside an event loop
        return combine_rewards([("async_len", 1.0, async_len)], {"completions": ["abc"]})

    assert asyncio.run(notebook_cell()).total == [3.0]


def test_a_failing_user_accuracy_reward_is_named_by_its_own_name(tmp_path):
    (tmp_path / "r.py").write_text(
        "def exact(completions, **kwargs):\n    raise ValueError('no answer tag')\n"
    )
    cfg = load_config(
        None,
        {"reward": {"accuracy": f"{tmp_path / 'r.py'}:exact"}, "algo": {"soft_overlong": "false"}},
    )
    scorer = Scorer.build(cfg, task=None)
    prompts = [Prompt(text="q", ids=[5], answer="a", example=None)] * 2
    rollout = Rollout(
        prompt_ids=[[5]] * 2,
        completion_ids=torch.zeros(2, 3, dtype=torch.long),
        lengths=torch.tensor([2, 3]),
        truncated=torch.zeros(2, dtype=torch.bool),
        group_size=2,
    )
    with pytest.raises(RewardError, match=r"^reward 'exact' failed on sample 0 \(ValueError"):
        scorer(prompts, ["x", "y"], rollout)
