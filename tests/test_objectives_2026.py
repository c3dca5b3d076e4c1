"""DPPO, GDPO and off-policy sequence masking in the trainer: a `python -m rlvr train` run of
each on a tiny model trains and logs its metrics (GDPO: per reward; the mask: under
staleness, where mu lags the live policy), and GDPO's advantages come from each sample's
reward terms by name."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.algos.advantages import gdpo_advantages
from rlvr.config.algorithm import Algorithm
from rlvr.config.load import load_config
from test_resume import _args, _run


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_gdpo_and_the_sequence_mask_train_under_staleness(tiny_model_dir, tmp_path):
    """Two rewards (accuracy and the test's digit_share), GDPO's advantage, token TIS at
    staleness 2 and every negative-advantage response with kl_i > 0 masked (threshold 0)."""
    run = tmp_path / "run"
    res = _run([
        *_args(tiny_model_dir, run, steps=3), "--algo.advantage=gdpo",
        "--train.max_staleness=2", "--algo.rollout_correction=token",
        "--algo.off_policy_mask_threshold=0",
    ])  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = _rows(run)
    assert len(rows) == 3
    for r in rows:
        assert {"gdpo/accuracy/abs_mean", "gdpo/digit_share/abs_mean"} <= set(r)
        assert 0.0 <= r["rollout/off_policy_masked_frac"] <= 1.0
    # step 1 trains on the initial weights' batch: mu differs from pi_theta by the engine's
    # rounding alone; later steps' batches are 1-2 versions old
    kl = [r["rollout/off_policy_seq_kl"] for r in rows]
    assert abs(kl[0]) < 1e-4 and max(kl[1:]) > 10 * abs(kl[0])
    assert any(r["rollout/off_policy_masked_frac"] > 0 for r in rows[1:])


@pytest.mark.slow
def test_dppo_preset_trains(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    args = [a if a != "grpo" else "dppo" for a in _args(tiny_model_dir, run, steps=2)]
    res = _run([*args, "--algo.mini_batches=2"])
    assert res.returncode == 0, res.stderr
    rows = _rows(run)
    assert all("dppo_masked_frac" in r for r in rows)
    assert rows[-1]["optimizer_steps"] == 2


def test_gdpo_reads_each_samples_terms(tiny_model_dir):
    from rlvr.training.update import advantages, gdpo_metrics
    from test_update import _batch, _samples

    cfg = load_config(None, {"preset": "grpo", "algo": {"advantage": "gdpo"},
                             "reward": {"format_weight": 0.5},
                             "rollout": {"group_size": 4, "prompts_per_step": 2}})  # fmt: skip
    algo = Algorithm.from_config(cfg)
    samples = _samples(groups=2)
    g = torch.Generator().manual_seed(0)
    acc = torch.randint(0, 2, (8,), generator=g).float()
    fmt = torch.randint(0, 2, (8,), generator=g).float()
    samples = [
        s.__class__(**{**s.__dict__, "reward": float(a + 0.5 * f),
                       "reward_terms": {"accuracy": float(a), "format": float(f)}})
        for s, a, f in zip(samples, acc, fmt)
    ]  # fmt: skip
    batch = _batch(samples, cfg)
    got = advantages(batch, algo, 4)
    want = gdpo_advantages(torch.stack([acc, fmt]), (1.0, 0.5), 4, batch.model_mask())
    torch.testing.assert_close(got, want)
    metrics = gdpo_metrics(batch, algo, 4)
    assert set(metrics) == {"gdpo/accuracy/abs_mean", "gdpo/format/abs_mean"}
    with pytest.raises(ValueError, match="no scores for reward terms"):
        bare = [s.__class__(**{**s.__dict__, "reward_terms": None}) for s in samples]
        advantages(_batch(bare, cfg), algo, 4)
