"""Presets and the built-in model's defaults: each a mapping of changes to the config's
dataclass defaults (rlvr.config.schema), applied by `rlvr.config.load_config` in its layer order."""

from __future__ import annotations

from typing import Any

from rlvr.config.schema import Config

# Presets hold only changes to the defaults. The defaults are the tiny offline run's sizes;
# the algorithm fields are what each paper specifies (docs/algorithms.md#presets).
_DAPO: dict[str, dict[str, Any]] = {
    "algo": {
        "advantage": "grpo",
        "clip_low": 0.2,
        "clip_high": 0.28,
        "kl_coef": 0.0,
        "agg": "token_mean",
        "dynamic_sampling": True,
        "overlong_filter": True,
        "soft_overlong": True,
    },
    "reward": {"wrong_score": -1.0},
}


def _one_sample(advantage: str, **algo: Any) -> dict[str, dict[str, Any]]:
    """PPO's recipe as verl and OpenRLHF run it for LLMs, under `advantage`: one sample per
    prompt, k1 KL in the per-token reward, the clipped token-mean loss, two mini-batches."""
    return {
        "rollout": {"group_size": 1, "prompts_per_step": 64},
        "algo": {
            "advantage": advantage,
            "clip_low": 0.2,
            "clip_high": 0.2,
            "agg": "token_mean",
            "kl_coef": 0.001,
            "kl_kind": "k1",
            "kl_in_reward": True,
            "gamma": 1.0,
            "mini_batches": 2,
            **algo,
        },
    }


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "grpo": {
        "algo": {
            "advantage": "grpo",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "kl_coef": 0.04,
            "kl_kind": "k3",
            "agg": "sample_mean",
        },
    },
    "dapo": _DAPO,
    # CISPO (MiniMax-M1): DAPO's recipe with the clipped stop-gradient importance weight on
    # every token; no lower bound (clip_low 1: the bound 0), the upper at DAPO's 1.28 (verl's
    # and Trinity-RFT's CISPO default).
    "cispo": {
        "algo": {**_DAPO["algo"], "loss": "cispo", "clip_low": 1.0},
        "reward": dict(_DAPO["reward"]),
    },
    # SAPO (arXiv 2511.20347) and GMPO (arXiv 2507.20673): DAPO's recipe with the objective
    # swapped in and each paper's aggregation (the sample mean). SAPO has no clip: its gate's
    # temperatures (1 / 1.05) are the schema defaults and DAPO's clip_high goes back to the
    # default, unused. GMPO clips log-ratios at +-0.4 (the paper's range e^-0.4 .. e^0.4).
    "sapo": {
        "algo": {**_DAPO["algo"], "loss": "sapo", "clip_high": 0.2, "agg": "sample_mean"},
        "reward": dict(_DAPO["reward"]),
    },
    "gmpo": {
        "algo": {
            **_DAPO["algo"],
            "loss": "gmpo",
            "clip_low": 0.4,
            "clip_high": 0.4,
            "agg": "sample_mean",
        },
        "reward": dict(_DAPO["reward"]),
    },
    # DPPO (arXiv 2602.04879), as its authors run it in verl (examples/dppo_trainer): the
    # binary-TV mask at 0.15 on both sides, the ratio weight uncapped, Dr. GRPO's advantage and
    # its constant normaliser (no length or difficulty bias), the engine's log-probs as pi_old
    # (bypass: the divergence is measured from the policy that sampled), no KL, rewards +1/-1
    # (verl's dapo reward manager). dppo_kl's threshold there is 0.05.
    "dppo": {
        "algo": {
            "advantage": "dr_grpo",
            "loss": "dppo_tv",
            "clip_low": 0.15,
            "clip_high": 0.15,
            "kl_coef": 0.0,
            "agg": "token_sum_norm",
            "rollout_bypass": True,
        },
        "reward": {"wrong_score": -1.0},
    },
    "dr_grpo": {
        "algo": {
            "advantage": "dr_grpo",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "kl_coef": 0.0,
            "agg": "token_sum_norm",
        },
    },
    # On-policy distillation (Thinking Machines' "On-Policy Distillation"; docs/distillation.md):
    # the advantage of every sampled token is log pi_teacher - log pi_student alone
    # (algo.distill_coef 1), under the token-mean clipped loss, with no KL to a reference (the
    # teacher is the anchor) and none of DAPO's reward shaping (the reward takes no part).
    # algo.teacher names the teacher; the preset refuses to run without one.
    "opd": {
        "algo": {
            "advantage": "grpo",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "kl_coef": 0.0,
            "agg": "token_mean",
            "distill_coef": 1.0,
        },
    },
    # PPO as verl and OpenRLHF run it for LLMs: one sample per prompt, GAE over a critic's
    # values (gamma 1, lam 0.95), k1 KL in the per-token reward, token-mean loss.
    "ppo": _one_sample("gae", lam=0.95),
    # REINFORCE++ (OpenRLHF): PPO's per-token KL reward and clipped loss without a critic.
    "reinforce_pp": _one_sample("reinforce_pp"),
}

