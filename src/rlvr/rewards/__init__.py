"""Verifiable rewards: math answers, R1 format, language consistency, soft overlong
punishment, code run in a sandbox, model-based rewards, user functions, weighted sums.

A reward function has TRL's signature, `fn(prompts, completions, completion_ids, **kwargs)
-> list[float | None]`, one value per completion (None = "no score"), and is called with
keyword arguments only: the reference `answer`, `trainer_state`, `prompt_texts`,
`completion_lengths` (tokens incl. EOS), `truncated`, `group_ids`, `max_new_tokens` and every
other dataset column (`rlvr.rewards.combine` documents each; `RESERVED_KWARGS` lists them).
Functions ignore what they do not use.
"""

from rlvr.rewards.combine import (
    RESERVED_KWARGS,
    RewardError,
    RewardFn,
    RewardResult,
    RewardSignatureError,
    combine_rewards,
    completion_text,
)
from rlvr.rewards.math import extract_answer, math_equal
from rlvr.rewards.registry import FACTORIES, REWARDS, make_reward
from rlvr.rewards.user import load_user_reward

__all__ = [
    "FACTORIES",
    "RESERVED_KWARGS",
    "REWARDS",
    "RewardError",
    "RewardFn",
    "RewardResult",
    "RewardSignatureError",
    "combine_rewards",
    "completion_text",
    "extract_answer",
    "load_user_reward",
    "make_reward",
    "math_equal",
]
