"""`critic.arch=surprise`: the features (hand-computed and against a plain loop), the value
model starting as the plain head, micro-batching, the readout learning, the config check and
a run through `rlvr train` whose checkpoint carries the readout."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from rlvr.algos import surprise_features
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.run.distributed import Dist
from rlvr.training.batch import Sample
from rlvr.training.critic import CriticTargets, critic_update, predict_values
from rlvr.training.policy import build_critic
from rlvr.training.settings import CriticContext

CPU = torch.device("cpu")


def test_features_by_hand():
    lp = torch.tensor([[-0.1, -2.0, -0.5, -30.0, 9.9]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    f = surprise_features(lp, mask)
    # t = 0 sees nothing; t = 1 sees -0.1; t = 2 sees -0.1, -2.0; t = 3 adds -0.5; t = 4 adds
    # -30 floored at -10 (the padding at t = 4 itself is never seen)
    assert_close(f[0, :, 0], torch.tensor([0.0, -0.1, -2.0, -2.0, -10.0]))
    assert_close(f[0, :, 1], torch.tensor([0.0, -0.1, -1.05, -2.6 / 3, -12.6 / 4]))


def _loop(lp: list[float], mask: list[int], floor: float = -10.0) -> list[tuple[float, float]]:
    out, seen = [], []
    for t in range(len(lp)):
        out.append((min(seen), sum(seen) / len(seen)) if seen else (0.0, 0.0))
        if mask[t]:
            seen.append(max(lp[t], floor))
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-40, 0, allow_nan=False), st.booleans()), min_size=1, max_size=12),
    st.integers(1, 3),
)
def test_features_match_a_plain_loop(tokens, rows):
    lp = torch.tensor([[x for x, _ in tokens]] * rows, dtype=torch.float64)
    mask = torch.tensor([[m for _, m in tokens]] * rows)
    mask[0] = 0 if rows > 1 else mask[0]  # a row with no valid token: all (0, 0)
    f = surprise_features(lp, mask)
    for r in range(rows):
        want = torch.tensor(_loop(lp[r].tolist(), mask[r].tolist()), dtype=torch.float32)
        assert_close(f[r], want, atol=1e-5, rtol=1e-5)


def _cfg(model_dir, arch="surprise", **optim):
    overrides = {
        "model": {"name_or_path": str(model_dir)},
        "critic": {"lr": 3e-2, "value_clip": None, "arch": arch},
        "algo": {"mini_batches": 1},
        "optim": optim,
    }
    return load_config(overrides=overrides, preset="ppo")


def _samples():
    g = torch.Generator().manual_seed(0)
    out = []
    for k, (n, p) in enumerate([(3, 4), (5, 2), (1, 3), (4, 6)]):
        ids = torch.randint(5, 60, (p + n,), generator=g).tolist()
        out.append(Sample(ids[:p], ids[p:], False, 1.0, True, k))
    return out


def _features(width=5, seed=2):
    lp = -torch.rand(4, width, generator=torch.Generator().manual_seed(seed)) * 4
    return surprise_features(lp, torch.ones(4, width))


def test_starts_as_the_plain_head_and_its_readout_learns(tiny_model_dir, tokenizer):
    pad, samples, feats = tokenizer.pad_token_id, _samples(), _features()
    head = build_critic(_cfg(tiny_model_dir, "head"), CPU, Dist())
    cfg = _cfg(tiny_model_dir)
    critic = build_critic(cfg, CPU, Dist())
    v0 = predict_values(critic, samples, 5, CriticContext.from_config(cfg, pad, CPU, Dist()), feats)
    assert_close(
        v0, predict_values(head, samples, 5, CriticContext.from_config(cfg, pad, CPU, Dist()))
    )  # a = 0, b = 0
    with pytest.raises(RuntimeError, match="surprise_features"):
        predict_values(critic, samples, 5, CriticContext.from_config(cfg, pad, CPU, Dist()))
    mask = torch.zeros(4, 5)
    for i, s in enumerate(samples):
        mask[i, : len(s.completion_ids)] = 1
    returns = (1.0 + feats[..., 0]) * mask  # a target the features carry
    for _ in range(3):
        old = predict_values(
            critic, samples, 5, CriticContext.from_config(cfg, pad, CPU, Dist()), feats
        )
        t = CriticTargets(old_values=old, returns=returns, mask=mask, features=feats)
        critic_update(critic, samples, 4, t, CriticContext.from_config(cfg, pad, CPU, Dist()))
    assert critic.model.surprise.weight.abs().sum() > 0  # the readout moved off zero
    assert "surprise.weight" in critic.state()["weights"]


def test_micro_batches_cut_the_features_by_row(tiny_model_dir, tokenizer):
    pad, samples, feats = tokenizer.pad_token_id, _samples(), _features()
    whole = _cfg(tiny_model_dir)
    one = _cfg(tiny_model_dir, micro_batch_sequences=1)
    critic = build_critic(whole, CPU, Dist())
    with torch.no_grad():
        critic.model.surprise.weight.copy_(torch.tensor([[0.3, -0.2]]))
    assert_close(
        predict_values(
            critic, samples, 5, CriticContext.from_config(whole, pad, CPU, Dist()), feats
        ),
        predict_values(critic, samples, 5, CriticContext.from_config(one, pad, CPU, Dist()), feats),
        atol=1e-6,
        rtol=0,
    )
    # each row's values use that row's features: changing row 2's moves only row 2
    other = feats.clone()
    other[2] -= 1.0
    a = predict_values(
        critic, samples, 5, CriticContext.from_config(whole, pad, CPU, Dist()), feats
    )
    b = predict_values(
        critic, samples, 5, CriticContext.from_config(whole, pad, CPU, Dist()), other
    )
    assert torch.equal(a[[0, 1, 3]], b[[0, 1, 3]]) and not torch.equal(a[2], b[2])


def test_surprise_needs_the_reference():
    with pytest.raises(ConfigError, match=r"critic\.arch"):
        load_config(overrides={"critic": {"arch": "surprise"}, "algo": {"kl_coef": 0.0}},
                    preset="ppo")  # fmt: skip


def test_a_ppo_run_trains_the_readout(tiny_model_dir, tmp_path):
    from rlvr.cli.main import main

    run = tmp_path / "run"
    args = ["train", "--preset", "ppo", f"--model.name_or_path={tiny_model_dir}",
            "--critic.arch=surprise", "--critic.lr=1e-2", "--rollout.prompts_per_step=8",
            "--rollout.max_new_tokens=8", "--train.eval_size=0", "--data.train_size=32",
            "--train.threads=1", "--max-steps", "2", "--output-dir", str(run), "--no-progress"]  # fmt: skip
    assert main(args) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("critic/explained_variance" in r for r in rows)
    state = torch.load(run / "checkpoints" / "step-000002" / "trainer_state.pt",
                       weights_only=False)  # fmt: skip
    weight = state["critic"]["weights"]["surprise.weight"]
    assert weight.shape == (1, 2) and weight.abs().sum() > 0
