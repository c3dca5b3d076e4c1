"""The config's `algo` section (`rlvr.config.schema` reads it from here): the policy-gradient
algorithm, whose loss settings take their defaults from the objectives' declarations
(`rlvr.algos.settings`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlvr.algos.settings import AggMode, KLKind, LossSettings, Ratio


@dataclass(frozen=True)
class AlgoConfig:
    """The policy-gradient algorithm (docs/algorithms.md#config-keys).

    advantage: grpo (r - mean)/(std + eps), dr_grpo (r - mean), rloo (leave-one-out), gae (PPO:
        GAE over a critic's values, whitened over the batch; needs the critic section),
        reinforce_pp (REINFORCE++: discounted per-token returns normalised over the batch),
        gdpo (each reward normalised within its group, then their weighted sum whitened).
    std: std estimator for grpo advantages: unbiased (torch.std, /(G-1)) or population (/G).
    clip_low: eps_low; the ratio's lower bound is 1 - clip_low (dppo_tv, dppo_kl: the divergence
        threshold for A <= 0, as verl's clip_ratio_low).
    clip_high: eps_high; the ratio's upper bound is 1 + clip_high (DAPO clip-higher: 0.28;
        dppo_tv, dppo_kl: the divergence threshold for A > 0).
    dual_clip: dual-clip constant c > 1 capping the loss of negative advantages (none = off;
        dppo_tv, dppo_kl: the cap C of the ratio weight min(rho, C), verl's clip_ratio_c).
    loss: the policy objective: a name of rlvr.algos.OBJECTIVES (clip: PPO/GRPO/DAPO's clipped
        surrogate; gspo; cispo; sapo; gmpo; clip_cov; kl_cov; dppo_tv; dppo_kl) or a user's "module:function" / "path/to/file.py:function" with the
        signature fn(LossInputs, LossSettings) -> LossOutput (docs/algorithms.md#adding-an-objective).
    ratio: token (PPO/GRPO/DAPO importance ratio per token) or sequence (GSPO).
    agg: loss aggregation: sample_mean (GRPO), token_mean (DAPO), token_sum_norm (Dr. GRPO).
    kl_coef: beta, weight of the KL penalty to the reference model in the loss (0 = no reference).
    kl_kind: KL estimator: k1, k2, k3.
    kl_in_reward: put the KL into the per-token reward (r_t = -kl_coef * KL_t, the score on the
        last token: PPO, REINFORCE++) instead of the loss; needs advantage gae or reinforce_pp.
    kl_target: adaptive kl_coef (Ziegler et al.): the per-token KL it steers towards (none = fixed).
    kl_horizon: adaptive kl_coef's horizon in samples: beta *= 1 + clip(KL/target - 1, +-0.2) * N / horizon.
    gamma: discount of the per-token rewards (gae, reinforce_pp).
    lam: GAE lambda (gae): 1 = Monte Carlo returns minus V, 0 = one-step TD errors.
    dynamic_sampling: keep only groups with 0 < #correct < G (under reward.accuracy none: whose
        G total rewards are not all equal), refilling from more generation batches.
    max_gen_batches: bound on generation batches per step under dynamic sampling.
    refill: dynamic sampling's refill batches: adaptive (about 1.25 x missing / keep-rate prompts,
        at most prompts_per_step) or full (prompts_per_step each, the surplus discarded: verl).
    overlong_filter: give truncated responses a zero loss mask.
    soft_overlong: add DAPO's soft overlong punishment to the reward.
    overlong_cache: L_cache of the soft overlong punishment, in tokens.
    mu: optimisation passes over each rollout batch.
    mini_batches: optimiser steps per pass (the rollout batch is split into this many).
    log_ratio_clamp: clamp |log rho| to this value (none = no clamp); clamped values are counted.
    top_entropy_quantile: train on the top share of the mini-batch's loss tokens by the policy's
        entropy, the rest out of loss and normaliser ("Beyond the 80/20 rule": 0.2; 1 = all).
    ref_sync_every: reset the KL reference every N steps (0 = never; reward.model_refresh_every
        resets it on its own clock): ref <- alpha * policy + (1 - alpha) * ref (TRL's sync_ref_model).
    ref_mixup_alpha: alpha of the reference reset: 1 = hard (ref <- policy), < 1 = soft (TRL's
        ref_model_mixup_alpha).
    rollout_correction: importance weights w = pi_old / mu from the engine's sampling policy
        mu (docs/algorithms.md#rollout-correction): none, token or sequence (verl's rollout_is).
    rollout_is_cap: truncation C of the weights, w <- min(w, C) (TIS; none = no truncation).
    rollout_mask_low: weights below it are zeroed (IcePop / rejection; none = no lower bound).
    rollout_mask_high: weights above it are zeroed (IcePop / rejection; none = no upper bound).
    rollout_bypass: the engine's log-probs are pi_old of the ratio (verl's bypass_mode): no
        old-log-prob forward where mu > 1 or several mini-batches would need one.
    off_policy_mask_threshold: off-policy sequence masking (DeepSeek-V3.2; TRL's name): a response
        with a negative advantage whose mean log mu - log pi_theta over its tokens is above this
        is left out of the policy loss, under any objective (none = off; TRL's example: 0.5).
    gdpo_reward_keys: the rewards GDPO normalises one by one (verl's gdpo_reward_keys): names
        of reward terms (accuracy, format, soft_overlong, an extra's name); empty = every term
        of the total. Only under advantage gdpo.
    teacher: on-policy distillation's teacher (docs/distillation.md): any causal LM with the
        student's tokenizer, as a model directory, a hub id, a run directory (its newest good
        checkpoint) or a checkpoint (a LoRA one merged into its base); none = no teacher.
    distill_coef: c, the teacher's share of the advantage: A_t = (1 - c) A_reward +
        c (log pi_teacher(o_t) - log pi_old(o_t)); 1 = distillation alone (preset opd).
    loss_settings: the objective's own settings, each written as a key of this section
        (`algo.tau_pos` under loss sapo; sapo: tau_pos, tau_neg; clip_cov: clip_cov_ratio,
        clip_cov_lb, clip_cov_ub; kl_cov: kl_cov_ratio, kl_cov_coef; a user's objective: what
        it declares), with the objective's declared defaults and ranges
        (docs/algorithms.md#adding-an-objective).
    """

    advantage: Literal["grpo", "dr_grpo", "rloo", "gae", "reinforce_pp", "gdpo"] = "grpo"
    std: Literal["unbiased", "population"] = "unbiased"
    clip_low: float = LossSettings.clip_low
    clip_high: float = LossSettings.clip_high
    dual_clip: float | None = LossSettings.dual_clip
    loss: str = "clip"
    ratio: Ratio = LossSettings.ratio
    agg: AggMode = "sample_mean"  # GRPO's; a bare LossSettings takes token_mean
    kl_coef: float = LossSettings.kl_coef
    kl_kind: KLKind = LossSettings.kl_kind
    kl_in_reward: bool = False
    kl_target: float | None = None
    kl_horizon: float = 10000.0
    gamma: float = 1.0
    lam: float = 0.95
    dynamic_sampling: bool = False
    max_gen_batches: int = 4
    refill: Literal["adaptive", "full"] = "adaptive"
    overlong_filter: bool = False
    soft_overlong: bool = False
    overlong_cache: int = 8
    mu: int = 1
    mini_batches: int = 1
    log_ratio_clamp: float | None = LossSettings.log_ratio_clamp
    top_entropy_quantile: float = 1.0
    ref_sync_every: int = 0
    ref_mixup_alpha: float = 1.0
    rollout_correction: Literal["none", "token", "sequence"] = "none"
    rollout_is_cap: float | None = 2.0
    rollout_mask_low: float | None = None
    rollout_mask_high: float | None = None
    rollout_bypass: bool = False
    off_policy_mask_threshold: float | None = None
    gdpo_reward_keys: tuple[str, ...] = ()
    teacher: str | None = None
    distill_coef: float = 1.0
    loss_settings: dict[str, Any] = field(default_factory=dict)
