"""The objective contract (rlvr.algos.objectives.registry): rollout correction's weights and the
off-policy mask act on every objective exactly once. examples/custom_objective.py (written from
the public `LossInputs` fields, it never reads `rollout_weights`) and
examples/weighted_objective.py (it hands its inputs on to `clip`) lose the masked responses'
policy terms as `clip` does, and take rollout correction's weights once, never twice; an
objective that declares it cannot take them is refused beside them in one line."""

from __future__ import annotations

import copy
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from conftest import update_context
from rlvr.algos import off_policy_mask as opm
from rlvr.algos import rollout_correction as rc
from rlvr.algos.objectives import OBJECTIVES, LossInputs, Objective, register_objective
from rlvr.cli.main import main
from rlvr.config.algorithm import Algorithm
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.training.update import batch_log_probs, policy_update
from test_update import _batch, _samples

ROOT = Path(__file__).resolve().parents[1]
CUSTOM = f"{ROOT / 'examples' / 'custom_objective.py'}:truncated_is_pg"
WEIGHTED = f"{ROOT / 'examples' / 'weighted_objective.py'}:weighted_reinforce"
LOSSES = {"clip": "clip", "custom": CUSTOM, "weighted": WEIGHTED}
THRESHOLD = 1e-12  # masks every negative-advantage response sampled off the live policy


def _algorithm(loss: str, **algo) -> Algorithm:
    return Algorithm.from_config(
        load_config(None, {"preset": "dapo", "algo": {"loss": loss, **algo}})
    )


def _inputs() -> LossInputs:
    """6 ragged responses. The engine's log-probs mu sit a constant d_i above the live ones
    (kl_i = d_i): rows 0 and 4 (A < 0, d > 0) are masked, row 2 (A > 0) is kept with its d > 0,
    row 3 (d < 0) is kept. pi_old is off the live policy, so clip's bounds act."""
    g = torch.Generator().manual_seed(0)
    lengths = [3, 5, 2, 4, 3, 5]
    mask = torch.tensor([[t < n for t in range(5)] for n in lengths])
    logp = -torch.rand(6, 5, generator=g) - 0.1
    old = logp + 0.3 * torch.randn(6, 5, generator=g)
    d = torch.tensor([0.3, 0.0, 0.3, -0.1, 0.2, 0.0])
    return LossInputs(
        log_probs=logp.requires_grad_(), old_log_probs=old,
        advantages=torch.tensor([-1.0, -0.5, 0.8, 1.2, -0.7, -0.3]), response_mask=mask,
        behaviour_log_probs=logp.detach() + d[:, None], num_tokens=float(mask.sum()),
        num_sequences=6.0, norm_constant=5.0,
    )  # fmt: skip


def _row(inputs: LossInputs, i: int) -> LossInputs:
    """Response i alone, with the step's global counts and no rollout weights."""
    cut = {
        f.name: getattr(inputs, f.name)[i : i + 1]
        for f in fields(inputs)
        if isinstance(getattr(inputs, f.name), torch.Tensor) and f.name != "rollout_weights"
    }
    return replace(inputs, **cut, rollout_weights=None)


def _per_row(algorithm: Algorithm, inputs: LossInputs) -> torch.Tensor:
    """Each response's term of the loss (the objectives divide by the global counts, so the
    terms add up to the batch's loss)."""
    return torch.stack([algorithm.loss(_row(inputs, i)).loss.detach() for i in range(6)])


def _row_weights(weights: torch.Tensor) -> torch.Tensor:
    """The weight of each response (constant over its tokens: sequence-level)."""
    return weights[:, 0]


# float32 sums of 22 terms of size <= 1 in another order
TOL = {"atol": 1e-6, "rtol": 1e-5}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_the_mask_drops_the_masked_responses_policy_terms_as_it_does_clips(name):
    algorithm = _algorithm(LOSSES[name], off_policy_mask_threshold=THRESHOLD)
    inputs = _inputs()
    masked, sums = opm.with_sequence_mask(inputs, algorithm.sequence_mask)
    assert sums["opsm/masked"] == 2.0  # rows 0 and 4, the same rows for every objective
    keep = _row_weights(masked.rollout_weights)
    assert keep.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    terms = _per_row(algorithm, inputs)
    off, on = algorithm.loss(inputs).loss, algorithm.loss(masked).loss
    assert terms[[0, 4]].abs().min() > 1e-3  # the masked rows had something to lose
    torch.testing.assert_close(off, terms.sum(), **TOL)
    torch.testing.assert_close(on, off - terms[[0, 4]].sum(), **TOL)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_rollout_correction_and_the_mask_act_once_never_twice(name):
    """Sequence-level weights W_i = exp(sum_t log pi_old - log mu) (not 0 or 1, so twice
    differs from once) times the mask: the loss is sum_i W_i keep_i term_i, not W_i^2."""
    algorithm = _algorithm(
        LOSSES[name], off_policy_mask_threshold=THRESHOLD, rollout_correction="sequence"
    )
    inputs, _ = rc.with_rollout_weights(_inputs(), algorithm.correction)
    inputs, _ = opm.with_sequence_mask(inputs, algorithm.sequence_mask)
    w = _row_weights(inputs.rollout_weights)
    assert ((w > 0) & ((w - 1).abs() > 0.2)).sum() >= 2
    terms = _per_row(algorithm, inputs)
    got = algorithm.loss(inputs).loss.detach()
    torch.testing.assert_close(got, (w * terms).sum(), **TOL)
    assert (got - (w * w * terms).sum()).abs() > 1e-3


