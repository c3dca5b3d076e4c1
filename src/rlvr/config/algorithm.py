"""Which algorithm a run is: one object built from `cfg.algo`, asked by the trainer, the
update and the config checks instead of each testing config strings
(docs/algorithms.md#adding-an-objective).

    objective        the registered loss (`algo.loss`: a name of rlvr.algos.OBJECTIVES or a
                     user's "module:function"); `algo.ratio=sequence` with the default `clip`
                     is GSPO; under `algo.top_entropy_quantile` < 1 it trains on the top
                     entropy share of tokens only (rlvr.algos.top_entropy)
    settings         its parameters: an instance of the settings class it declares
                     (LossSettings' clip bounds, dual clip, aggregation and the loss's KL, and
                     its own), range-checked once, by that class (rlvr.config.objective)
    advantage        the estimator (rlvr.algos.ADVANTAGES); token_level: it reads per-token
                     rewards (gae, reinforce_pp), uses_critic: a value model (gae)
    needs_old_log_probs, needs_reference: which no-grad passes a step runs
    correction, bypass  rollout correction's weights (None = off) and whether the engine's
                     log-probs are pi_old (docs/algorithms.md#rollout-correction)
    sequence_mask    off-policy sequence masking's threshold, any objective (None = off;
                     docs/algorithms.md#off-policy-sequence-masking); both refused with an
                     objective that declares it cannot take rollout weights
    gdpo_terms       under advantage gdpo: the reward terms it normalises one by one, with
                     their weights in the total (docs/algorithms.md#gdpo)
    adaptive_refill  dynamic sampling's refill batch: sized from the keep rate, or whole
    distill_coef     on-policy distillation's share of the advantage (0: no teacher;
                     rlvr.algos.distill, docs/distillation.md)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from rlvr.algos import ADVANTAGES, TOKEN_LEVEL, AdvantageInputs, LossOutput
from rlvr.algos.objectives import LossInputs, LossSettings, Objective
from rlvr.algos.rollout_correction import CorrectionSettings
from rlvr.algos.top_entropy import with_top_entropy
from rlvr.config.objective import loss_settings, resolve_objective
from rlvr.config.schema import Config, ConfigError, check


@dataclass(frozen=True)
class Algorithm:
    objective: Objective
    settings: LossSettings  # kl_coef: the loss's (0 when the KL is in the reward)
    advantage: str
    std: str
    token_level: bool
    uses_critic: bool
    kl_in_reward: bool
    needs_reference: bool  # kl_coef > 0: reference log-probs, in the loss or the reward
    several_updates: bool  # mu > 1 or several mini-batches: pi_old differs from the live policy
    needs_old_log_probs: bool  # for the ratio (several_updates) or the reward's KL
    norm_constant: float  # Dr. GRPO's: the generation budget, rollout.max_new_tokens
    adaptive_refill: bool = True  # dynamic sampling's refills sized from the keep rate
    correction: CorrectionSettings | None = None  # rollout correction's weights, or off
    bypass: bool = False  # the engine's log-probs serve as pi_old (no old-log-prob forward)
    sequence_mask: float | None = None  # off-policy sequence masking's threshold, or off
    gdpo_terms: tuple[tuple[str, float], ...] = ()  # GDPO's rewards and their weights
    distill_coef: float = 0.0  # algo.teacher's share c of the advantage; 0 = no teacher

    @property
    def distills(self) -> bool:
        """On-policy distillation: a teacher scores the sampled tokens (algo.teacher)."""
        return self.distill_coef > 0

    @classmethod
    def from_config(cls, cfg: Config) -> Algorithm:
        """The run's algorithm; a ConfigError naming the key where a setting is out of range."""
        a = cfg.algo
        _check_consistency(cfg)
        if a.kl_coef < 0:  # the reward's beta is checked here too
            raise ConfigError(f"algo.kl_coef: got {a.kl_coef!r}, expected >= 0")
        several = a.mu > 1 or a.mini_batches > 1
        objective = resolve_objective(a.loss, a.ratio)
        settings = loss_settings(objective, a, 0.0 if a.kl_in_reward else a.kl_coef)
        q = a.top_entropy_quantile
        check(0 < q <= 1, "algo.top_entropy_quantile", "in (0, 1] (the paper: 0.2)", q)
        try:
            objective.check_settings(settings)
            objective = with_top_entropy(objective, q) if q < 1 else objective
        except ValueError as e:
            raise ConfigError(f"algo.{e}") from None
        return cls(
            objective=objective,
            settings=settings,
            advantage=a.advantage,
            std=a.std,
            token_level=a.advantage in TOKEN_LEVEL,
            uses_critic=a.advantage == "gae",
            kl_in_reward=a.kl_in_reward,
            needs_reference=a.kl_coef > 0,
            several_updates=several,
            needs_old_log_probs=(several and not a.rollout_bypass)
            or (a.kl_in_reward and a.kl_coef > 0),
            norm_constant=float(cfg.rollout.max_new_tokens),
            adaptive_refill=a.refill == "adaptive",
            correction=_correction(cfg, objective),
            bypass=a.rollout_bypass,
            sequence_mask=_sequence_mask(cfg, objective),
            gdpo_terms=_gdpo_terms(cfg),
            distill_coef=_distill_coef(cfg),
        )

    def group_advantages(
        self,
        rewards: torch.Tensor,
        group_size: int,
        terms: Mapping[str, torch.Tensor] | None = None,
        response_mask: torch.Tensor | None = None,
        global_sum=None,
    ) -> torch.Tensor:
        """(N,) advantages from each whole group's rewards (the group estimators); GDPO reads
        each of its reward terms (N,) by name from `terms` and whitens over `response_mask`'s
        tokens (N, T), on every rank through `global_sum`."""
        reward_terms = None
        if self.gdpo_terms:
            terms = terms or {}
            missing = [name for name, _ in self.gdpo_terms if name not in terms]
            if missing:
                raise ValueError(f"algo.advantage gdpo: no scores for reward terms {missing}")
            reward_terms = torch.stack([terms[name].float() for name, _ in self.gdpo_terms])
        inputs = AdvantageInputs(
            rewards=rewards, group_size=group_size, std=self.std, response_mask=response_mask,
            global_sum=global_sum, reward_terms=reward_terms,
            reward_weights=tuple(w for _, w in self.gdpo_terms),
        )  # fmt: skip
        return ADVANTAGES[self.advantage](inputs)

    def loss(self, inputs: LossInputs) -> LossOutput:
        """The objective on one micro-batch, its rollout weights applied once
        (`Objective.__call__`); no KL term where it has no reference (a dummy)."""
        settings = self.settings
        if inputs.ref_log_probs is None and settings.kl_coef > 0:
            settings = replace(settings, kl_coef=0.0)
        return self.objective(inputs, settings)


