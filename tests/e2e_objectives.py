"""A user objective file with a whole-mini-batch statistic, loaded by path in the tests
(`--algo.loss=tests/e2e_objectives.py:centred_pg`)."""

import torch

from rlvr.algos import LossOutput, aggregate
from rlvr.algos.objectives import LossInputs, LossSettings


def centred_stats(inputs: LossInputs) -> dict[str, torch.Tensor]:
    """Sums over this micro-batch's loss tokens: of the advantage, and their count."""
    m = inputs.response_mask.bool()
    adv = (
        inputs.advantages[:, None].expand(m.shape)
        if inputs.advantages.dim() == 1
        else inputs.advantages
    )
    return {"adv_sum": torch.where(m, adv, 0.0).sum(), "tokens": m.sum().double()}


def centred_pg(inputs: LossInputs, settings: LossSettings) -> LossOutput:
    """-(A - mean A) log pi, token mean, the mean over the whole mini-batch's loss tokens (on
    every rank): only right if `batch_stats` hold the whole mini-batch's sums."""
    m = inputs.response_mask.bool()
    mean = (inputs.batch_stats["adv_sum"] / inputs.batch_stats["tokens"].clamp_min(1)).float()
    adv = (
        inputs.advantages[:, None].expand(m.shape)
        if inputs.advantages.dim() == 1
        else inputs.advantages
    )
    per_token = -(adv - mean) * torch.where(m, inputs.log_probs, 0.0)
    loss = aggregate(per_token, m, "token_mean", num_tokens=inputs.num_tokens)
    return LossOutput(loss=loss, metrics={"adv_mean": float(mean), "num_tokens": float(m.sum())})


centred_pg.stats = centred_stats
# Its policy term -(A - mean A) log pi is not proportional to A: the update could not apply
# rollout weights through the advantages, and it does not apply them itself.
centred_pg.rollout_weights = "refused"
