"""PPO's critic on a real tiny Llama: where V_t is read, that padding and batch company change
nothing, that updates fit the returns, micro-batching, checkpoint state, LoRA and gradient
checkpointing."""

from __future__ import annotations

import io

import pytest
import torch
from torch.testing import assert_close

from rlvr.config.load import load_config
from rlvr.run.distributed import Dist
from rlvr.training.batch import Sample
from rlvr.training.critic import CriticTargets, critic_update, predict_values
from rlvr.training.policy import build_critic
from rlvr.training.settings import CriticContext

CPU = torch.device("cpu")


def _cfg(model_dir, **algo):
    overrides = {
        "model": {"name_or_path": str(model_dir)},
        "critic": {"lr": 3e-3, "value_clip": None},
        "algo": {"mini_batches": 1, **algo},
        "rollout": {"prompts_per_step": 4},
    }
    return load_config(overrides=overrides, preset="ppo")


def _samples(lengths=(3, 5, 1, 4), prompt_lengths=(4, 2, 3, 6)):
    g = torch.Generator().manual_seed(0)
    out = []
    for k, (n, p) in enumerate(zip(lengths, prompt_lengths)):
        ids = torch.randint(5, 60, (p + n,), generator=g).tolist()
        out.append(Sample(ids[:p], ids[p:], False, 1.0, True, k))
    return out


def _targets(samples, width, seed=1):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(len(samples), width)
    for i, s in enumerate(samples):
        mask[i, : len(s.completion_ids)] = 1
    returns = torch.randn(len(samples), width, generator=g) * mask
    return mask, returns


def test_values_position_padding_and_company(tiny_model_dir, tokenizer):
    cfg = _cfg(tiny_model_dir)
    critic = build_critic(cfg, CPU, Dist())
    samples = _samples()
    pad = tokenizer.pad_token_id
    together = predict_values(critic, samples, 6, CriticContext.from_config(cfg, pad, CPU, Dist()))
    assert together.shape == (4, 6)
    for i, s in enumerate(samples):
        alone = predict_values(
            critic, [s], len(s.completion_ids), CriticContext.from_config(cfg, pad, CPU, Dist())
        )
        assert_close(together[i, : len(s.completion_ids)], alone[0], atol=1e-5, rtol=0)
        assert (together[i, len(s.completion_ids) :] == 0).all()
        # V_t is the state before token t: V_0 is read at the prompt's last position, so it
        # equals the value of a one-token completion whatever that token is.
        other = Sample(s.prompt_ids, [7], False, 0.0, False, 0)
        assert_close(
            predict_values(critic, [other], 1, CriticContext.from_config(cfg, pad, CPU, Dist()))[
                0, 0
            ],
            alone[0, 0],
            atol=1e-5,
            rtol=0,
        )
    # The value head starts near zero (small weights, zero bias).
    assert together.abs().max() < 0.5


def _fit(cfg, samples, tokenizer, steps=1, critic=None):
    critic = critic or build_critic(cfg, CPU, Dist())
    width = max(len(s.completion_ids) for s in samples)
    mask, returns = _targets(samples, width)
    metrics = []
    for _ in range(steps):
        old = predict_values(
            critic,
            samples,
            width,
            CriticContext.from_config(cfg, tokenizer.pad_token_id, CPU, Dist()),
        )
        t = CriticTargets(old_values=old, returns=returns, mask=mask)
        metrics.append(
            critic_update(
                critic,
                samples,
                len(samples),
                t,
                CriticContext.from_config(cfg, tokenizer.pad_token_id, CPU, Dist()),
            )
        )
    return critic, metrics


def test_updates_fit_the_returns(tiny_model_dir, tokenizer):
    cfg = _cfg(tiny_model_dir)
    _, metrics = _fit(cfg, _samples(), tokenizer, steps=25)
    assert metrics[-1]["vf_loss"] < 0.3 * metrics[0]["vf_loss"]
    assert metrics[0]["optimizer_steps"] == 1
    assert all(m["vf_clipfrac"] == 0 for m in metrics)  # value_clip none


