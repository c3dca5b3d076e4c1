"""Reward functions for the CLI, in TRL's signature (see custom_reward.sh).

Named on the command line as `examples/custom_reward.py:exact_answer` (the accuracy reward)
and `examples/custom_reward.py:brevity=0.1` (a shaping term with its weight).
"""

import re

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def exact_answer(completions, answer, **kwargs):
    """1 when the <answer> block holds the reference (the gsm8k format's number after ####)."""
    scores = []
    for completion, ref in zip(completions, answer):
        m = ANSWER.search(completion)
        scores.append(1.0 if m and m.group(1).strip() == ref else 0.0)
    return scores


def brevity(completions, completion_lengths, max_new_tokens, **kwargs):
    """Up to +1 for using fewer of the allowed tokens (an rlvr extra beside TRL's arguments)."""
    return [1.0 - n / max_new_tokens for n in completion_lengths]