def test_the_weighted_objective_gets_them_once_through_clip():
    """W-REINFORCE hands its inputs to `clip`, which applies weights it is given: with
    positive_weight 1 it is `clip`, weights and all, to the bit."""
    kw = {"off_policy_mask_threshold": THRESHOLD, "rollout_correction": "token"}
    weighted = _algorithm(WEIGHTED, positive_weight=1.0, **kw)
    clip = _algorithm("clip", **kw)
    inputs, _ = rc.with_rollout_weights(_inputs(), clip.correction)
    inputs, _ = opm.with_sequence_mask(inputs, clip.sequence_mask)
    a, b = weighted.loss(inputs).loss, clip.loss(inputs).loss
    torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)  # -rho (w A) against w (-rho A)


def test_a_public_fields_objective_gets_the_mask_it_would_have_skipped():
    """examples/custom_objective.py never reads `rollout_weights`: called under a declaration
    that it applies them itself ("own"), the mask leaves its loss as it was, bit for bit;
    under the default declaration its loss loses the masked rows."""
    fn = _algorithm(CUSTOM).objective.fn
    inputs = _inputs()
    masked, _ = opm.with_sequence_mask(inputs, THRESHOLD)
    s = _algorithm(CUSTOM).settings
    skipped = Objective("skips", fn, rollout_weights="own")
    assert torch.equal(skipped(masked, s).loss, skipped(inputs, s).loss)
    assert not torch.equal(Objective("gets", fn)(masked, s).loss, fn(inputs, s).loss)


def test_the_user_objective_gets_the_mask_in_the_update(tiny_model):
    """Through the update (mu = 2: the second pass is off pi_old, so kl_i != 0): with the mask
    on, some responses are masked and the public-fields objective's loss moves with them."""
    cfg = {"rollout": {"group_size": 4, "prompts_per_step": 3}, "optim": {"max_grad_norm": 0}}
    losses, masked = [], []
    for threshold in (None, 0.0):
        c = load_config(None, {"preset": "dapo", **cfg, "algo": {
            "loss": CUSTOM, "mu": 2, "off_policy_mask_threshold": threshold}})  # fmt: skip
        model = copy.deepcopy(tiny_model)
        batch = _batch(_samples(), c)
        old = batch_log_probs(model, batch, update_context(c, model))
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        m = policy_update(replace(batch, old_log_probs=old), update_context(c, model), opt, sched)
        losses.append(m["loss"])
        masked.append(m.get("rollout/off_policy_masked_frac"))
    assert masked[0] is None and 0 < masked[1] < 1
    assert abs(losses[0] - losses[1]) > 1e-6


# ------------------------------------------------------------ declaring it cannot take them

REFUSING = """
import torch
from rlvr.algos import LossOutput, aggregate


def plain_pg(inputs, settings):
    mask = inputs.response_mask.bool()
    adv = inputs.advantages
    adv = adv[:, None].expand(mask.shape) if adv.dim() == 1 else adv
    per_token = -torch.where(mask, adv * inputs.log_probs, 0.0)
    loss = aggregate(per_token, mask, settings.agg, num_tokens=inputs.num_tokens,
                     num_sequences=inputs.num_sequences, norm_constant=inputs.norm_constant)
    return LossOutput(loss=loss, metrics={"num_tokens": float(mask.sum())})


plain_pg.rollout_weights = "refused"
"""


@pytest.fixture()
def refusing(tmp_path) -> str:
    path = tmp_path / "refusing.py"
    path.write_text(REFUSING)
    return f"{path}:plain_pg"