def test_value_clip_counts(tiny_model_dir, tokenizer):
    cfg = load_config(
        overrides={
            "model": {"name_or_path": str(tiny_model_dir)},
            "critic": {"lr": 0.05, "value_clip": 1e-4},
            "algo": {"mu": 3},
        },
        preset="ppo",
    )
    _, metrics = _fit(cfg, _samples(), tokenizer)
    assert metrics[0]["optimizer_steps"] == 6  # mu 3 x 2 mini-batches
    assert 0 < metrics[0]["vf_clipfrac"] <= 1


def _weights(critic):
    return {k: v.detach().clone() for k, v in critic.model.named_parameters()}


def _fit_grads(cfg, samples, tokenizer):
    """`_fit`, and the gradient each parameter received, summed over the micro-batches'
    backward passes (a hook per parameter: what the optimiser step was computed from)."""
    critic = build_critic(cfg, CPU, Dist())
    got = {}

    def keep(name):
        def hook(g):
            got[name] = got[name] + g if name in got else g.clone()

        return hook

    for name, p in critic.model.named_parameters():
        if p.requires_grad:
            p.register_hook(keep(name))
    return _fit(cfg, samples, tokenizer, critic=critic)[0], got


@pytest.mark.compares_runs
def test_micro_batching_and_checkpointing_give_the_same_update(tiny_model_dir, tokenizer):
    """The same gradients, within fp32 rounding of a re-ordered sum. The weights after the
    step are not compared: Adam's first step is lr * g / (|g| + eps), about lr * sign(g), so
    an element whose gradient is near eps moves by up to 2 lr on a rounding difference, which
    another CPU's kernels produce."""
    start = _weights(build_critic(_cfg(tiny_model_dir), CPU, Dist()))
    base, base_grads = _fit_grads(_cfg(tiny_model_dir), _samples(), tokenizer)
    assert base_grads.keys() == start.keys()
    assert any(not torch.equal(v, start[k]) for k, v in _weights(base).items())  # it trained
    variants = {
        "micro_batch_sequences=1": {"optim": {"micro_batch_sequences": 1}},
        "micro_batch_tokens=24": {"optim": {"micro_batch_tokens": 24}},
        "gradient_checkpointing": {"optim": {"gradient_checkpointing": True}},
    }
    for name, extra in variants.items():
        over = {
            "model": {"name_or_path": str(tiny_model_dir)},
            "critic": {"lr": 3e-3, "value_clip": None},
            "algo": {"mini_batches": 1},
            "rollout": {"prompts_per_step": 4},
            **extra,
        }
        _, grads = _fit_grads(load_config(overrides=over, preset="ppo"), _samples(), tokenizer)
        assert grads.keys() == base_grads.keys()
        for k, g in base_grads.items():
            assert_close(grads[k], g, atol=1e-7, rtol=1e-5, msg=f"{name}: {k}")


@pytest.mark.compares_runs
def test_state_round_trip(tiny_model_dir, tokenizer):
    cfg = _cfg(tiny_model_dir)
    critic, _ = _fit(cfg, _samples(), tokenizer, steps=2)
    buffer = (
        io.BytesIO()
    )  # through bytes, as a checkpoint does (no tensor shared with the live one)
    torch.save(critic.state(), buffer)
    buffer.seek(0)
    again = build_critic(cfg, CPU, Dist(), state=torch.load(buffer, weights_only=False))
    for k, v in _weights(critic).items():
        assert torch.equal(_weights(again)[k], v), k
    # The optimiser continues identically: one more step from each agrees exactly.
    a, _ = _fit(cfg, _samples(), tokenizer, critic=critic)
    b, _ = _fit(cfg, _samples(), tokenizer, critic=again)
    for k, v in _weights(a).items():
        assert torch.equal(_weights(b)[k], v), k


