"""Rollout correction (docs/algorithms.md#rollout-correction): importance weights from the
sampling engine's policy mu to the trainer's old policy pi_old.

The engine sampled o_t from mu (its own log-probs, `sampling_log_probs`); the loss treats the
sample as pi_old's. Per valid token (m_t = 1), with l_t = log pi_old(o_t) - log mu(o_t):

    token level:     w_t = exp(clamp(l_t, -20, 20))
    sequence level:  w_t = W_i = exp(clamp(sum_t m_t l_t, -20, 20))  on every token of row i
    masking (IcePop / rejection):  w <- 0 where w < mask_low or w > mask_high
    truncation (TIS):              w <- min(w, cap)

The clamp of the log-ratio at +-20 (verl's SAFETY_BOUND) only keeps exp finite. Masking is
decided on the untruncated weight and comes first, so a masked token is never "truncated".
The weights are detached; they multiply every objective's policy term before aggregation,
never the KL term, exactly once (`rlvr.algos.objectives.registry`). A masked token keeps its place in the
normaliser (its weight is 0, its token still counted), as verl's IcePop weights and
OpenRLHF's ICEPOP do; verl's `rollout_rs` instead removes it from the response mask.

Metrics (`CorrectionSums`, then `correction_metrics`) are over valid tokens at both levels (a
sequence weight counts once per token of its row, as in verl): the applied weights' mean and
effective sample size ESS = (sum w)^2 / (n sum w^2) (1 when every weight is equal, verl's
normalised ESS), the largest untruncated weight, and the shares of tokens truncated and
masked. They are sums and a max, so micro-batches and ranks combine exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .objectives import LossInputs

SAFETY_BOUND = 20.0  # |log w| bound before exp (verl's), so a weight is finite
Level = Literal["token", "sequence"]

# The sums one micro-batch contributes (`rollout_weights`); `correction_metrics` reads them.
SUM_KEYS = ("is/weight_sum", "is/weight_sq_sum", "is/tokens", "is/truncated", "is/masked")
MAX_KEY = "is/weight_max"


@dataclass(frozen=True)
class CorrectionSettings:
    """level: token or sequence weights. cap: TIS's C (none = no truncation). mask_low,
    mask_high: the kept band of w (none = unbounded on that side; both none = no masking)."""

    level: Level = "token"
    cap: float | None = 2.0
    mask_low: float | None = None
    mask_high: float | None = None

    def __post_init__(self) -> None:
        checks = (
            ("level", self.level in ("token", "sequence"), "token or sequence"),
            ("cap", self.cap is None or self.cap > 0, "none or > 0"),
            ("mask_low", self.mask_low is None or self.mask_low >= 0, "none or >= 0"),
            ("mask_high", self.mask_high is None or self.mask_high > 0, "none or > 0"),
            (
                "mask_high",
                self.mask_low is None or self.mask_high is None or self.mask_high >= self.mask_low,
                f">= mask_low ({self.mask_low})",
            ),
        )
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"{name}: got {getattr(self, name)!r}, expected {expected}")


def importance_weights(old: Tensor, behaviour: Tensor, mask: Tensor, level: Level) -> Tensor:
    """(B, T) untruncated weights pi_old / mu (the module docstring's w), 0 off the mask.
    Masked positions of the inputs may hold garbage (NaN too): they are replaced first."""
    mask = mask.bool()
    zero = torch.zeros((), dtype=old.dtype, device=old.device)
    log_ratio = torch.where(mask, old - behaviour.to(old.dtype), zero)
    if level == "token":
        w = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        seq = log_ratio.sum(dim=1, keepdim=True).clamp(-SAFETY_BOUND, SAFETY_BOUND)
        w = torch.exp(seq).expand_as(log_ratio)
    return torch.where(mask, w, zero)


def correct(raw: Tensor, mask: Tensor, s: CorrectionSettings) -> tuple[Tensor, Tensor, Tensor]:
    """The applied weights from untruncated ones `raw`: masked outside [mask_low, mask_high],
    then truncated at `cap`; and the (B, T) bool tokens truncated and masked."""
    mask = mask.bool()
    keep = torch.ones_like(mask)
    if s.mask_low is not None:
        keep &= raw >= s.mask_low
    if s.mask_high is not None:
        keep &= raw <= s.mask_high
    masked = mask & ~keep
    w = torch.where(keep, raw, torch.zeros_like(raw))
    truncated = torch.zeros_like(mask)
    if s.cap is not None:
        truncated = mask & keep & (raw > s.cap)
        w = w.clamp(max=s.cap)
    return torch.where(mask, w, torch.zeros_like(w)), truncated, masked


def rollout_weights(
    old: Tensor, behaviour: Tensor | None, mask: Tensor, s: CorrectionSettings
) -> tuple[Tensor | None, dict[str, float]]:
    """The detached (B, T) weights for `LossInputs.rollout_weights` and this call's sums
    (SUM_KEYS and MAX_KEY). A call without valid tokens (a placeholder micro-batch) needs no
    engine log-probs: weights None, sums 0 and max -inf."""
    mask = mask.bool()
    if not bool(mask.any()):
        return None, {**dict.fromkeys(SUM_KEYS, 0.0), MAX_KEY: -math.inf}
    if behaviour is None:
        raise ValueError(
            "algo.rollout_correction: the engine reported no sampling log-probs for this batch "
            "(use rollout.engine fast or vllm)"
        )
    old = old.detach()
    raw = importance_weights(old, behaviour.to(old.device), mask, s.level)
    w, truncated, masked = correct(raw, mask, s)
    wd = w.double()  # the sums in fp64: the ESS of near-equal fp32 weights stays exact
    values = torch.stack(
        [
            wd.sum(),
            (wd * wd).sum(),
            mask.sum().double(),
            truncated.sum().double(),
            masked.sum().double(),
            raw[mask].max().double(),
        ]
    ).tolist()  # one device-to-host transfer
    return w.detach(), dict(zip((*SUM_KEYS, MAX_KEY), values))


def correction_metrics(sums: dict[str, float], weight_max: float) -> dict[str, float]:
    """The step's rollout/is_* metrics from SUM_KEYS summed over micro-batches and ranks and
    MAX_KEY combined by max. Without valid tokens: mean and ESS 1, shares 0."""
    n = sums.get("is/tokens", 0.0)
    total, squares = sums.get("is/weight_sum", 0.0), sums.get("is/weight_sq_sum", 0.0)
    if n <= 0:
        return {
            "rollout/is_weight_mean": 1.0, "rollout/is_weight_max": 1.0, "rollout/is_ess": 1.0,
            "rollout/is_truncated_frac": 0.0, "rollout/is_masked_frac": 0.0,
        }  # fmt: skip
    return {
        "rollout/is_weight_mean": total / n,
        "rollout/is_weight_max": weight_max,
        "rollout/is_ess": total * total / (n * squares) if squares > 0 else 0.0,
        "rollout/is_truncated_frac": sums.get("is/truncated", 0.0) / n,
        "rollout/is_masked_frac": sums.get("is/masked", 0.0) / n,
    }


def bypass_old_log_probs(behaviour: Tensor | None, mask: Tensor, device) -> Tensor | None:
    """Bypass mode's pi_old: the engine's log-probs (None for a call without valid tokens,
    which then uses the live ones)."""
    if behaviour is None and bool(mask.bool().any()):
        raise ValueError(
            "algo.rollout_bypass: the engine reported no sampling log-probs for this batch "
            "(use rollout.engine fast or vllm)"
        )
    return None if behaviour is None else behaviour.to(device)


def with_rollout_weights(
    inputs: LossInputs, settings: CorrectionSettings | None
) -> tuple[LossInputs, dict[str, float] | None]:
    """`inputs` (LossInputs) with its `rollout_weights` set from its old and behaviour
    log-probs, and the sums for the metrics; unchanged and None when correction is off."""
    if settings is None:
        return inputs, None
    w, sums = rollout_weights(
        inputs.old_log_probs, inputs.behaviour_log_probs, inputs.response_mask, settings
    )
    return replace(inputs, rollout_weights=w), sums