# The offline default (`rlvr train` with no arguments): sizes tuned so the built-in tiny model
# learns its task on a laptop CPU in a minute, applied under every preset when the model is the
# built-in one and the user did not set them. What each default run reaches and in what time
# is measured in docs/guides/quickstart.md ("The built-in model and tasks"); the model's greedy
# accuracy on the task is the ceiling.
TINY_DEFAULTS: dict[str, dict[str, Any]] = {
    "optim": {"lr": 4e-4, "warmup_steps": 5},
    # PPO's critic (algo.advantage=gae), 5x the ppo preset's policy lr of 2e-4 (its readout,
    # critic.arch, is set per preset below).
    "critic": {"lr": 1e-3},
    "train": {"max_steps": 100, "threads": 2},
}

# Per preset, on top of TINY_DEFAULTS (rlvr-tiny under that preset). The one-sample presets
# take half the policy lr and a longer run: with no per-prompt baseline, PPO at lr 4e-4
# sharpens onto whatever it sampled, right or wrong, before its critic can tell them apart.
# PPO's critic reads the reference's surprise at the response (critic.arch=surprise): once
# most responses are right, the wrong ones are single slipped digits, which the plain value
# head barely explains and this readout explains about half of. REINFORCE++ shares PPO's batch
# and per-token KL reward, so it shares these sizes. The measurements behind both:
# docs/ppo_vs_grpo.md.
TINY_PRESET_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {"optim": {"lr": 2e-4}, "train": {"max_steps": 200}, "critic": {"arch": "surprise"}},
    "reinforce_pp": {"optim": {"lr": 2e-4}, "train": {"max_steps": 200}},
    # On-policy distillation at half the lr: at 4e-4 the student passes 0.91 held-out by step
    # 10 and then falls back (0.79 at step 30) as it sharpens onto its own samples; at 2e-4
    # it climbs steadily (0.91 by step 25, 0.94 at 40; docs/distillation.md).
    "opd": {"optim": {"lr": 2e-4}, "train": {"max_steps": 60}},
}

# Per built-in task, on top of TINY_DEFAULTS (rlvr-tiny with `data.task` and no `data.path`):
# a length cap that fits every reference answer, the run's length, and for `calc` the budget
# of the model's own tokens (two tool calls and the answer take about 125) within the whole
# response's (tool turns included: 175-181 tokens). `calc`'s tool comes from the task
# (rollout.tools empty). What each default run reaches over seeds and two CPU roundings, and
# in what time: the task table of docs/guides/quickstart.md (bench/task_margin.py measures it).
# chain trains at half the lr: at 4e-4 its held-out accuracy swings by several points from one
# evaluation to the next late in the run, so where a run ends moves with the host's rounding;
# at 2e-4 it holds above 0.90 from mid-run on, for the same number of generated tokens
# (bench/results/task_margin.json).
# calc trains without DAPO's overlong filter and at half the lr: a truncated calc response is a
# conversation derailed into invalid tool calls, not correct work cut short, and masking it
# leaves RL no signal against it (docs/algorithms.md measures the truncated share with and
# without). Most of a calc response is JSON the model writes with near certainty, so its mean
# token entropy starts an order of magnitude under arithmetic's and ends near 0.005 on a
# healthy run: its collapse warning fires below 0.003, not the schema's 0.01.
TINY_TASK_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "arithmetic": {},
    "chain": {
        "rollout": {"max_new_tokens": 64},
        "optim": {"lr": 2e-4},
        "train": {"max_steps": 280},
    },
    "sort": {"rollout": {"max_new_tokens": 16}, "train": {"max_steps": 60}},
    "calc": {
        "rollout": {"max_new_tokens": 160, "max_total_tokens": 224},
        "algo": {"overlong_filter": False},
        "optim": {"lr": 2e-4},
        "train": {"max_steps": 150, "entropy_floor": 0.003},
    },
}


def preset_names() -> str:
    """The registry's presets, the default marked: "grpo, dapo (default), ..."."""
    default = Config().preset
    return ", ".join(f"{n} (default)" if n == default else n for n in PRESETS)
