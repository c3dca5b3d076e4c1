"""The learning-rate schedule (rlvr.training.lr_schedule): transformers' schedules by name,
counted as TRL counts with optim.warmup_from_zero, one step later by default; resumed exactly."""

import math

import pytest
import torch
from transformers import get_scheduler

from rlvr.config import load_config
from rlvr.config.schema import ConfigError
from rlvr.training.lr_schedule import lr_scheduler


def factors(changes: dict, steps: int | None = None, state: dict | None = None) -> list[float]:
    """lr / optim.lr of each optimiser step of a run with `changes`."""
    cfg = load_config(None, changes)
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=cfg.optim.lr)
    sched = lr_scheduler(cfg, opt)
    if state is not None:  # as a checkpoint restores them: the optimiser's, then the schedule's
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    out = []
    for _ in range(steps or cfg.train.max_steps):
        out.append(opt.param_groups[0]["lr"] / cfg.optim.lr)
        opt.step()
        sched.step()
    factors.state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
    return out


def test_the_default_warm_up_reaches_lr_at_its_last_step():
    # the built-in model's preset: warmup_steps 5, constant after; step k takes min(1, k / 5)
    got = factors({"train": {"max_steps": 7}})
    assert load_config(None, {}).optim.lr_schedule == "constant_with_warmup"
    assert got == [0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0]


def test_cosine_by_hand_both_counts():
    # warm-up 2, 6 optimiser steps. TRL's count: step k takes f(k - 1) with f(s) = s / 2 in the
    # warm-up, then 0.5 (1 + cos(pi (s - 2) / 4)): 0, .5, 1, .853553, .5, .146447
    trl = {"optim": {"lr_schedule": "cosine", "warmup_steps": 2, "warmup_from_zero": True},
           "train": {"max_steps": 6}}  # fmt: skip
    torch.testing.assert_close(
        factors(trl), [0.0, 0.5, 1.0, 0.8535534, 0.5, 0.1464466], rtol=0, atol=1e-6
    )
    # rlvr's default count: step k takes f(k) over 7 steps, cos(pi (s - 2) / 5) after warm-up:
    # .5, 1, .5 (1 + cos(.2 pi)) = .904508, .654508, .345492, .095492
    trl["optim"]["warmup_from_zero"] = False
    torch.testing.assert_close(
        factors(trl), [0.5, 1.0, 0.9045085, 0.6545085, 0.3454915, 0.0954915], rtol=0, atol=1e-6
    )


@pytest.mark.parametrize(
    "name", ["linear", "cosine", "cosine_with_min_lr", "constant", "constant_with_warmup",
             "polynomial"],
)  # fmt: skip
def test_trls_count_is_transformers_get_scheduler(name):
    """With warmup_from_zero every step's lr is get_scheduler's, the same arithmetic."""
    steps, ratio = 9, 0.25  # ceil(0.25 x 9) = 3 warm-up steps, as transformers rounds
    got = factors({"optim": {"lr_schedule": name, "warmup_steps": 0, "warmup_ratio": ratio,
                             "warmup_from_zero": True, "min_lr_rate": 0.1, "lr": 1e-4},
                   "train": {"max_steps": steps}})  # fmt: skip
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=1e-4)
    kwargs = {"min_lr_rate": 0.1} if name == "cosine_with_min_lr" else {}
    ref = get_scheduler(name, opt, num_warmup_steps=math.ceil(ratio * steps),
                        num_training_steps=steps, scheduler_specific_kwargs=kwargs)  # fmt: skip
    want = []
    for _ in range(steps):
        want.append(opt.param_groups[0]["lr"] / 1e-4)
        opt.step()
        ref.step()
    assert got == want


def test_the_horizon_counts_mu_and_mini_batches():
    # 2 rollout steps x mu 2 x 2 mini-batches = 8 optimiser steps of linear decay: 1 - s / 8
    got = factors({"optim": {"lr_schedule": "linear", "warmup_steps": 0},
                   "algo": {"mu": 2, "mini_batches": 2}, "train": {"max_steps": 2}}, steps=8)  # fmt: skip
    assert got == [1 - s / 8 for s in range(8)]


def test_a_resumed_schedule_continues_exactly():
    changes = {"optim": {"lr_schedule": "cosine", "warmup_steps": 2}, "train": {"max_steps": 8}}
    whole = factors(changes)
    first = factors(changes, steps=3)
    rest = factors(changes, steps=5, state=factors.state)
    assert first + rest == whole


@pytest.mark.parametrize(
    ("optim", "match"),
    [
        (
            {"warmup_ratio": 0.1},
            r"optim.warmup_ratio: 0.1 with optim.warmup_steps 5 .*"
            r"optim.warmup_steps=0",
        ),
        ({"warmup_ratio": 1.0, "warmup_steps": 0}, r"optim.warmup_ratio: got 1.0, expected"),
        ({"lr_schedule": "cosine_with_restarts"}, "optim.lr_schedule"),
        ({"lr_schedule": "polynomial", "lr": 1e-8}, r"optim.lr: .* polynomial"),
        ({"min_lr_rate": -0.1}, "optim.min_lr_rate"),
    ],
)
def test_bad_schedules_are_named(optim, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, {"optim": optim})
