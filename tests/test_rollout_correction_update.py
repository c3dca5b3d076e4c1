"""Rollout correction in the update: the engine's log-probs as mu, through every objective;
micro-batching unchanged; an identical engine changes nothing; a different one weights by
exp(log pi_old - log mu); bypass mode; the config's one-line errors."""

import copy
import math
import re
from dataclasses import replace

import pytest
import torch

from conftest import update_context
from rlvr.config.algorithm import Algorithm
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.rollout import FastEngine, SamplingParams
from rlvr.training.batch import Batch, Sample, rollout_log_probs
from rlvr.training.update import advantages, policy_update

G, GROUPS = 4, 2


def _cfg(algo=None, micro=64, preset="grpo"):
    over = {
        "preset": preset,
        "rollout": {"group_size": G, "prompts_per_step": GROUPS},
        "algo": {"kl_coef": 0.0, **(algo or {})},
        "optim": {"micro_batch_sequences": micro, "max_grad_norm": 0},
    }
    return load_config(None, over)


def _sampled(engine_model, seed=0):
    """A batch sampled by the fast engine on `engine_model`, with its sampling log-probs."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 100, (5,), generator=g).tolist() for _ in range(GROUPS)]
    eos = [3]
    r = FastEngine(engine_model, pad_id=0, eos_ids=eos).generate(
        prompts, SamplingParams(n=G, max_new_tokens=8, seed=seed)
    )
    samples = [
        Sample(
            prompt_ids=r.prompt_ids[i],
            completion_ids=r.completion_ids[i, : int(n)].tolist(),
            truncated=bool(r.truncated[i]),
            reward=float(torch.rand(1, generator=g)),
            correct=False,
            group=i // G,
            sampling_log_probs=r.sampling_log_probs[i, : int(n)],
        )
        for i, n in enumerate(r.lengths)
    ]
    return samples, r


def _update(model, samples, cfg):
    model = copy.deepcopy(model)
    batch = Batch.from_groups([samples[i : i + G] for i in range(0, len(samples), G)])
    batch = replace(
        batch, advantages=advantages(batch, Algorithm.from_config(cfg), cfg.rollout.group_size)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # new params = old - grad
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    metrics = policy_update(batch, update_context(cfg, model), opt, sched)
    return model, metrics


def _moved(a, b) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def _other_policy(model, scale=0.05):
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return other


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_identical_engine_changes_the_update_by_rounding_only(tiny_model, level):
    samples, _ = _sampled(tiny_model)
    plain, _ = _update(tiny_model, samples, _cfg())
    fixed, m = _update(tiny_model, samples, _cfg({"rollout_correction": level}))
    assert _moved(plain, tiny_model) > 1e-3  # the update itself is not small
    assert _moved(plain, fixed) < 1e-6
    assert m["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["rollout/is_ess"] == pytest.approx(1.0, abs=1e-9)
    assert m["rollout/is_truncated_frac"] == 0.0 and m["rollout/is_masked_frac"] == 0.0


def test_a_different_sampling_policy_gives_the_formula_s_weights(tiny_model):
    engine = _other_policy(tiny_model)
    samples, r = _sampled(engine)
    trainer = rollout_log_probs(tiny_model, r, pad_id=0)
    mask = r.response_mask.bool()
    w = torch.exp(trainer - r.sampling_log_probs)[mask].double()  # pi_old / mu per token
    cfg = _cfg({"rollout_correction": "token", "rollout_is_cap": None})
    fixed, m = _update(tiny_model, samples, cfg)
    assert abs(float(w.mean()) - 1.0) > 0.01  # the policies do differ
    assert m["rollout/is_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-5)
    assert m["rollout/is_weight_max"] == pytest.approx(float(w.max()), rel=1e-5)
    ess = float(w.sum() ** 2 / (len(w) * (w * w).sum()))
    assert m["rollout/is_ess"] == pytest.approx(ess, rel=1e-5)
    plain, _ = _update(tiny_model, samples, _cfg())
    assert _moved(plain, fixed) > 1e-4  # and the weights change the update


@pytest.mark.parametrize("loss", ["clip", "gspo", "cispo"])
@pytest.mark.parametrize(
    "algo",
    [
        {"rollout_correction": "token", "rollout_is_cap": 1.2},
        {
            "rollout_correction": "sequence",
            "rollout_is_cap": None,
            "rollout_mask_low": 0.95,
            "rollout_mask_high": 1.05,
        },
    ],
    ids=["token_tis", "sequence_mask"],
)
def test_micro_batching_gives_the_whole_batch_update(tiny_model, loss, algo):
    samples, _ = _sampled(_other_policy(tiny_model))
    algo = {**algo, "loss": loss}
    whole, m_whole = _update(tiny_model, samples, _cfg(algo, micro=64, preset="dapo"))
    split, m_split = _update(tiny_model, samples, _cfg(algo, micro=3, preset="dapo"))
    for (name, a), b in zip(whole.named_parameters(), split.parameters()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=name)
    keys = [k for k in m_whole if k.startswith("rollout/is_")]
    assert len(keys) == 5
    assert {k: m_whole[k] for k in keys} == pytest.approx({k: m_split[k] for k in keys}, rel=1e-5)
    assert m_whole["rollout/is_truncated_frac"] + m_whole["rollout/is_masked_frac"] > 0


def test_bypass_takes_the_engine_s_log_probs_as_pi_old(tiny_model):
    engine = _other_policy(tiny_model)
    samples, r = _sampled(engine)
    trainer = rollout_log_probs(tiny_model, r, pad_id=0)
    rho = torch.exp(trainer - r.sampling_log_probs)[r.response_mask.bool()].double()
    _, m = _update(tiny_model, samples, _cfg({"rollout_bypass": True}))
    assert m["ratio_mean"] == pytest.approx(float(rho.mean()), rel=1e-5)  # pi_theta / mu
    assert m["rollout/logprob_diff_mean"] > 1e-3  # still measured, against the live policy
    several = Algorithm.from_config(_cfg({"rollout_bypass": True, "mu": 2}))
    assert several.several_updates and not several.needs_old_log_probs
    assert Algorithm.from_config(_cfg({"mu": 2})).needs_old_log_probs


def test_correction_off_adds_no_weights_and_no_metrics(tiny_model):
    samples, _ = _sampled(tiny_model)
    assert Algorithm.from_config(_cfg()).correction is None
    _, m = _update(tiny_model, samples, _cfg())
    assert not any(k.startswith("rollout/is_") for k in m)


@pytest.mark.parametrize(
    "over, message",
    [
        (
            {"algo": {"rollout_correction": "token"}, "rollout": {"engine": "hf"}},
            "algo.rollout_correction: got 'token', expected none with rollout.engine=hf",
        ),
        (
            {"algo": {"rollout_bypass": True}, "rollout": {"engine": "hf"}},
            "algo.rollout_bypass: got True, expected false with rollout.engine=hf",
        ),
        (
            {"algo": {"rollout_bypass": True, "rollout_correction": "sequence"}},
            "algo.rollout_correction: got 'sequence', expected none under algo.rollout_bypass",
        ),
        (
            {"algo": {"rollout_mask_high": 2.0}},
            "algo.rollout_mask_high: got 2.0, expected none unless algo.rollout_correction",
        ),
        ({"algo": {"rollout_is_cap": 0.0}}, "algo.rollout_is_cap: got 0.0, expected none or > 0"),
        (
            {
                "algo": {
                    "rollout_correction": "token",
                    "rollout_mask_low": 2.0,
                    "rollout_mask_high": 1.0,
                }
            },
            "algo.rollout_mask_high: got 1.0, expected >= mask_low",
        ),
    ],
)
def test_config_errors_name_the_key(over, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)) as e:
        load_config(None, {"preset": "grpo", **over})
    assert "\n" not in str(e.value)


def test_an_engine_without_log_probs_is_refused_by_name(tiny_model):
    samples, _ = _sampled(tiny_model)
    samples = [replace(s, sampling_log_probs=None) for s in samples]
    with pytest.raises(ValueError, match=r"^algo\.rollout_correction: the engine reported no"):
        _update(tiny_model, samples, _cfg({"rollout_correction": "token"}))
    assert math.isfinite(_update(tiny_model, samples, _cfg())[1]["loss"])
