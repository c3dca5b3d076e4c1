"""The policy's learning-rate schedule: transformers' `get_scheduler`, by the names TRL and
transformers give it (`optim.lr_schedule`), over the run's optimiser steps.

The horizon is `train.max_steps x algo.mu x algo.mini_batches` optimiser steps; the scheduler
counts the steps actually taken (a step with no update takes none), and its state is in every
checkpoint, so a resumed run continues the same schedule. The warm-up is `optim.warmup_steps`,
or `ceil(optim.warmup_ratio x horizon)` as transformers rounds it.

transformers' warm-up starts at lr 0: the first optimiser step does nothing. One rlvr step
costs a whole generation, so by default (`optim.warmup_from_zero=false`) a schedule with a
warm-up is taken one step later over a horizon one step longer: optimiser step k gets the
value transformers gives after k steps, the first step lr / warmup_steps and the last one
still above 0. `optim.warmup_from_zero=true` is transformers' and TRL's count exactly (step k
gets the value after k - 1 steps); the TRL port sets it.
"""

from __future__ import annotations

import math

import torch

from rlvr.config.schema import Config, ConfigError


def horizon(cfg: Config) -> int:
    """The optimiser steps the run is scheduled to take."""
    return cfg.train.max_steps * cfg.algo.mu * cfg.algo.mini_batches


def warmup_steps(cfg: Config) -> int:
    o = cfg.optim
    return o.warmup_steps or math.ceil(o.warmup_ratio * horizon(cfg))


def lr_scheduler(cfg: Config, optimizer: torch.optim.Optimizer):
    """A LambdaLR over `optimizer` whose factor is transformers' schedule (see the module)."""
    from transformers import get_scheduler

    o, warmup = cfg.optim, warmup_steps(cfg)
    shift = 0 if o.warmup_from_zero or warmup == 0 else 1
    specific = {"min_lr_rate": o.min_lr_rate} if o.lr_schedule == "cosine_with_min_lr" else {}
    try:
        scheduler = get_scheduler(
            o.lr_schedule,
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=max(horizon(cfg), 1) + shift,
            scheduler_specific_kwargs=specific,
        )
    except ValueError as e:  # e.g. polynomial's lr_end (1e-7) not below optim.lr
        raise ConfigError(f"optim.lr_schedule: {o.lr_schedule}: {e}") from None
    if not shift:
        return scheduler
    factor = scheduler.lr_lambdas[0]

    def shifted(step: int) -> float:  # a plain function: LambdaLR's state leaves it out
        return factor(step + 1)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, shifted)
