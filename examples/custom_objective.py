"""A user's own policy objective, named as `algo.loss` (docs/algorithms.md#adding-an-objective):

    rlvr train --algo.loss=examples/custom_objective.py:truncated_is_pg
    rlvr.train(config={"algo.loss": "examples/custom_objective.py:truncated_is_pg"})

`truncated_is_pg` is the policy gradient with a truncated, stop-gradient importance weight
(every token keeps its gradient, the weight is capped at 1 + clip_high), the REINFORCE-style
cousin of PPO's clip:

    L_t = -min(rho_t, 1 + clip_high).detach() * A_t * log pi_theta(o_t)

aggregated by `algo.agg` with the step's global counts, so micro-batching and ranks leave the
loss as one batch's. Masked positions may hold anything: they are replaced before arithmetic.
It reads the public `LossInputs` fields alone: rollout correction's weights and the off-policy
mask reach it folded into `inputs.advantages` (then (B, T)), which scales its policy term.
"""

import torch

from rlvr.algos import LossOutput, aggregate
from rlvr.algos.objectives import LossInputs, LossSettings


def truncated_is_pg(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    mask = inputs.response_mask.bool()  # (B, T)
    zero = torch.zeros((), dtype=torch.float32)
    logp = torch.where(mask, inputs.log_probs.float(), zero)
    old = torch.where(mask, inputs.old_log_probs.float(), zero)
    adv = inputs.advantages.float()
    adv = torch.where(mask, adv[:, None].expand_as(logp) if adv.dim() == 1 else adv, zero)
    rho = torch.exp(logp.detach() - old)
    weight = rho.clamp(max=1.0 + settings.clip_high)
    per_token = -weight * adv * logp
    loss = aggregate(
        per_token,
        mask,
        settings.agg,
        num_tokens=inputs.num_tokens,
        num_sequences=inputs.num_sequences,
        norm_constant=inputs.norm_constant,
    )
    n = mask.sum().clamp_min(1)
    # Metrics: means over this call's valid tokens (the update weighs them by token count),
    # `num_tokens` a count (summed), `ratio_max` a maximum.
    metrics = {
        "ratio_mean": float(torch.where(mask, rho, zero).sum() / n),
        "ratio_max": float(torch.where(mask, rho, zero).max()) if rho.numel() else 0.0,
        "truncated_frac": float(((rho > 1.0 + settings.clip_high) & mask).sum() / n),
        "num_tokens": float(mask.sum()),
    }
    return LossOutput(loss=loss, metrics=metrics)