def test_lora_critic(tiny_model_dir, tokenizer):
    cfg = load_config(
        overrides={
            "model": {
                "name_or_path": str(tiny_model_dir),
                "lora_rank": 4,
                "lora_target_modules": "q_proj,v_proj",
            },
            "critic": {"lr": 1e-2, "value_clip": None},
            "algo": {"mini_batches": 1},
            "rollout": {"prompts_per_step": 4},
        },
        preset="ppo",
    )
    before = build_critic(cfg, CPU, Dist())
    trainable = {n for n, p in before.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("value_head") for n in trainable)
    start = _weights(before)
    critic, metrics = _fit(cfg, _samples(), tokenizer, steps=3, critic=before)
    after = _weights(critic)
    assert all(torch.equal(after[n], start[n]) for n in start if n not in trainable)
    assert any(not torch.equal(after[n], start[n]) for n in trainable if "lora_B" in n)
    assert set(critic.state()["weights"]) == trainable  # checkpoints hold adapters + head
    assert metrics[-1]["vf_loss"] < metrics[0]["vf_loss"]


def test_critic_model_path_must_have_a_backbone(tmp_path):
    from rlvr.config.schema import ConfigError

    cfg = load_config(overrides={"critic": {"model": str(tmp_path / "missing")}}, preset="ppo")
    with pytest.raises((ConfigError, FileNotFoundError)):
        build_critic(cfg, CPU, Dist())


def test_tool_tokens_get_no_advantage_no_value_target_and_gae_skips_them(tiny_model_dir, tokenizer):
    """PPO's targets come from the loss mask, which drops tool tokens: their advantages and
    critic targets are 0, the model's tokens get what GAE gives the row without the tool
    tokens, and returns at tool positions do not change the critic's update."""
    from rlvr.algos import gae
    from rlvr.config.algorithm import Algorithm
    from rlvr.training.batch import Batch
    from rlvr.training.ppo import token_advantages
    from rlvr.training.settings import UpdateSettings

    cfg = _cfg(tiny_model_dir, lam=0.9, gamma=0.95)
    tool = torch.tensor([False, False, True, True, True, False, False])
    ids = torch.randint(5, 60, (7,), generator=torch.Generator().manual_seed(3)).tolist()
    samples = [
        Sample([9, 10, 11], ids, False, 1.0, True, 0, tool_mask=tool),
        Sample([9, 12], ids[:4], False, 0.0, False, 1),
    ]
    values = torch.randn(2, 7, generator=torch.Generator().manual_seed(4))
    got = token_advantages(
        Batch(samples, 2),
        Algorithm.from_config(cfg),
        UpdateSettings.from_config(cfg),
        None,
        Dist(),
        values,
    )
    mask = got.critic_targets.mask
    assert mask[0].tolist() == [1, 1, 0, 0, 0, 1, 1] and mask[1].tolist() == [1] * 4 + [0] * 3
    assert torch.all(got.advantages[0, 2:5] == 0) and torch.all(
        got.critic_targets.returns[0, 2:5] == 0
    )
    own = ~tool  # the row without its tool tokens: the same GAE on the model's 4 tokens
    rewards = torch.zeros(1, 4)
    rewards[0, -1] = 1.0
    _, expect = gae(rewards, values[:1, own], torch.ones(1, 4), gamma=0.95, lam=0.9)
    assert_close(got.critic_targets.returns[0, own], expect[0])

    def update(returns):
        critic = build_critic(cfg, CPU, Dist())
        old = predict_values(
            critic, samples, 7, CriticContext.from_config(cfg, tokenizer.pad_token_id, CPU, Dist())
        )
        t = CriticTargets(old_values=old, returns=returns, mask=mask)
        critic_update(
            critic,
            samples,
            2,
            t,
            CriticContext.from_config(cfg, tokenizer.pad_token_id, CPU, Dist()),
        )
        return _weights(critic)

    noisy = got.critic_targets.returns.clone()
    noisy[0, 2:5] = 100.0  # what a tool token's target holds must not matter
    a, b = update(got.critic_targets.returns), update(noisy)
    assert all(torch.equal(a[k], b[k]) for k in a)