def _check_consistency(cfg: Config) -> None:
    """What the estimator asks of the rest of the config."""
    a, r = cfg.algo, cfg.rollout
    token_level = a.advantage in TOKEN_LEVEL  # their baseline is not the group
    check(
        r.group_size >= (1 if token_level else 2),
        "rollout.group_size",
        ">= 2 (a group needs a baseline)" if not token_level else ">= 1",
        r.group_size,
    )
    check(
        not a.kl_in_reward or token_level,
        "algo.kl_in_reward",
        "false unless algo.advantage is gae or reinforce_pp (group advantages read only the score)",
        a.kl_in_reward,
    )
    check(
        not token_level or a.loss != "gmpo",
        "algo.loss",
        "not gmpo with per-token advantages (gae, reinforce_pp): its advantage is the response's",
        a.loss,
    )
    check(
        a.advantage != "grpo" or a.std != "unbiased" or r.group_size >= 2,
        "algo.std",
        "population when group_size is 1",
        a.std,
    )


def _distill_coef(cfg: Config) -> float:
    """The teacher's share of the advantage (0 without algo.teacher), and what distillation
    asks of the rest of the config."""
    a = cfg.algo
    check(
        bool(a.teacher) or cfg.preset != "opd",
        "algo.teacher",
        "a teacher model (a directory, hub id, run directory or checkpoint) under preset opd",
        a.teacher,
    )
    if not a.teacher:
        return 0.0
    c = a.distill_coef
    check(0 < c <= 1, "algo.distill_coef", "in (0, 1] (1: distillation alone)", c)
    check(
        a.loss != "gmpo",
        "algo.loss",
        "not gmpo with algo.teacher (its advantage is the response's; distillation's is per token)",
        a.loss,
    )
    return float(c)


def _takes_weights(cfg: Config, objective: Objective, key: str, on: bool, off: str) -> None:
    """ConfigError on `algo.<key>` when it is on (its value other than `off`) and the objective
    declares it cannot take rollout weights."""
    check(
        not on or objective.rollout_weights != "refused",
        f"algo.{key}",
        f"{off} with algo.loss={cfg.algo.loss} (it declares rollout_weights='refused': "
        "it cannot take rollout weights)",
        getattr(cfg.algo, key),
    )


