"""Presets and the built-in model's defaults: each a mapping of changes to the config's
dataclass defaults (rlvr.schema), applied by `rlvr.config.load_config` in its layer order."""

from __future__ import annotations

from typing import Any

from rlvr.schema import Config

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
    "dr_grpo": {
        "algo": {
            "advantage": "dr_grpo",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "kl_coef": 0.0,
            "agg": "token_sum_norm",
        },
    },
    # PPO as verl and OpenRLHF run it for LLMs: one sample per prompt, GAE over a critic's
    # values (gamma 1, lam 0.95), k1 KL in the per-token reward, token-mean loss.
    "ppo": {
        "rollout": {"group_size": 1, "prompts_per_step": 64},
        "algo": {
            "advantage": "gae",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "agg": "token_mean",
            "kl_coef": 0.001,
            "kl_kind": "k1",
            "kl_in_reward": True,
            "gamma": 1.0,
            "lam": 0.95,
            "mini_batches": 2,
        },
    },
    # REINFORCE++ (OpenRLHF): PPO's per-token KL reward and clipped loss without a critic.
    "reinforce_pp": {
        "rollout": {"group_size": 1, "prompts_per_step": 64},
        "algo": {
            "advantage": "reinforce_pp",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "agg": "token_mean",
            "kl_coef": 0.001,
            "kl_kind": "k1",
            "kl_in_reward": True,
            "gamma": 1.0,
            "mini_batches": 2,
        },
    },
}

# The offline default (`rlvr train` with no arguments): sizes tuned so the built-in tiny model
# learns its task on a laptop CPU in a minute. Applied under every preset when the model is the
# built-in one and the user did not set them. lr 4e-4 and 100 steps, measured on the dapo run
# (arithmetic, 256 held-out prompts from 0.398): 0.961 at step 100 in 31 s, 0.902 / 0.926 /
# 0.930 at steps 25 / 50 / 75; the model's greedy accuracy, 99.8%, is the ceiling.
TINY_DEFAULTS: dict[str, dict[str, Any]] = {
    "optim": {"lr": 4e-4, "warmup_steps": 5},
    # PPO's critic (algo.advantage=gae), 5x the ppo preset's policy lr of 2e-4 (its readout,
    # critic.arch, is set per preset below).
    "critic": {"lr": 1e-3},
    "train": {"max_steps": 100, "threads": 2},
}

# Per preset, on top of TINY_DEFAULTS (rlvr-tiny under that preset). The one-sample presets
# take half the policy lr and a longer run: with no per-prompt baseline, PPO at lr 4e-4
# sharpens onto whatever it sampled, right or wrong, before its critic can tell them apart
# (held-out 0.398 -> 0.863 at step 200 with the plain head; docs/ppo_vs_grpo.md). PPO's critic
# reads the reference's surprise at the response (critic.arch=surprise): once 95% of the
# responses are right, the wrong ones are single slipped digits, which the plain head explains
# 0.10 of (the return's variance over the last quarter, pooled) and this readout 0.55, and
# the default run ends at 0.953 (0.938 with the plain head). REINFORCE++ shares PPO's batch
# and per-token KL reward, so it shares these sizes: its default run ends at 0.957 (200
# steps, 62 s).
TINY_PRESET_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {"optim": {"lr": 2e-4}, "train": {"max_steps": 200}, "critic": {"arch": "surprise"}},
    "reinforce_pp": {"optim": {"lr": 2e-4}, "train": {"max_steps": 200}},
}

# Per built-in task, on top of TINY_DEFAULTS (rlvr-tiny with `data.task` and no `data.path`):
# a length cap that fits every reference answer, the run's length, and for `calc` the budget
# of the model's own tokens (two tool calls and the answer take about 125) within the whole
# response's (tool turns included: 175-181 tokens). `calc`'s tool comes from the task
# (rollout.tools empty). Held-out accuracy after each default run (256 prompts, T=1) over
# seeds 0-2, each on the 2-core machine's CPU kernels and on an AVX2 host's (bench/task_margin.py,
# bench/results/task_margin.json): arithmetic 0.398 -> 0.961-0.977 (mean 0.970) in 100 steps,
# chain 0.363 -> 0.934-0.973 (mean 0.952) in 280, sort 0.418 -> 0.934-0.953 (mean 0.941) in
# 60; calc 0.355 -> 0.934 in 150 (seed 0 on the 2-core machine; 0.852 at step 75, 0.828 at
# 100, 0.906 at 125). Times in the task table of docs/guides/quickstart.md.
# chain trains at half the lr: at 4e-4 its held-out accuracy from step 140 to 420 swings
# between 0.879 and 0.965 from one evaluation to the next (every 20 steps; seed 0, two kernel
# sets), so where a run ends depends on the host (seed 0 at step 280: 0.930 here, 0.898 on the
# AVX2 host's kernels, 0.871 on an Intel Xeon with AVX-512 and AMX); at 2e-4 it passes 0.90 by
# step 60 and holds 0.910-0.973 from step 140 on (all six runs), for the same work (4.00 against
# 4.02 million generated tokens in 280 steps, seed 0).
# calc trains without DAPO's overlong filter and at half the lr: a truncated calc response is a
# conversation derailed into invalid tool calls, not correct work cut short, and masking it
# leaves RL no signal against it; unmasked, the default run's truncated held-out responses fall
# from 8.2% to 0.4%. Most of a calc response is JSON the model writes with near certainty, so
# its mean token entropy starts near 0.05 (arithmetic's near 0.42) and ends near 0.005 on a
# healthy run (lowest step 0.004): its collapse warning fires below 0.003, not the schema's 0.01.
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
