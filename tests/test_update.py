"""The update step: micro-batching must not change the gradient; old log-probs are exact."""

import copy

import pytest
import torch

from rlvr.config import load_config
from rlvr.train.batch import Sample
from rlvr.train.update import assign_advantages, fill_log_probs, policy_update


def _samples(G=4, groups=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(groups):
        prompt = torch.randint(5, 100, (int(torch.randint(2, 8, (1,), generator=g)),), generator=g)
        for _ in range(G):
            n = int(torch.randint(1, 9, (1,), generator=g))
            out.append(
                Sample(
                    prompt_ids=prompt.tolist(),
                    completion_ids=torch.randint(5, 100, (n,), generator=g).tolist(),
                    truncated=bool(torch.rand(1, generator=g) < 0.3),
                    reward=float(torch.rand(1, generator=g)),
                    correct=False,
                    group=k,
                )
            )
    return out


def _step(model, samples, cfg, micro):
    cfg = load_config(None, {**cfg, "optim": {"micro_batch_sequences": micro, "max_grad_norm": 0}})
    model = copy.deepcopy(model)
    samples = copy.deepcopy(samples)
    assign_advantages(samples, cfg)
    if cfg.algo.kl_coef > 0:
        fill_log_probs(model, samples, cfg, 0, "cpu", "ref_log_probs")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # new params = old - grad: compare grads
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    metrics = policy_update(model, samples, cfg, opt, sched, pad_id=0, device="cpu")
    return model, metrics


@pytest.mark.parametrize("preset", ["grpo", "dapo", "dr_grpo"])
def test_micro_batching_gives_the_whole_batch_gradient(tiny_model, preset):
    samples = _samples()
    cfg = {"preset": preset, "rollout": {"group_size": 4, "prompts_per_step": 3}}
    whole, m_whole = _step(tiny_model, samples, cfg, micro=64)
    split, m_split = _step(tiny_model, samples, cfg, micro=1)
    for (name, a), b in zip(whole.named_parameters(), split.parameters()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=name)
    assert m_whole["loss"] == pytest.approx(m_split["loss"], abs=1e-6)
    moved = any(not torch.equal(a, b) for a, b in zip(whole.parameters(), tiny_model.parameters()))
    assert moved


def test_old_log_probs_are_the_live_ones_before_the_first_update(tiny_model):
    """mini_batches > 1: old log-probs come from a no-grad forward of the same weights, so the
    first mini-batch sees rho = 1 exactly; the second, after an optimiser step, does not."""
    cfg = load_config(
        None,
        {
            "preset": "grpo",
            "rollout": {"group_size": 4, "prompts_per_step": 2},
            "algo": {"mini_batches": 2, "kl_coef": 0.0},
        },
    )
    model = copy.deepcopy(tiny_model)
    samples = _samples(groups=2)
    assign_advantages(samples, cfg)
    fill_log_probs(model, samples, cfg, 0, "cpu", "old_log_probs")
    first = samples[:4]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m_first = policy_update(model, first, cfg, opt, sched, 0, "cpu")
    assert m_first["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    m_second = policy_update(model, samples[4:], cfg, opt, sched, 0, "cpu")
    assert m_second["ratio_mean"] != pytest.approx(1.0, abs=1e-7)


def test_advantages_use_whole_groups():
    cfg = load_config(None, {"rollout": {"group_size": 4}})
    samples = _samples(G=4, groups=2)
    assign_advantages(samples, cfg)
    for k in range(2):
        r = torch.tensor([s.reward for s in samples[4 * k : 4 * k + 4]])
        want = (r - r.mean()) / (r.std() + 1e-6)
        got = torch.tensor([s.advantage for s in samples[4 * k : 4 * k + 4]])
        torch.testing.assert_close(got, want)