def _correction(cfg: Config, objective: Objective) -> CorrectionSettings | None:
    """Rollout correction's settings (None when off), and what it and bypass need: an engine
    that reports its sampling log-probs (`RolloutEngine.reports_log_probs`), or staleness,
    under which the producer computes them (rlvr.training.pipeline); and an objective that
    takes rollout weights."""
    from rlvr.rollout.registry import ENGINES, reporting_log_probs

    a, engine = cfg.algo, cfg.rollout.engine
    _takes_weights(cfg, objective, "rollout_correction", a.rollout_correction != "none", "none")
    reports = engine not in ENGINES or ENGINES[engine].reports_log_probs
    for key, on in (("rollout_correction", a.rollout_correction != "none"),
                    ("rollout_bypass", a.rollout_bypass)):  # fmt: skip
        check(
            not on or reports or cfg.train.max_staleness > 0,
            f"algo.{key}",
            f"{'none' if key == 'rollout_correction' else 'false'} with rollout.engine={engine} "
            f"(it reports no sampling log-probs; use {' or '.join(reporting_log_probs())})",
            getattr(a, key),
        )
    check(
        not (a.rollout_bypass and a.rollout_correction != "none"),
        "algo.rollout_correction",
        "none under algo.rollout_bypass (pi_old is then mu: every weight would be 1)",
        a.rollout_correction,
    )
    check(
        not (a.rollout_bypass and a.kl_in_reward),
        "algo.rollout_bypass",
        "false with algo.kl_in_reward (the reward's KL needs the trainer's old log-probs)",
        a.rollout_bypass,
    )
    cap = a.rollout_is_cap
    check(cap is None or cap > 0, "algo.rollout_is_cap", "none or > 0", cap)
    if a.rollout_correction == "none":
        for key in ("rollout_mask_low", "rollout_mask_high"):
            value = getattr(a, key)
            check(value is None, f"algo.{key}", "none unless algo.rollout_correction is set", value)
        return None
    try:
        return CorrectionSettings(
            level=a.rollout_correction, cap=a.rollout_is_cap,
            mask_low=a.rollout_mask_low, mask_high=a.rollout_mask_high,
        )  # fmt: skip
    except ValueError as e:
        name = str(e).split(":", 1)[0]
        key = {"level": "rollout_correction", "cap": "rollout_is_cap"}.get(name, f"rollout_{name}")
        raise ConfigError(f"algo.{key}:{str(e).split(':', 1)[1]}") from None


def _sequence_mask(cfg: Config, objective: Objective) -> float | None:
    """Off-policy sequence masking's threshold (None = off)."""
    t = cfg.algo.off_policy_mask_threshold
    check(t is None or t >= 0, "algo.off_policy_mask_threshold", "none or >= 0 (TRL's: 0.5)", t)
    _takes_weights(cfg, objective, "off_policy_mask_threshold", t is not None, "none")
    return t


def reward_terms(cfg: Config) -> dict[str, float]:
    """The terms of the reward's total by name (`Scores.terms`), each with its weight:
    accuracy (unless reward.accuracy is none), format, each extra, soft_overlong."""
    r = cfg.reward
    out = {} if r.accuracy == "none" else {"accuracy": r.accuracy_weight}
    if r.format_weight:
        out["format"] = r.format_weight
    for item in r.extra:
        name, _, weight = item.rpartition("=")
        try:
            out[name.rsplit(":", 1)[-1]] = float(weight)
        except ValueError:
            continue  # the scorer names a malformed extra
    if cfg.algo.soft_overlong:
        out["soft_overlong"] = 1.0
    return out


def _gdpo_terms(cfg: Config) -> tuple[tuple[str, float], ...]:
    """GDPO's reward terms and weights (empty unless algo.advantage is gdpo)."""
    a = cfg.algo
    if a.advantage != "gdpo":
        check(not a.gdpo_reward_keys, "algo.gdpo_reward_keys", "empty unless algo.advantage "
              "is gdpo", list(a.gdpo_reward_keys))  # fmt: skip
        return ()
    check(
        cfg.reward.model is None,
        "algo.advantage",
        "not gdpo with reward.model (the model's probability replaces a term of the total)",
        a.advantage,
    )
    terms = reward_terms(cfg)
    keys = a.gdpo_reward_keys or tuple(terms)
    unknown = [k for k in keys if k not in terms]
    check(not unknown, "algo.gdpo_reward_keys", f"names of the run's reward terms {sorted(terms)}",
          list(keys))  # fmt: skip
    check(len(set(keys)) == len(keys), "algo.gdpo_reward_keys", "each name once", list(keys))
    return tuple((k, terms[k]) for k in keys)
