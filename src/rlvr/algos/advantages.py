"""Advantage estimators (docs/algorithms.md#group-advantages, docs/algorithms.md#ppo).

Outcome advantages from the scalar rewards of each group: a group is the G responses sampled
for one prompt; they are contiguous in `rewards`, so rewards[k*G:(k+1)*G] is group k. These
return one advantage per response, shape (N,); the caller broadcasts it over the response's
tokens (policy_loss accepts (B,) as is). Token-level estimators (GAE, REINFORCE++) return
(N, T). Advantages are computed once per rollout from whole groups, never per mini-batch.

`ADVANTAGES` maps every name to fn(AdvantageInputs) -> (N,) or (N, T).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from .gae import GlobalSum, discounted_returns, gae, masked_whiten
from .gdpo import gdpo_combine

AdvantageScale = Literal["std", "none"]
StdKind = Literal["unbiased", "population"]


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """Validate `rewards` and return it as a float (N // G, G) view."""
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if rewards.numel() % group_size != 0:
        raise ValueError(
            f"len(rewards)={rewards.numel()} is not a multiple of group_size={group_size}; "
            "each prompt's G responses must all be present"
        )
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    bad = ~torch.isfinite(rewards)
    if bad.any():
        idx = bad.nonzero().flatten().tolist()
        shown = ", ".join(f"{i} ({rewards[i].item()})" for i in idx[:10])
        more = f" and {len(idx) - 10} more" if len(idx) > 10 else ""
        raise ValueError(f"non-finite reward at index {shown}{more}")
    return rewards.view(-1, group_size)


def _equal_groups(grouped: Tensor) -> Tensor:
    """(K, 1) bool: True where every reward of the group equals the first one."""
    return (grouped == grouped[:, :1]).all(dim=1, keepdim=True)


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    scale: AdvantageScale = "std",
    std: StdKind = "unbiased",
    eps: float = 1e-6,
) -> Tensor:
    """GRPO group-normalised outcome advantage (DeepSeekMath §4.1.2, arXiv 2402.03300).

        scale="std":  A_i = (R_i - mean(R_group)) / (std(R_group) + eps)      (GRPO)
        scale="none": A_i =  R_i - mean(R_group)                                (Dr. GRPO)

    std="unbiased" divides the variance by G-1 (torch.std, as verl and TRL do) and needs
    G >= 2; std="population" divides by G. They differ by sqrt(G/(G-1)), 15.5% at G=4.
    Dr. GRPO (arXiv 2503.20783) drops the std division because it up-weights groups whose
    rewards barely differ (too easy or too hard questions).

    Args:
        rewards: (N,) scalar rewards, groups contiguous. Integer/bool rewards become float.
        group_size: G; N must be a multiple of it.
        eps: added to the std (verl 1e-6, TRL 1e-4). 0 is allowed.

    Returns:
        (N,) advantages, same float dtype as rewards.

    Edge cases: a group whose rewards are all equal gets exactly 0 (not 0/eps rounding
    noise), whatever `scale` and `eps`. Raises ValueError for a non-finite reward (naming its
    index), N % G != 0, or std="unbiased" with G < 2 (the sample std of one value is 0/0).
    """
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    if std not in ("unbiased", "population"):
        raise ValueError(f"std must be 'unbiased' or 'population', got {std!r}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    grouped = _grouped(rewards, group_size)
    if scale == "std" and std == "unbiased" and group_size < 2:
        raise ValueError(
            "std='unbiased' needs group_size >= 2 (the /(G-1) std of one reward is undefined); "
            "use std='population' or a larger group"
        )
    equal = _equal_groups(grouped)  # (K, 1)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "std":
        sd = grouped.std(dim=1, keepdim=True, correction=1 if std == "unbiased" else 0)
        # Equal groups are zeroed below; give them a harmless denominator so eps=0 is safe.
        centred = centred / (torch.where(equal, torch.ones_like(sd), sd) + eps)
    return torch.where(equal, torch.zeros_like(centred), centred).reshape(-1)


def dr_grpo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Dr. GRPO advantage A_i = R_i - mean(R_group) (arXiv 2503.20783 §3.2).

    Same as group_advantages(rewards, group_size, scale="none"), under its paper's name.
    """
    return group_advantages(rewards, group_size, scale="none")


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE leave-one-out advantage (Ahmadian et al. 2024, arXiv 2402.14740).

        A_i = R_i - (1/(G-1)) sum_{j != i} R_j  =  G/(G-1) * (R_i - mean(R_group))

    Each response's baseline is the mean of the *other* responses, so the baseline is
    independent of the response it scores and the policy-gradient estimate stays unbiased.
    No std scaling. Needs G >= 2. Shapes, errors and all-equal groups as group_advantages.
    """
    grouped = _grouped(rewards, group_size)
    if group_size < 2:
        raise ValueError(f"rloo needs group_size >= 2 (leave-one-out of one), got {group_size}")
    equal = _equal_groups(grouped)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    adv = grouped - others_mean
    return torch.where(equal, torch.zeros_like(adv), adv).reshape(-1)


def equal_reward_groups(rewards: Tensor, group_size: int) -> Tensor:
    """(N // G,) bool: groups whose rewards are all equal, hence zero advantage.

    Their fraction is worth logging (docs/algorithms.md#group-advantages): such groups give no
    policy gradient but still enter a token-level denominator (and receive KL gradient when
    kl_coef > 0).
    """
    return _equal_groups(_grouped(rewards, group_size)).squeeze(1)


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything an advantage estimator may read; each uses what its formula needs.

    rewards: (N,) scalar reward per response, groups of `group_size` contiguous.
    group_size: G.
    token_rewards: (N, T) per-token rewards (`kl_penalized_rewards`): GAE, REINFORCE++.
    values: (N, T) the critic's predictions at rollout time: GAE.
    response_mask: (N, T) valid tokens: GAE, REINFORCE++.
    gamma, lam: discount and GAE lambda.
    std, eps: the group std estimator and its epsilon (grpo).
    global_sum: sums floats over every rank's share of the batch, so that batch-level
        normalisation (GAE whitening, REINFORCE++, GDPO) uses the whole batch; None = this is it.
    reward_terms: (K, N) each reward's unweighted scores, in `reward_weights`' order: gdpo.
    reward_weights: (K,) their weights in the total.
    """

    rewards: Tensor
    group_size: int = 1
    token_rewards: Tensor | None = None
    values: Tensor | None = None
    response_mask: Tensor | None = None
    gamma: float = 1.0
    lam: float = 0.95
    std: StdKind = "unbiased"
    eps: float = 1e-6
    global_sum: GlobalSum | None = None
    reward_terms: Tensor | None = None
    reward_weights: tuple[float, ...] = ()

    def need(self, *names: str, by: str) -> list[Tensor]:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"advantage {by!r} needs {', '.join(missing)}")
        return [getattr(self, n) for n in names]


def gae_advantages(x: AdvantageInputs) -> Tensor:
    """PPO: GAE over each response's tokens (`gae`), whitened over the valid tokens of the
    whole batch (verl `masked_whiten`: unbiased variance). (N, T). The critic's targets,
    R = A + V before whitening, come from `gae` itself."""
    r, v, m = x.need("token_rewards", "values", "response_mask", by="gae")
    adv, _ = gae(r, v, m, gamma=x.gamma, lam=x.lam)
    return masked_whiten(adv, m, global_sum=x.global_sum)


def reinforce_pp_advantages(x: AdvantageInputs) -> Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262; OpenRLHF): the discounted return of the
    KL-penalised token rewards, G_t = sum_{k>=t} gamma^(k-t) r_k, normalised by the mean
    and population std of every valid token of the global batch. No critic. (N, T)."""
    r, m = x.need("token_rewards", "response_mask", by="reinforce_pp")
    returns = discounted_returns(r, m, gamma=x.gamma)
    return masked_whiten(returns, m, unbiased=False, global_sum=x.global_sum)


def reward_advantages(
    terms: Tensor, group_size: int, *, std: StdKind = "unbiased", eps: float = 1e-6
) -> Tensor:
    """(K, N) each reward's GRPO advantage within its group (`terms`: (K, N) unweighted)."""
    if terms.dim() != 2:
        raise ValueError(f"reward terms must be (K, N), got shape {tuple(terms.shape)}")
    return torch.stack([group_advantages(t, group_size, std=std, eps=eps) for t in terms])


def gdpo_advantages(
    terms: Tensor,
    weights: Sequence[float],
    group_size: int,
    response_mask: Tensor,
    *,
    std: StdKind = "unbiased",
    eps: float = 1e-6,
    global_sum: GlobalSum | None = None,
) -> Tensor:
    """GDPO (arXiv 2601.05242; `rlvr.algos.gdpo` has the formula): (N,) advantages from
    `terms` (K, N) each reward's unweighted scores, `weights` (K,) their weights in the total,
    `response_mask` (N, T) each response's valid tokens (the whitening weighs a response by
    its length). Each reward is normalised within its group (`reward_advantages`), then the
    weighted sum is whitened over the batch (`gdpo_combine`)."""
    per = reward_advantages(terms, group_size, std=std, eps=eps)
    return gdpo_combine(per, weights, response_mask, global_sum=global_sum)


def _gdpo(x: AdvantageInputs) -> Tensor:
    terms, mask = x.need("reward_terms", "response_mask", by="gdpo")
    return gdpo_advantages(
        terms, x.reward_weights, x.group_size, mask, std=x.std, eps=x.eps,
        global_sum=x.global_sum,
    )  # fmt: skip


ADVANTAGES: dict[str, Callable[[AdvantageInputs], Tensor]] = {
    # GRPO: (R - mean) / (std + eps), per group.
    "grpo": lambda x: group_advantages(x.rewards, x.group_size, std=x.std, eps=x.eps),
    # Dr. GRPO: R - mean, no std division.
    "dr_grpo": lambda x: dr_grpo_advantages(x.rewards, x.group_size),
    # RLOO: R minus the mean of the other G-1 rewards of the group.
    "rloo": lambda x: rloo_advantages(x.rewards, x.group_size),
    # GDPO: each reward normalised within its group, then the weighted sum whitened.
    "gdpo": _gdpo,
    # PPO: GAE on per-token rewards and critic values, whitened over the batch.
    "gae": gae_advantages,
    # REINFORCE++: discounted per-token returns, normalised over the batch.
    "reinforce_pp": reinforce_pp_advantages,
}
"""Advantage estimators by name; each is called as fn(AdvantageInputs) -> (N,) or (N, T)."""

TOKEN_LEVEL = frozenset({"gae", "reinforce_pp"})
"""Estimators that read per-token rewards (the score plus the per-token KL penalty)."""
