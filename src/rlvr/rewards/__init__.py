"""Verifiable rewards: math answers, R1 format, language consistency, soft overlong
punishment, code run in a sandbox, model-based rewards, user functions, weighted sums.

A reward function is `fn(prompts, completions, answers, **kwargs) -> list[float | None]`,
one value per completion (None = "no score"). The trainer passes `group_ids`,
`completion_lengths` (tokens incl. EOS), `truncated`, `max_new_tokens` and any extra dataset
columns as keyword arguments; functions ignore what they do not use.
"""

from rlvr.rewards.combine import RewardError, RewardFn, RewardResult, combine_rewards
from rlvr.rewards.math import extract_answer, math_equal
from rlvr.rewards.registry import FACTORIES, REWARDS, make_reward
from rlvr.rewards.user import load_user_reward

__all__ = [
    "FACTORIES",
    "REWARDS",
    "RewardError",
    "RewardFn",
    "RewardResult",
    "combine_rewards",
    "extract_answer",
    "load_user_reward",
    "make_reward",
    "math_equal",
]
