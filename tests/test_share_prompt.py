"""optim.share_prompt: each distinct prompt forwarded once, its completions on its KV cache.
Same log-probs, entropies and gradients as the plain left-pad + right-pad forward."""

import copy
from dataclasses import replace

import pytest
import torch

from conftest import update_context
from rlvr.config.load import load_config
from rlvr.models import load_model
from rlvr.training.batch import (
    Sample,
    collate,
    collate_shared,
    shared_token_log_probs,
    token_log_probs,
)
from rlvr.training.micro import micro_loss as _micro_loss
from rlvr.training.update import _dummy, _micro_batches, batch_log_probs, policy_update
from test_update import _batch


def _samples(G=4, groups=3, seed=0, max_len=9):
    """Prompts of different lengths, completions of different lengths, some truncated."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(groups):
        n_prompt = 2 + 3 * k + int(torch.randint(0, 3, (1,), generator=g))
        prompt = torch.randint(5, 100, (n_prompt,), generator=g).tolist()
        for _ in range(G):
            n = int(torch.randint(1, max_len, (1,), generator=g))
            out.append(
                Sample(
                    prompt_ids=prompt,
                    completion_ids=torch.randint(5, 100, (n,), generator=g).tolist(),
                    truncated=bool(torch.rand(1, generator=g) < 0.3),
                    reward=float(torch.rand(1, generator=g)),
                    correct=False,
                    group=k,
                )
            )
    return out


@pytest.fixture(params=["llama", "qwen2"])
def model(request, tiny_model_dir, tiny_qwen2_dir):
    path = tiny_model_dir if request.param == "llama" else tiny_qwen2_dir
    return load_model(str(path)).train()


def _cfg(share, preset="dapo", micro=64, **algo):
    return load_config(
        None,
        {
            "preset": preset,
            "rollout": {"group_size": 4, "prompts_per_step": 3, "temperature": 0.7},
            "algo": algo,
            "optim": {"micro_batch_sequences": micro, "share_prompt": share, "max_grad_norm": 0},
        },
    )


@pytest.mark.compares_runs
@pytest.mark.parametrize("max_len", [9, 2])  # 2: completions of one token (no second pass)
def test_log_probs_and_entropy_match(model, max_len):
    samples = _samples(max_len=max_len)
    with torch.no_grad():
        plain = collate(samples, 0, "cpu")
        lp, ent = token_log_probs(model, plain, temperature=0.7, with_entropy=True)
        shared = collate_shared(samples, 0, "cpu")
        lp_s, ent_s = shared_token_log_probs(model, shared, temperature=0.7, with_entropy=True)
    assert shared.prompt_ids.shape[0] == 3  # each prompt once
    torch.testing.assert_close(shared.response_mask, plain.response_mask)
    m = plain.response_mask.bool()
    torch.testing.assert_close(lp_s[m], lp[m], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_s[m], ent[m], atol=1e-5, rtol=0)


def _grads(model, samples, cfg):
    model = copy.deepcopy(model)
    n_tok = float(sum(0 if s.truncated else len(s.completion_ids) for s in samples))
    n_seq = float(sum(not s.truncated for s in samples))
    r = _micro_loss(
        _batch(samples, cfg), update_context(cfg, model, num_tokens=n_tok, num_sequences=n_seq)
    )
    r.out.loss.backward()
    grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    return r.out.loss.detach(), grads, (r.loss_tokens, r.entropy_sum, r.generated_tokens)


@pytest.mark.compares_runs
@pytest.mark.parametrize("preset", ["grpo", "dapo"])  # dapo: truncated rows filtered
def test_policy_loss_gradients_match(model, preset):
    samples = _samples()
    loss, grads, stats = _grads(model, samples, _cfg(False, preset))
    loss_s, grads_s, stats_s = _grads(model, samples, _cfg(True, preset))
    torch.testing.assert_close(loss_s, loss, atol=1e-6, rtol=1e-5)
    assert grads.keys() == grads_s.keys() and len(grads) > 0
    for k in grads:
        torch.testing.assert_close(grads_s[k], grads[k], atol=1e-5, rtol=1e-5, msg=k)
    assert stats_s[0] == stats[0] and stats_s[2] == stats[2]
    assert stats_s[1] == pytest.approx(stats[1], abs=1e-4)
    # the gradient reaches the prompt pass too (every layer's weights, not only the head)
    assert any(v.abs().sum() > 0 for k, v in grads_s.items() if "layers.0." in k)


def _step(model, samples, cfg):
    model, samples = copy.deepcopy(model), _batch(samples, cfg)
    if cfg.algo.kl_coef > 0:
        samples = replace(
            samples, ref_log_probs=batch_log_probs(model, samples, update_context(cfg, model))
        )
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # new params = old - grad
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    metrics = policy_update(samples, update_context(cfg, model), opt, sched)
    return model, metrics


@pytest.mark.compares_runs
@pytest.mark.parametrize(
    "preset,micro,algo",
    [("grpo", 64, {"kl_coef": 0.04}), ("dapo", 64, {}), ("dapo", 3, {}), ("grpo", 6, {"mu": 2})],
)
def test_policy_update_same_parameters(model, preset, micro, algo):
    samples = _samples()
    off, m_off = _step(model, samples, _cfg(False, preset, micro, **algo))
    on, m_on = _step(model, samples, _cfg(True, preset, micro, **algo))
    for (name, a), b in zip(off.named_parameters(), on.parameters()):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=name)
    assert m_on["loss"] == pytest.approx(m_off["loss"], abs=1e-5)
    assert m_on["loss_tokens"] == m_off["loss_tokens"]
    moved = any(not torch.equal(a, b) for a, b in zip(on.parameters(), model.parameters()))
    assert moved


@pytest.mark.compares_runs
def test_batch_log_probs_match(model):
    batch = _batch(_samples(), _cfg(False))
    plain = batch_log_probs(model, batch, update_context(_cfg(False, micro=5), model, 0, "cpu"))
    shared = batch_log_probs(model, batch, update_context(_cfg(True, micro=5), model, 0, "cpu"))
    assert plain.shape == (len(batch), batch.width)
    for i, s in enumerate(batch.samples):  # zeros past each response's length
        assert (plain[i, len(s.completion_ids) :] == 0).all()
        assert (plain[i, : len(s.completion_ids)] < 0).all()
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)


def test_dummy_micro_batch_has_no_loss(model):
    model = copy.deepcopy(model)
    r = _micro_loss(_dummy(0), update_context(_cfg(True), model, num_tokens=1.0, num_sequences=1.0))
    r.out.loss.backward()
    loss = r.out.loss.detach()
    grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert r.loss_tokens == 0 and r.generated_tokens == 0 and float(loss) == 0.0
    assert all(float(g.abs().sum()) == 0 for g in grads.values())


@pytest.mark.parametrize("size", [1, 3, 4, 5, 8, 64])
def test_shared_micro_batches_keep_prompts_together(size):
    samples = _samples(G=4, groups=5)
    micros = _micro_batches(samples, size, share_prompt=True)
    assert sorted(i for m in micros for i in m) == list(range(len(samples)))
    assert all(1 <= len(m) <= size for m in micros)
    # a prompt is split only when its group is larger than a micro-batch
    homes = {}
    for i, m in enumerate(micros):
        for row in m:
            homes.setdefault(samples[row].group, set()).add(i)
    if size < 4:
        assert all(len(h) == -(-4 // size) for h in homes.values())
    else:
        assert all(len(h) == 1 for h in homes.values())
        assert len(micros) == -(-5 // (size // 4))  # packed: whole groups per micro-batch
