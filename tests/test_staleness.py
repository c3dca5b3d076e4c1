"""Bounded staleness (train.max_staleness, rlvr.training.pipeline): the config's refusals, the
staleness check by hand, the batches ahead through the no-pickle trainer state, and on a
real tiny run that a batch sampled one version behind carries that version's log-probs,
which the rollout correction turns into weights != 1."""

import copy
from pathlib import Path

import pytest
import torch
from rich.console import Console

from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.rollout import Rollout
from rlvr.run.distributed import Dist
from rlvr.training.batch import Batch, Sample, rollout_log_probs
from rlvr.training.pipeline import Produced, StaleBatchError, check_staleness, staleness_metrics
from rlvr.training.trainer import consume, setup

DIGITS = f"{Path(__file__).parent / 'e2e_rewards.py'}:digit_share=1.0"  # varies within groups


def _cfg(tmp_path, model_dir=None, **train):
    over = {
        "train": {"output_dir": str(tmp_path / "run"), "eval_size": 0, "max_steps": 3, **train},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 12},
        "data": {"train_size": 16},
        "algo": {"rollout_correction": "token", "dynamic_sampling": False},
        "optim": {"lr": 1e-2},
        "reward": {"extra": [DIGITS]},
    }
    if model_dir is not None:
        over["model"] = {"name_or_path": str(model_dir)}
    return over


def test_staleness_without_correction_is_refused_by_name(tmp_path):
    over = _cfg(tmp_path, max_staleness=1)
    over["algo"] = {"rollout_correction": "none"}
    with pytest.raises(ConfigError, match=r"^train\.max_staleness: got 1, expected 0 unless"):
        load_config(None, over)
    hf = _cfg(tmp_path, max_staleness=1)  # the producer computes hf's behaviour log-probs
    hf["rollout"]["engine"] = "hf"
    assert load_config(None, hf).rollout.engine == "hf"
    hf["train"]["max_staleness"] = 0  # on-policy, hf has none to correct with
    with pytest.raises(ConfigError, match=r"^algo\.rollout_correction: .*rollout\.engine=hf"):
        load_config(None, hf)
    with pytest.raises(ConfigError, match=r"^train\.max_staleness: got -1, expected >= 0"):
        load_config(None, _cfg(tmp_path, max_staleness=-1))
    bypass = _cfg(tmp_path, max_staleness=2)
    bypass["algo"] = {"rollout_bypass": True}
    assert load_config(None, bypass).train.max_staleness == 2
    assert load_config(None, _cfg(tmp_path, max_staleness=1)).algo.rollout_correction == "token"


def _sample(version: int, n: int = 3) -> Sample:
    lp = torch.tensor([-0.5, -1.25, -2.0][:n])
    return Sample([1, 2], [3, 4, 5][:n], False, 1.0, True, 0, lp, None, version)


def test_check_staleness_by_hand():
    batch = Batch([_sample(3), _sample(2), _sample(1)], 1)
    assert check_staleness(batch, 3, 2) == [0, 1, 2]
    with pytest.raises(StaleBatchError, match=r"^train\.max_staleness: .* 2 versions behind"):
        check_staleness(batch, 3, 1)
    with pytest.raises(StaleBatchError):  # a sample from the future is a bug too
        check_staleness(batch, 0, 2)
    assert staleness_metrics([0, 1, 2], Dist()) == {"staleness/mean": 1.0, "staleness/max": 2.0}


def test_produced_batches_survive_a_weights_only_round_trip(tmp_path):
    samples = [_sample(4), _sample(4, n=2)]
    samples[1] = Sample([7], [8, 9], True, 0.0, False, 1, None, torch.tensor([False, True]), 4)
    produced = Produced(6, 4, Batch(samples, 2), {"reward/mean": 0.5}, [{"prompt": "p"}], 0.1)
    torch.save({"pipeline": [produced.state()]}, tmp_path / "state.pt")
    got = torch.load(tmp_path / "state.pt", weights_only=True)["pipeline"][0]
    back = Produced.from_state(got)
    assert (back.step, back.version, back.batch.num_groups) == (6, 4, 2)
    assert back.metrics == produced.metrics and back.examples == produced.examples
    for a, b in zip(back.batch.samples, samples):
        assert a.prompt_ids == b.prompt_ids and a.completion_ids == b.completion_ids
        assert (a.truncated, a.reward, a.correct, a.group, a.version) == (
            b.truncated, b.reward, b.correct, b.group, b.version,
        )  # fmt: skip
        for x, y in ((a.sampling_log_probs, b.sampling_log_probs), (a.tool_mask, b.tool_mask)):
            assert (x is None and y is None) or torch.equal(x, y)


@pytest.mark.slow  # a real run's setup and three rollouts: seconds on a busy CPU
def test_a_batch_one_version_behind_is_corrected_with_its_sampling_policy(tmp_path, tiny_model_dir):
    """Staleness 1 on a real tiny run: step 2 trains on a batch the initial weights sampled;
    its behaviour log-probs are those weights' (not the trainer's), its staleness is 1 and
    the importance weights pi_old / mu differ from 1."""
    cfg = load_config(None, _cfg(tmp_path, tiny_model_dir, max_staleness=1), preset="grpo")
    run, _ = setup(cfg, None, Console(quiet=True))
    pad = run.tokenizer.pad_token_id
    initial = copy.deepcopy(run.policy.model)
    first = run.pipeline.next(1, run)  # produces steps 1 and 2 from version 0
    assert [p.step for p in run.pipeline.queue] == [2]
    m1, _ = consume(first, run)
    assert (m1["staleness/max"], m1["rollout/is_weight_mean"]) == (0.0, pytest.approx(1.0))
    second = run.pipeline.next(2, run)  # produces step 3 from version 1
    assert second.version == 0 and all(s.version == 0 for s in second.batch.samples)
    assert [(p.step, p.version) for p in run.pipeline.queue] == [(3, 1)]
    s = second.batch.samples[0]
    one = Rollout([s.prompt_ids], torch.tensor([s.completion_ids]),
                  torch.tensor([len(s.completion_ids)]), torch.tensor([s.truncated]), 1)  # fmt: skip
    temp = cfg.rollout.temperature
    mu = rollout_log_probs(initial, one, pad, temp)[0]
    now = rollout_log_probs(run.policy.model, one, pad, temp)[0]
    assert torch.allclose(s.sampling_log_probs, mu, atol=1e-5)
    assert not torch.allclose(s.sampling_log_probs, now, atol=1e-4)  # the update moved it
    m2, _ = consume(second, run)
    assert m2["staleness/max"] == 1.0 and m2["staleness/mean"] == 1.0
    assert abs(m2["rollout/is_weight_mean"] - 1.0) > 1e-4
    assert m2["rollout/is_weight_max"] != pytest.approx(1.0)