@pytest.mark.parametrize(
    ("algo", "key", "value"),
    [({"off_policy_mask_threshold": THRESHOLD}, "off_policy_mask_threshold", "1e-12"),
     ({"rollout_correction": "token"}, "rollout_correction", "'token'")],
)  # fmt: skip
def test_an_objective_that_cannot_take_them_is_refused_in_one_line(refusing, algo, key, value):
    with pytest.raises(ConfigError) as e:
        load_config(None, {"preset": "dapo", "algo": {"loss": refusing, **algo}})
    msg = str(e.value)
    assert msg.startswith(f"algo.{key}: got {value}, expected none with algo.loss={refusing} ")
    assert "rollout_weights='refused'" in msg and "\n" not in msg
    assert _algorithm(refusing).objective.rollout_weights == "refused"  # alone it is accepted


def test_the_refusal_comes_before_anything_starts(refusing, tmp_path, capsys):
    argv = ["train", f"--algo.loss={refusing}", f"--algo.off_policy_mask_threshold={THRESHOLD}",
            "--output-dir", str(tmp_path / "run"), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert "algo.off_policy_mask_threshold: got 1e-12, expected none with algo.loss=" in line
    assert not (tmp_path / "run").exists()


def test_a_registered_objective_declares_it_at_registration():
    def pg(inputs, settings):
        raise AssertionError("not called")

    try:
        register_objective("refusing_pg", rollout_weights="refused")(pg)
        assert OBJECTIVES["refusing_pg"].rollout_weights == "refused"
        with pytest.raises(ConfigError, match=r"^algo\.rollout_correction: got 'sequence'"):
            _algorithm("refusing_pg", rollout_correction="sequence")
    finally:
        OBJECTIVES.pop("refusing_pg", None)
    with pytest.raises(ValueError, match=r"rollout_weights: got 'twice', expected one of"):
        register_objective("twice_pg", rollout_weights="twice")(pg)
    assert "twice_pg" not in OBJECTIVES
    assert {o.rollout_weights for o in OBJECTIVES.values() if o.name in {"clip", "sapo"}} == {"own"}


def test_every_builtin_registers_where_it_is_defined_whatever_is_imported_first():
    """Each built-in module registers its own objectives; importing one of them first, in a
    fresh interpreter (the package then loads while it is half-imported), registers them all,
    each in its own module."""
    for first in ("rlvr.algos.sapo",):
        code = (
            f"import {first}\n"
            "from rlvr.algos.objectives import builtin_objectives\n"
            "print(sorted((o.name, o.fn.__module__) for o in builtin_objectives()))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        got = dict(eval(out.stdout))
        assert got == {
            "cispo": "rlvr.algos.cispo", "clip": "rlvr.algos.losses",
            "clip_cov": "rlvr.algos.cov", "dppo_kl": "rlvr.algos.dppo",
            "dppo_tv": "rlvr.algos.dppo", "gmpo": "rlvr.algos.gmpo",
            "gspo": "rlvr.algos.losses", "kl_cov": "rlvr.algos.cov",
            "sapo": "rlvr.algos.sapo",
        }, first  # fmt: skip


def test_weighted_advantages_by_hand():
    """A = (2, -1) per response, w = ((0.5, 1, 9), (0, 2, 7)), the last token masked:
    A' = ((1, 2, 0), (0, -2, 0)) and no weights left to apply."""
    from rlvr.algos.objectives.toolkit import weighted_advantages

    mask = torch.tensor([[True, True, False], [True, True, False]])
    inputs = LossInputs(
        log_probs=torch.zeros(2, 3), old_log_probs=torch.zeros(2, 3),
        advantages=torch.tensor([2.0, -1.0]), response_mask=mask,
        rollout_weights=torch.tensor([[0.5, 1.0, 9.0], [0.0, 2.0, float("nan")]]),
    )  # fmt: skip
    out = weighted_advantages(inputs)
    assert out.advantages.tolist() == [[1.0, 2.0, 0.0], [0.0, -2.0, 0.0]]
    assert out.rollout_weights is None
    assert weighted_advantages(out) is out
    with pytest.raises(ValueError, match="'refusing' declares it cannot take rollout weights"):
        Objective("refusing", lambda i, s: None, rollout_weights="refused")(inputs, None)


def test_a_bare_function_declares_it_as_an_attribute(tmp_path):
    path = tmp_path / "twice.py"
    path.write_text(REFUSING.replace('"refused"', '"twice"'))
    with pytest.raises(ConfigError, match=r"^algo\.loss: objective .*rollout_weights: got 'twice'"):
        load_config(None, {"algo": {"loss": f"{path}:plain_pg"}})
