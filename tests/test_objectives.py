"""The objective registry and the Algorithm object: names and user "module:function" objectives
resolve in one place, each setting's range is checked once, a whole-mini-batch statistic gives
micro-batch-invariant gradients, and examples/custom_objective.py trains the default task from
the CLI and from `rlvr.train`, and resumes exactly."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rlvr
from conftest import update_context
from e2e_objectives import centred_pg, centred_stats
from rlvr.algos import policy_loss
from rlvr.algos.objectives import (
    OBJECTIVES,
    LossInputs,
    LossSettings,
    Objective,
    register_objective,
)
from rlvr.config.algorithm import Algorithm
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.training.update import batch_log_probs, policy_update
from same_run import Tolerance, assert_same_run, assert_same_weights
from test_update import _batch, _samples

ROOT = Path(__file__).resolve().parents[1]
USER = f"{ROOT / 'examples' / 'custom_objective.py'}:truncated_is_pg"


def _cfg(**algo):
    return load_config(None, {"preset": "dapo", "algo": algo})


def test_registry_refuses_a_second_registration():
    with pytest.raises(ValueError, match="'clip' is already registered"):
        register_objective("clip")(lambda inputs, settings: None)
    assert {"clip", "gspo"} <= set(OBJECTIVES)


def test_names_resolve_gspo_both_ways():
    assert Algorithm.from_config(_cfg()).objective.name == "clip"
    assert Algorithm.from_config(_cfg(loss="gspo")).objective.name == "gspo"
    assert Algorithm.from_config(_cfg(ratio="sequence")).objective.name == "gspo"


def test_gspo_objective_is_the_sequence_ratio_loss():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 4, generator=g)
    old = logp + 0.2 * torch.randn(3, 4, generator=g)
    adv = torch.randn(3, generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    inputs = LossInputs(log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask)
    got = OBJECTIVES["gspo"].fn(inputs, LossSettings(clip_low=0.1, clip_high=0.1))
    want = policy_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.1, ratio="sequence")
    assert torch.equal(got.loss, want.loss) and got.metrics == want.metrics


@pytest.mark.parametrize(
    ("algo", "match"),
    [
        ({"clip_low": 1.5}, r"^algo\.clip_low: got 1\.5, expected 0 <= clip_low <= 1$"),
        ({"clip_low": -0.1}, r"^algo\.clip_low: got -0\.1, expected 0 <= clip_low <= 1$"),
        ({"dual_clip": 0.5}, r"^algo\.dual_clip: got 0\.5, expected none or > 1"),
        ({"log_ratio_clamp": 0.0}, r"^algo\.log_ratio_clamp: got 0\.0, expected none or > 0$"),
        (
            {"loss": "nope"},
            r"^algo\.loss: got 'nope', expected one of \[.*'clip', 'clip_cov', 'dppo_kl', 'dppo_tv', 'gmpo', 'gspo'",
        ),
        ({"loss": "/no/such.py:f"}, r"^algo\.loss '/no/such\.py:f': no file"),
        ({"loss": f"{USER}x"}, r"has no 'truncated_is_pgx'; callables: .*truncated_is_pg"),
    ],
)
def test_one_error_line_naming_the_key(algo, match):
    with pytest.raises(ConfigError, match=match) as e:
        _cfg(**algo)
    assert "\n" not in str(e.value)


def test_clip_low_one_is_the_bound_zero_in_config_and_loss():
    """clip_low = 1 puts the lower bound at 0, which no ratio crosses: accepted by both."""
    assert _cfg(clip_low=1.0).algo.clip_low == 1.0
    z = torch.zeros(1, 2)
    policy_loss(z, z, torch.ones(1), torch.ones(1, 2, dtype=torch.bool), clip_low=1.0)


def test_what_a_step_needs():
    dapo = Algorithm.from_config(_cfg())
    assert not dapo.needs_old_log_probs and not dapo.needs_reference and not dapo.token_level
    assert Algorithm.from_config(_cfg(mu=2)).needs_old_log_probs
    ppo = Algorithm.from_config(load_config(None, {"preset": "ppo"}))
    assert ppo.token_level and ppo.uses_critic and ppo.kl_in_reward
    assert ppo.needs_old_log_probs and ppo.needs_reference and ppo.settings.kl_coef == 0.0
    grpo = Algorithm.from_config(load_config(None, {"preset": "grpo"}))
    assert grpo.needs_reference and grpo.settings.kl_coef == 0.04


# ------------------------------------------------------------ whole-mini-batch statistics


def _grads(model, samples, cfg, micro, algo):
    cfg = replace(cfg, optim=replace(cfg.optim, micro_batch_sequences=micro, max_grad_norm=0))
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    policy_update(
        _batch(samples, cfg), replace(update_context(cfg, model), algorithm=algo), opt, sched
    )
    return [b - p.detach() for b, p in zip(before, model.parameters())]


def test_batch_statistic_is_over_the_whole_mini_batch(tiny_model):
    """The centred objective's mean comes from `stats` summed over every micro-batch: one
    sequence per micro-batch gives the whole batch's gradient, and that gradient is the
    hand-built one of -(A - mean A) log pi over all loss tokens."""
    samples = _samples()
    cfg = load_config(None, {"preset": "dapo", "rollout": {"group_size": 4, "prompts_per_step": 3}})
    algo = replace(Algorithm.from_config(cfg), objective=Objective("c", centred_pg, centred_stats))
    whole = _grads(tiny_model, samples, cfg, 64, algo)
    split = _grads(tiny_model, samples, cfg, 1, algo)
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    # by hand: one forward of every response, the mean over the loss tokens (not truncated)
    batch = _batch(samples, cfg)
    model = copy.deepcopy(tiny_model).train()
    from rlvr.training.batch import collate, token_log_probs

    mb = collate(batch.samples, 0, "cpu")
    lp, _ = token_log_probs(model, mb, temperature=cfg.rollout.temperature)
    keep = torch.tensor([not s.truncated for s in batch.samples])[:, None]
    m = mb.response_mask.bool() & keep
    adv = batch.advantages[:, None].expand(m.shape)
    mean = adv[m].double().mean().float()
    loss = (-(adv - mean) * torch.where(m, lp, 0.0)).sum() / m.sum()
    loss.backward()
    for g, p in zip(whole, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=2e-6, rtol=1e-5)


CLIP_COV = {"loss": "clip_cov", "clip_cov_ratio": 0.2, "clip_cov_lb": -50.0, "clip_cov_ub": 50.0}
KL_COV = {"loss": "kl_cov", "clip_high": 0.2, "kl_cov_ratio": 0.2}
# the batch's old log-probs as pi_old (the samples have no engine log-probs for bypass);
# thresholds that drop tokens in the second pass
DPPO = {"rollout_bypass": False, "clip_low": 1e-4, "clip_high": 1e-4}
OPSM = {"off_policy_mask_threshold": 0.0}


@pytest.mark.parametrize(
    ("preset", "top", "extra"),
    [("cispo", 1.0, {}), ("sapo", 1.0, {}), ("gmpo", 1.0, {}), ("dapo", 0.2, {}),
     ("sapo", 0.3, {}), ("dapo", 1.0, CLIP_COV), ("dapo", 1.0, KL_COV), ("dppo", 1.0, DPPO),
     ("dppo", 1.0, {**DPPO, "loss": "dppo_kl", "clip_low": 1e-6, "clip_high": 1e-6}),
     ("dapo", 1.0, OPSM)],
)  # fmt: skip
def test_each_objective_gives_the_whole_batch_update_in_micro_batches(
    tiny_model, preset, top, extra
):
    """Two passes (mu = 2, so rho != 1 in the second) of one sequence per micro-batch move the
    weights as the whole batch does, for every registered objective's preset, with the
    top-entropy selection (a mini-batch statistic) on, and for Clip-Cov and KL-Cov (two
    stages of statistics; Clip-Cov's random choice), each selecting the same share."""
    samples = _samples(groups=2)
    cfg = load_config(
        None, {"preset": preset, "rollout": {"group_size": 4, "prompts_per_step": 2},
               "algo": {"mu": 2, "top_entropy_quantile": top, **extra}},
    )  # fmt: skip
    algo = Algorithm.from_config(cfg)
    batch = _batch(samples, cfg)
    old = batch_log_probs(tiny_model, batch, update_context(cfg, tiny_model))
    if extra.get("loss") == "kl_cov" or algo.objective.name.startswith("dppo"):
        # |log rho|'s gradient at rho = 1 is 0, so the sign of the float noise between a
        # batched and a one-row forward (~1e-7, machine-dependent) would decide it: start the
        # first pass off rho = 1 (and DPPO's divergence off 0, for its mask to act)
        g = torch.Generator().manual_seed(0)
        old = old + 0.05 * torch.randn(old.shape, generator=g, dtype=old.dtype)
    moved, metrics = [], []
    for micro in (64, 1):
        c = replace(cfg, optim=replace(cfg.optim, micro_batch_sequences=micro, max_grad_norm=0))
        model = copy.deepcopy(tiny_model)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        before = [p.detach().clone() for p in model.parameters()]
        m = policy_update(
            replace(batch, old_log_probs=old),
            replace(update_context(c, model), algorithm=algo),
            opt,
            sched,
        )
        moved.append([b - p.detach() for b, p in zip(before, model.parameters())])
        metrics.append(m)
    assert any(d.abs().max() > 0 for d in moved[0])
    a, b = metrics
    assert a["loss_tokens"] == b["loss_tokens"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    if top < 1:  # the kept share: at least q of the loss tokens, the same in both
        assert top <= a["top_entropy_kept_frac"] == pytest.approx(b["top_entropy_kept_frac"])
        assert a["top_entropy_kept_frac"] < 1
    if "off_policy_mask_threshold" in extra:  # the second pass masks some responses
        assert 0 < a["rollout/off_policy_masked_frac"] == b["rollout/off_policy_masked_frac"]
    elif algo.objective.name.startswith("dppo"):
        assert 0 < a["dppo_masked_frac"] == pytest.approx(b["dppo_masked_frac"])
    elif extra:  # k = floor(0.2 N) tokens of each mini-batch, in both splits
        k = int(0.2 * a["loss_tokens"] / 2)  # loss_tokens sums the two passes
        assert a["cov_frac"] == pytest.approx(k / (a["loss_tokens"] / 2))
        assert b["cov_frac"] == pytest.approx(a["cov_frac"])
    for a, b in zip(*moved):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)


# ------------------------------------------------------------ the user objective, end to end


def test_user_objective_is_loaded_and_its_metrics_reach_the_update(tiny_model):
    samples = _samples()
    cfg = load_config(
        None,
        {"preset": "dapo", "rollout": {"group_size": 4, "prompts_per_step": 3},
         "algo": {"loss": USER, "mu": 2}, "optim": {"max_grad_norm": 0}},
    )  # fmt: skip
    model = copy.deepcopy(tiny_model)
    batch = _batch(samples, cfg)
    batch = replace(batch, old_log_probs=batch_log_probs(model, batch, update_context(cfg, model)))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    metrics = policy_update(batch, update_context(cfg, model), opt, sched)
    assert 0.0 <= metrics["truncated_frac"] <= 1.0 and metrics["optimizer_steps"] == 2
    assert metrics["loss_tokens"] > 0


SMALL = [
    "--rollout.prompts_per_step=2", "--rollout.group_size=4", "--rollout.max_new_tokens=24",
    "--algo.overlong_cache=4", "--train.eval_size=4", "--train.threads=1", "--save-every=1",
    "--train.keep_checkpoints=5",
    "--no-progress", f"--algo.loss={USER}",
]  # fmt: skip


def _cli(*args):
    out = subprocess.run(
        [sys.executable, "-m", "rlvr", "train", *args], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]


def _math(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "tokens_per_s"}
            for r in rows]  # fmt: skip


