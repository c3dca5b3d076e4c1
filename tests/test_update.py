"""The update step: micro-batching must not change the gradient; old log-probs are exact."""

import copy
import math
from dataclasses import replace

import pytest
import torch

from conftest import update_context
from rlvr.config.algorithm import Algorithm
from rlvr.config.load import load_config
from rlvr.training.batch import Batch, Sample
from rlvr.training.update import advantages, batch_log_probs, policy_update


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


def _batch(samples, cfg) -> Batch:
    """One rank holding every group (consecutive runs of G samples), with its advantages."""
    G = cfg.rollout.group_size
    batch = Batch.from_groups([samples[i : i + G] for i in range(0, len(samples), G)])
    return replace(
        batch, advantages=advantages(batch, Algorithm.from_config(cfg), cfg.rollout.group_size)
    )


def _step(model, samples, cfg, micro):
    cfg = load_config(None, {**cfg, "optim": {"micro_batch_sequences": micro, "max_grad_norm": 0}})
    model = copy.deepcopy(model)
    samples = _batch(samples, cfg)
    if cfg.algo.kl_coef > 0:
        samples = replace(
            samples, ref_log_probs=batch_log_probs(model, samples, update_context(cfg, model))
        )
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # new params = old - grad: compare grads
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    metrics = policy_update(samples, update_context(cfg, model), opt, sched)
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
    full = _batch(_samples(groups=2), cfg)
    full = replace(full, old_log_probs=batch_log_probs(model, full, update_context(cfg, model)))

    def group(k):  # one group, alone in its own batch
        part = Batch.from_groups([full.samples[4 * k : 4 * k + 4]])
        rows = full.rows(range(4 * k, 4 * k + 4))
        return replace(part, advantages=rows.advantages, old_log_probs=rows.old_log_probs)

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m_first = policy_update(group(0), update_context(cfg, model), opt, sched)
    assert m_first["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    m_second = policy_update(group(1), update_context(cfg, model), opt, sched)
    assert m_second["ratio_mean"] != pytest.approx(1.0, abs=1e-7)


def test_advantages_use_whole_groups():
    cfg = load_config(None, {"rollout": {"group_size": 4}})
    samples = _samples(G=4, groups=2)
    adv = _batch(samples, cfg).advantages
    for k in range(2):
        r = torch.tensor([s.reward for s in samples[4 * k : 4 * k + 4]])
        want = (r - r.mean()) / (r.std() + 1e-6)
        torch.testing.assert_close(adv[4 * k : 4 * k + 4], want)


def test_logprob_diff_is_engine_minus_trainer_over_generated_tokens(tiny_model):
    """rollout/logprob_diff_*: |engine log-prob - trainer log-prob| over the generated tokens
    (truncated ones included), against the policy that sampled; absent without engine ones."""
    cfg = load_config(
        None,
        {
            "preset": "dapo",  # overlong filtering: truncated rows leave the loss, not this
            "rollout": {"group_size": 4, "prompts_per_step": 2},
            "algo": {"dynamic_sampling": False},
        },
    )
    model = copy.deepcopy(tiny_model)
    batch = _batch(_samples(groups=2), cfg)
    trainer = batch_log_probs(model, batch, update_context(cfg, model))
    offset = torch.arange(len(batch), dtype=torch.float32) * 0.01
    lengths = torch.tensor([len(s.completion_ids) for s in batch.samples])
    samples = [
        replace(s, sampling_log_probs=trainer[i, : lengths[i]] - offset[i])
        for i, s in enumerate(batch.samples)
    ]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m = policy_update(replace(batch, samples=samples), update_context(cfg, model), opt, sched)
    want = float((offset * lengths).sum() / lengths.sum())
    assert m["rollout/logprob_diff_mean"] == pytest.approx(want, abs=1e-5)
    assert m["rollout/logprob_diff_max"] == pytest.approx(float(offset.max()), abs=1e-5)
    # KL(engine || trainer) by k3 on the engine's tokens: x = trainer - engine = offset_i on
    # every token of row i, k3 = e^x - x - 1, a token-weighted mean
    k3 = sum((math.exp(o) - o - 1) * n for o, n in zip(offset.tolist(), lengths.tolist())) / float(
        lengths.sum()
    )
    assert k3 > 1e-5
    assert m["rollout/mismatch_kl_k3"] == pytest.approx(k3, rel=1e-3)
    assert any(s.truncated for s in samples)  # they count too
    m = policy_update(batch, update_context(cfg, model), opt, sched)
    assert not any(k.startswith("rollout/logprob_diff") for k in m)


def test_a_rank_without_rows_in_a_mini_batch_counts_nothing():
    """Under 2 ranks a mini-batch can leave one rank no rows: its loss counts are 0 (the empty
    truncation list must stay a bool tensor for overlong filtering)."""
    from rlvr.training.micro import loss_counts as _loss_counts

    cfg = load_config(None, {"algo": {"overlong_filter": True}})
    assert _loss_counts([], cfg.algo.overlong_filter) == [0.0, 0.0]
