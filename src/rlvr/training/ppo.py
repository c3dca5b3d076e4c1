"""The token-level half of a PPO / REINFORCE++ step (docs/algorithms.md#ppo): per-token
rewards with the KL penalty, advantages (GAE over the critic's values, or batch-normalised
returns), the critic's targets, the KL controller and their metrics.

    r_t  = -beta * KL_t(pi_old, pi_ref) on every loss token,  r_T += score
    gae:          A = whiten_batch(GAE(r, V_old; gamma, lam)),  R = GAE + V_old (critic target)
    reinforce_pp: A = normalise_batch(sum_k gamma^(k-t) r_k)

Batch-level statistics (whitening, explained variance, the KL the controller sees) are over
every rank's share of the step, so N ranks compute what one process would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.algos import (
    ADVANTAGES,
    AdvantageInputs,
    KLController,
    explained_from_parts,
    gae,
    kl_penalized_rewards,
    overlong_filter_mask,
    variance_parts,
)
from rlvr.config.algorithm import Algorithm
from rlvr.run.distributed import Dist
from rlvr.training.batch import Batch
from rlvr.training.critic import CriticTargets
from rlvr.training.settings import UpdateSettings


def loss_mask(batch: Batch, overlong_filter: bool) -> torch.Tensor:
    """(N, T) bool: the tokens that carry rewards and advantages (every generated token, no
    tool token, none of a truncated response under algo.overlong_filter)."""
    mask = batch.model_mask()
    if overlong_filter:
        truncated = torch.tensor([s.truncated for s in batch.samples], dtype=torch.bool)
        mask = overlong_filter_mask(mask, truncated).bool()
    return mask


@dataclass(frozen=True)
class TokenAdvantages:
    """What `token_advantages` computed: (N, T) advantages for the policy, the critic's
    targets (gae only) and the step's metrics."""

    advantages: torch.Tensor
    critic_targets: CriticTargets | None
    metrics: dict[str, float]


def token_advantages(
    batch: Batch,
    algorithm: Algorithm,
    settings: UpdateSettings,
    kl_ctl: KLController | None,
    d: Dist,
    values: torch.Tensor | None = None,
) -> TokenAdvantages:
    """Token rewards, advantages and critic targets of this rank's `batch` (whose old and
    reference log-probs are set when the KL is in the reward) by the run's advantage
    estimator; `values`: (N, T) V_old from the critic, for gae. Updates the KL controller
    with the step's mean KL."""
    s = settings
    mask = loss_mask(batch, s.overlong_filter)
    scores = torch.tensor([x.reward for x in batch.samples], dtype=torch.float32)
    beta = kl_ctl.value if kl_ctl is not None else 0.0
    with_kl = kl_ctl is not None and batch.ref_log_probs is not None
    rewards, kl = kl_penalized_rewards(
        scores,
        mask,
        log_probs=batch.old_log_probs if with_kl else None,
        ref_log_probs=batch.ref_log_probs if with_kl else None,
        kl_coef=beta,
        kl_kind=s.kl_kind,
    )
    inputs = AdvantageInputs(
        rewards=scores,
        group_size=s.group_size,
        token_rewards=rewards,
        values=values,
        response_mask=mask,
        gamma=s.gamma,
        lam=s.lam,
        global_sum=d.sum,
    )
    advantages = ADVANTAGES[algorithm.advantage](inputs)
    n_tok, kl_sum, n_seq = d.sum([float(mask.sum()), float(kl.sum()), float(len(batch))])
    metrics = {"kl/penalty": kl_sum / max(n_tok, 1.0), "kl/beta": beta}
    if kl_ctl is not None:
        kl_ctl.update(metrics["kl/penalty"], int(n_seq))
    targets = None
    if values is not None:
        _, returns = gae(rewards, values, mask, gamma=s.gamma, lam=s.lam)
        targets = CriticTargets(old_values=values, returns=returns, mask=mask.float())
        v_sum, r_sum = d.sum([float(values[mask].sum()), float(returns[mask].sum())])
        metrics["critic/value_mean"] = v_sum / max(n_tok, 1.0)
        metrics["critic/return_mean"] = r_sum / max(n_tok, 1.0)
        n, var_r, var_e = variance_parts(values, returns, mask, global_sum=d.sum)
        metrics["critic/explained_variance"] = explained_from_parts(n, var_r, var_e)
        # a window's explained variance pools steps: 1 - sum(n var_e) / sum(n var_r)
        metrics["critic/tokens"] = n
        metrics["critic/return_var"], metrics["critic/error_var"] = var_r, var_e
    return TokenAdvantages(advantages.float(), targets, metrics)