def _weights(run: Path, step: int):
    return load_file(str(run / "checkpoints" / f"step-{step:06d}" / "model.safetensors"))


@pytest.mark.compares_runs
@pytest.mark.slow
def test_user_objective_trains_from_the_cli_and_resumes_exactly(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _cli(*SMALL, "--max-steps", "3", "--output-dir", str(straight))
    _cli(*SMALL, "--max-steps", "2", "--output-dir", str(resumed))
    # the objective is code the run imports: named again, as the run was started
    _cli("--resume", str(resumed), "--max-steps", "3", "--no-progress", f"--algo.loss={USER}")
    assert _math(straight) == _math(resumed)
    assert "truncated_frac" in _math(straight)[0]
    w1, w2 = _weights(straight, 3), _weights(resumed, 3)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    start = _weights(straight, 1)
    assert any(not torch.equal(start[k], w1[k]) for k in w1), "no update happened"


@pytest.mark.slow
def test_user_objective_trains_from_the_python_api_and_resumes(tmp_path):
    config = {
        "train.max_steps": 2, "rollout.prompts_per_step": 2, "rollout.group_size": 4,
        "rollout.max_new_tokens": 24, "algo.overlong_cache": 4, "train.eval_size": 4,
        "algo.loss": USER,
    }  # fmt: skip
    kwargs = dict(config=config, output_dir=tmp_path / "run", show_progress=False)
    first = rlvr.train(**kwargs)
    assert "truncated_frac" in first.metrics[-1]
    more = rlvr.train(**{**kwargs, "config": {**config, "train.max_steps": 3}},
                      resume_from_checkpoint=True)  # fmt: skip
    assert [m["step"] for m in more.metrics] == [1, 2, 3]
    assert f"loss: {USER}" in (first.run_dir / "config.yaml").read_text()


@pytest.mark.slow
def test_batch_statistic_spans_ranks(tiny_model_dir, tmp_path):
    """2 gloo ranks, each with half the groups, train as 1 process does: the objective's
    mean advantage is the whole mini-batch's on both (a rank's own mean differs from it)."""
    from test_distributed import ACCURACY, _run_group

    spec = f"{ROOT / 'tests' / 'e2e_objectives.py'}:centred_pg"
    runs = {}
    for nproc in (1, 2):
        run = tmp_path / f"n{nproc}"
        rc, err = _run_group([
            sys.executable, "-m", "rlvr", "train", "--preset", "dapo",
            f"--model.name_or_path={tiny_model_dir}", f"--reward.accuracy={ACCURACY}",
            f"--algo.loss={spec}", "--algo.dynamic_sampling=false",
            "--rollout.prompts_per_step=4", "--rollout.group_size=4",
            "--rollout.max_new_tokens=10", "--algo.overlong_cache=4",
            "--algo.overlong_filter=false", "--rollout.seed_per_prompt=true",
            "--train.eval_size=0", "--data.train_size=32", "--optim.lr=1e-3",
            "--optim.micro_batch_sequences=3", "--train.threads=1", "--max-steps", "2",
            "--output-dir", str(run), "--no-progress", "--nproc", str(nproc),
        ])  # fmt: skip
        assert rc == 0, err[-3000:]
        runs[nproc] = run
    m1, m2 = _math(runs[1]), _math(runs[2])
    adv = Tolerance(rel=1e-5, abs=1e-7, why="one mean over the same group-normalised advantages")
    assert_same_run(m1, m2, floats={"adv_mean": adv}, keys=["adv_mean"])
    assert_same_weights(_weights(runs[1], 2), _weights(runs[2], 2))
