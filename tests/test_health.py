"""Health guard: non-finite updates are skipped and counted; a streak stops the run."""

import copy
from pathlib import Path

import pytest
import torch

from conftest import update_context
from rlvr.config.load import load_config
from rlvr.run.health import HealthGuard, TrainingHealthError
from rlvr.training.batch import Batch, Sample
from rlvr.training.collect import _one_token_repeated
from rlvr.training.update import policy_update


def test_nan_loss_skips_the_update_and_keeps_the_weights(tiny_model):
    cfg = load_config(
        None,
        {
            "preset": "grpo",
            "rollout": {"group_size": 2, "prompts_per_step": 1},
            "algo": {"kl_coef": 0.0},
        },
    )
    model = copy.deepcopy(tiny_model)
    before = [p.detach().clone() for p in model.parameters()]
    group = [
        Sample([5, 6], [7, 8, 9], False, 1.0, True, 0),
        Sample([5, 6], [9, 8], False, 0.0, False, 0),
    ]
    samples = Batch.from_groups([group])
    samples = Batch(samples.samples, 1, advantages=torch.tensor([float("nan"), 1.0]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m = policy_update(samples, update_context(cfg, model), opt, sched)
    assert m["nonfinite_updates"] == 1 and m["optimizer_steps"] == 0
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)
    assert not any(p.grad is not None for p in model.parameters())  # nothing left behind


def test_streak_of_bad_steps_stops_with_step_and_checkpoint():
    guard = HealthGuard(max_bad_steps=3, entropy_floor=0.0)
    ckpt = Path("runs/x/checkpoints/step-000007")
    guard.check(8, {"nonfinite_updates": 1}, ckpt)
    guard.check(9, {"nonfinite_updates": 0}, ckpt)  # a good step resets the streak
    guard.check(10, {"nonfinite_updates": 1}, ckpt)
    guard.check(11, {"nonfinite_updates": 2}, ckpt)
    with pytest.raises(TrainingHealthError, match=r"step 12: 3 steps in a row.*step-000007"):
        guard.check(12, {"nonfinite_updates": 1}, ckpt)


def test_warnings_are_flagged_every_step_but_announced_once():
    guard = HealthGuard(max_bad_steps=3, entropy_floor=0.05)
    m1 = {"entropy": 0.01}
    msgs = guard.check(1, m1, None)
    assert m1["warn/entropy_collapse"] == 1.0 and len(msgs) == 1 and "entropy" in msgs[0]
    m2 = {"entropy": 0.01}
    assert guard.check(2, m2, None) == [] and m2["warn/entropy_collapse"] == 1.0
    m3 = {"entropy": 1.0, "response/repeat_frac": 0.75, "groups/identical_frac": 1.0}
    msgs = guard.check(3, m3, None)
    assert m3["warn/entropy_collapse"] == 0.0
    assert any("75% of responses" in t for t in msgs) and any("identical" in t for t in msgs)


@pytest.mark.parametrize(
    ("ids", "want"),
    [
        ([4, 4, 4, 4, 2], True),
        ([4, 4, 4, 2], False),
        ([4, 4, 5, 4, 4, 2], False),
        ([3, 3, 3, 3], True),
    ],
)
def test_one_token_repeated(ids, want):
    assert _one_token_repeated(ids) is want
