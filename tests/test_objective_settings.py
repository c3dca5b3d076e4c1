"""An objective declares its settings next to its function: its config keys, defaults, ranges
and refusals derive from the declaration (docs/algorithms.md#adding-an-objective). The one
from outside the package, `examples/weighted_objective.py`, trains one step from the command
line and from `rlvr.train` with its own setting, touching no file of `src/rlvr`."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import rlvr
from rlvr.algos import OBJECTIVES, LossSettings, register_objective, setting
from rlvr.algos.settings import SHARED, own_fields
from rlvr.config.algorithm import Algorithm
from rlvr.config.load import dump_yaml, load_config
from rlvr.config.schema import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SPEC = f"{ROOT / 'examples' / 'weighted_objective.py'}:weighted_reinforce"
TINY = {
    "train.max_steps": 1, "rollout.prompts_per_step": 2, "rollout.group_size": 4,
    "rollout.max_new_tokens": 12, "algo.overlong_cache": 4, "train.eval_size": 0,
    "train.threads": 1, "data.train_size": 16, "algo.dynamic_sampling": False,
    "algo.overlong_filter": False,
}  # fmt: skip


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_setting_reaches_the_loss_from_the_command_line(tmp_path):
    run = tmp_path / "run"
    args = [f"--{k}={v}" for k, v in TINY.items()]
    out = subprocess.run(
        [sys.executable, "-m", "rlvr", "train", *args, f"--algo.loss={SPEC}",
         "--algo.positive_weight=0.25", "--output-dir", str(run), "--no-progress"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    # a constant through the update's token-weighted mean of micro-batch metrics
    assert _metrics(run)[-1]["positive_weight"] == pytest.approx(0.25, rel=1e-12)
    assert "positive_weight: 0.25" in (run / "config.yaml").read_text()


def test_the_setting_reaches_the_loss_from_the_python_api(tmp_path):
    config = {**TINY, "algo.loss": SPEC, "algo.positive_weight": 0.5}
    result = rlvr.train(config=config, output_dir=tmp_path / "run", show_progress=False)
    assert result.metrics[-1]["positive_weight"] == pytest.approx(0.5, rel=1e-12)


def test_the_declared_default_and_range():
    cfg = load_config(None, {"algo": {"loss": SPEC}})
    settings = Algorithm.from_config(cfg).settings
    assert type(settings).__name__ == "WeightedSettings" and settings.positive_weight == 0.1
    assert "positive_weight: 0.1" in dump_yaml(cfg)  # not given: the declaration's default
    with pytest.raises(
        ConfigError, match=r"^algo\.positive_weight: got 2\.0, expected in \[0, 1\]"
    ):
        Algorithm.from_config(load_config(None, {"algo": {"loss": SPEC, "positive_weight": 2}}))
    with pytest.raises(ConfigError, match=r"algo\.positive_weight: got 'x', expected a number"):
        load_config(None, {"algo": {"loss": SPEC, "positive_weight": "x"}})


def test_another_objectives_setting_is_refused_away_from_its_default():
    load_config(None, {"algo": {"loss": SPEC}})  # registers weighted_reinforce
    with pytest.raises(ConfigError, match=r"^algo\.positive_weight: got 0\.5, expected 0\.1 "):
        load_config(None, {"preset": "sapo", "algo": {"positive_weight": 0.5}})
    load_config(None, {"preset": "sapo", "algo": {"positive_weight": 0.1}})  # a stored default


def test_a_stored_config_round_trips(tmp_path):
    cfg = load_config(None, {"preset": "sapo", "algo": {"tau_neg": 1.2}})
    path = tmp_path / "config.yaml"
    path.write_text(dump_yaml(cfg))
    again = load_config(path)
    assert again == cfg and Algorithm.from_config(again).settings.tau_neg == 1.2


def test_every_own_setting_is_declared_once_with_a_range_or_a_type():
    owners: dict[str, str] = {}
    for objective in OBJECTIVES.values():
        assert issubclass(objective.settings, LossSettings)
        for f in own_fields(objective.settings):
            assert owners.setdefault(f.name, objective.name) == objective.name or (
                OBJECTIVES[owners[f.name]].settings is objective.settings
            )
        assert set(objective.unused) <= SHARED


def test_registration_refuses_a_clash():
    @dataclass(frozen=True)
    class Taus(LossSettings):
        """tau_pos: the same name as SAPO's."""

        tau_pos: float = setting(1.0)

    with pytest.raises(ValueError, match=r"settings \['tau_pos'\] are sapo's"):
        register_objective("clash_taus", settings=Taus)(lambda inputs, settings: None)

    @dataclass(frozen=True)
    class Redeclared(LossSettings):
        """clip_low: another default for a shared setting."""

        clip_low: float = setting(0.3)

    with pytest.raises(ValueError, match=r"redeclares shared 'clip_low'"):
        register_objective("clash_shared", settings=Redeclared)(lambda inputs, settings: None)
    with pytest.raises(ValueError, match=r"unused \['tau_pos'\] are not shared settings"):
        register_objective("clash_unused", unused=("tau_pos",))(lambda inputs, settings: None)
    with pytest.raises(ValueError, match=r"objective 'clip' is already registered"):
        register_objective("clip")(lambda inputs, settings: None)
    assert not {"clash_taus", "clash_shared", "clash_unused"} & set(OBJECTIVES)


def test_an_unused_shared_setting_is_refused_by_name():
    algo = {"loss": "gmpo", "agg": "sample_mean", "log_ratio_clamp": 5}
    with pytest.raises(ConfigError, match=r"^algo\.log_ratio_clamp: got 5\.0, expected none under"):
        Algorithm.from_config(load_config(None, {"preset": "dapo", "algo": algo}))


def test_the_weighted_objective_scales_positive_advantages_only():
    """A = (+1, -1) on one token each, rho = 1: the clip loss is -(A' rho) averaged over the
    2 tokens, so lambda 0.1 gives -(0.1 - 1) / 2 = 0.45 and its gradient (-0.05, +0.5)."""
    load_config(None, {"algo": {"loss": SPEC}})
    objective = OBJECTIVES["weighted_reinforce"]
    from rlvr.algos import LossInputs

    logp = torch.zeros(2, 1, requires_grad=True)
    inputs = LossInputs(log_probs=logp, old_log_probs=torch.zeros(2, 1),
                        advantages=torch.tensor([1.0, -1.0]), response_mask=torch.ones(2, 1))  # fmt: skip
    out = objective.fn(inputs, objective.settings(positive_weight=0.1))
    assert out.loss.item() == pytest.approx(0.45, abs=1e-7)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert grad.flatten().tolist() == pytest.approx([-0.05, 0.5], abs=1e-7)
