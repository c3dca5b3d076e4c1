"""DAPO's soft overlong punishment (Eq. 13) as a reward term, via `rlvr.algos`.

    R_length(y) = 0                                   if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                = -1                                  if |y| > L_max

|y| is the trainer's `completion_lengths` (tokens incl. EOS) and L_max its `max_new_tokens`.
"""

from __future__ import annotations

import torch

from rlvr.algos import soft_overlong_penalty


def make_soft_overlong_reward(*, cache_len: int | None = None, max_len: int | None = None):
    """Soft overlong punishment. `cache_len` (L_cache) defaults to max_len // 5 (the paper's
    4096 of 20480); `max_len` (L_max) defaults to the trainer's `max_new_tokens`."""

    def soft_overlong(completions, **kwargs) -> list[float | None]:
        if "completion_lengths" not in kwargs:
            raise ValueError("soft_overlong needs the trainer's completion_lengths")
        l_max = max_len if max_len is not None else kwargs.get("max_new_tokens")
        if l_max is None:
            raise ValueError("soft_overlong needs max_len or the trainer's max_new_tokens")
        l_cache = cache_len if cache_len is not None else l_max // 5
        lengths = torch.tensor(kwargs["completion_lengths"], dtype=torch.float64)
        penalty = soft_overlong_penalty(lengths, max_len=int(l_max), cache_len=int(l_cache))
        return [float(x) for x in penalty.tolist()]

    return soft_overlong
