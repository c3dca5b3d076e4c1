"""DAPO's overlong handling (arXiv 2503.14476 §3.4, docs/algorithms.md#overlong-filtering).

Two independent tools for responses that hit the length cap:
  * soft_overlong_penalty: a length-aware reward added to the correctness reward;
  * overlong_filter_mask: drop truncated responses from the loss entirely.
"""

from __future__ import annotations

import torch
from torch import Tensor


def soft_overlong_penalty(lengths: Tensor, *, max_len: int, cache_len: int) -> Tensor:
    """DAPO Eq. 13, soft overlong punishment, added to the correctness reward:

        R_length(y) = 0                                   if |y| <= max_len - cache_len
                    = ((max_len - cache_len) - |y|) / cache_len
                                                          if max_len - cache_len < |y| <= max_len
                    = -1                                  if |y| > max_len

    The penalty ramps linearly from 0 to -1 over the last `cache_len` tokens of the budget
    and is continuous (exactly -1 at |y| = max_len). Paper: max_len 20480, cache_len 4096.

    Args:
        lengths: response lengths |y| in tokens (generated tokens incl. EOS, no prompt, no
            padding), any shape; integer or float, >= 0.
        max_len: L_max, the response budget (> 0).
        cache_len: L_cache, the punishment interval, 0 < cache_len < max_len.

    Returns:
        Penalties with the shape of `lengths`, in (-1, 0] or exactly -1; float (the default
        dtype for integer lengths, else lengths' dtype).
    """
    for name, v in (("max_len", max_len), ("cache_len", cache_len)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {v!r}")
    if not 0 < cache_len < max_len:
        raise ValueError(
            f"need 0 < cache_len < max_len, got cache_len={cache_len}, max_len={max_len}"
        )
    if lengths.numel() and (lengths < 0).any():
        raise ValueError("lengths must be >= 0")
    out_dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    # float64 so that the boundary comparisons and the ramp are exact for any int length.
    y = lengths.to(torch.float64)
    soft_start = max_len - cache_len
    ramp = (soft_start - y) / cache_len
    out = torch.where(
        y <= soft_start, torch.zeros_like(y), torch.where(y <= max_len, ramp, -torch.ones_like(y))
    )
    return out.to(out_dtype)


def overlong_filter_mask(response_mask: Tensor, truncated: Tensor) -> Tensor:
    """Overlong filtering (DAPO §3.4): zero the whole mask row of every truncated response.

    A truncated response (no EOS before the cap) is not necessarily wrong, so its reward
    is noise; with its row masked it contributes no loss and leaves the token-level
    normaliser too (pass the new mask's counts as num_tokens / num_sequences).

    Args:
        response_mask: (B, T) bool or numeric mask.
        truncated: (B,) bool, True where the response hit the cap without EOS.

    Returns:
        A new (B, T) mask of response_mask's dtype; the input is not modified.
    """
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be (B, T), got {tuple(response_mask.shape)}")
    if truncated.dtype != torch.bool:
        raise TypeError(f"truncated must be a bool tensor, got {truncated.dtype}")
    if tuple(truncated.shape) != tuple(response_mask.shape[:1]):
        raise ValueError(
            f"truncated has shape {tuple(truncated.shape)}, expected {tuple(response_mask.shape[:1])}"
        )
    return torch.where(truncated.unsqueeze(1), torch.zeros_like(response_mask), response_mask)
