"""On-policy distillation's advantage (Thinking Machines, "On-Policy Distillation", 2025; the
recipe of Qwen3's small models): the student samples, a teacher scores the sampled tokens, and
each token's advantage is the negative per-token reverse KL, measured on the sample:

    A^distill_t = -(log pi_student(o_t) - log pi_teacher(o_t)) = log pi_teacher(o_t) - log pi_student(o_t)

Its expectation over the student's own samples is -KL(pi_student || pi_teacher) at that
prefix, so a policy gradient with it descends the reverse KL (mode-seeking: the student is
pushed off what the teacher finds unlikely). Each token gets its own term, undiscounted and
not summed over later tokens (the blog's discount factor 0). pi_student is the policy that
sampled the batch (pi_old), a constant of the update.

Mixed with the verifiable reward's advantage (a group estimator's per-response A_i, or a
per-token estimator's A_{i,t}) by the teacher's share c in (0, 1]:

    A_{i,t} = (1 - c) A^reward_{i(,t)} + c (log pi_teacher(o_t) - log pi_old(o_t))

c = 1 is distillation alone (the reward is still computed and logged, never trained on).
The additive form of slime and Trinity-RFT, A + lambda D, is c = lambda / (1 + lambda) with
the advantage scaled by 1 / (1 - c). Padding and masked tokens get 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def distill_advantages(
    reward_advantages: Tensor,
    log_probs: Tensor,
    teacher_log_probs: Tensor,
    response_mask: Tensor,
    coef: float = 1.0,
) -> Tensor:
    """(B, T) A_t = (1 - coef) A^reward + coef (teacher_log_probs - log_probs), 0 where
    `response_mask` is 0. `reward_advantages`: (B,) per response or (B, T) per token;
    `log_probs` the sampling policy's, `teacher_log_probs` the teacher's, both (B, T).
    coef in (0, 1]; a student equal to its teacher gets exactly (1 - coef) A^reward."""
    if not 0.0 < coef <= 1.0:
        raise ValueError(f"coef: got {coef!r}, expected in (0, 1]")
    if log_probs.shape != teacher_log_probs.shape or log_probs.shape != response_mask.shape:
        raise ValueError(
            f"log_probs {tuple(log_probs.shape)}, teacher_log_probs "
            f"{tuple(teacher_log_probs.shape)} and response_mask {tuple(response_mask.shape)} "
            "must have one (B, T) shape"
        )
    mask = response_mask.bool()
    reward = reward_advantages.float()
    reward = reward.unsqueeze(1).expand_as(log_probs) if reward.dim() == 1 else reward
    gap = teacher_log_probs.float() - log_probs.float()
    if coef == 1.0:  # distillation alone: the reward's advantage takes no part (not even 0 * inf)
        mixed = gap
    else:
        mixed = (1.0 - coef) * reward + coef * gap
    return torch.where(mask, mixed, torch.zeros((), dtype=mixed.dtype, device=mixed.device))


@dataclass(frozen=True)
class DistillSums:
    """What a step's distillation metrics add up over its tokens (and ranks), before the
    means: reverse_kl = sum of log pi_old - log pi_teacher over the masked tokens; distill_abs
    and reward_abs = sums of |c D_t| and |(1 - c) A^reward_t|; tokens = their count."""

    reverse_kl: float
    distill_abs: float
    reward_abs: float
    tokens: float

    def as_list(self) -> list[float]:
        return [self.reverse_kl, self.distill_abs, self.reward_abs, self.tokens]

    def metrics(self) -> dict[str, float]:
        """distill/reverse_kl: the per-token k1 estimate of KL(pi_student || pi_teacher) on
        the samples; distill/share: sum |c D| / (sum |c D| + sum |(1 - c) A^reward|), the
        teacher's share of the advantage's magnitude (1 when distilling alone)."""
        n = max(self.tokens, 1.0)
        total = self.distill_abs + self.reward_abs
        return {
            "distill/reverse_kl": self.reverse_kl / n,
            "distill/share": self.distill_abs / total if total > 0 else 1.0,
            "distill/tokens": self.tokens,
        }


def distill_sums(
    reward_advantages: Tensor,
    log_probs: Tensor,
    teacher_log_probs: Tensor,
    response_mask: Tensor,
    coef: float = 1.0,
) -> DistillSums:
    """The sums `DistillSums.metrics` reads, over the tokens of `response_mask`."""
    mask = response_mask.bool()
    gap = (teacher_log_probs.float() - log_probs.float())[mask]
    reward = reward_advantages.float()
    reward = reward.unsqueeze(1).expand_as(log_probs) if reward.dim() == 1 else reward
    reward_abs = 0.0 if coef == 1.0 else float(((1.0 - coef) * reward[mask]).abs().sum())
    return DistillSums(
        reverse_kl=float(-gap.sum()),
        distill_abs=float((coef * gap).abs().sum()),
        reward_abs=reward_abs,
        tokens=float(mask.sum()),
    )
