"""Token-budget micro-batches (optim.micro_batch_tokens) and micro-batches without padding
(optim.pad_free): how samples are cut, what each micro-batch computes, and the same update as
today's padded micro-batches (loss, metrics and the weights an SGD step of lr 1 moves, i.e.
the gradient) for every built-in objective, with tool tokens, with LoRA and on 2 ranks."""

import copy
import logging
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlvr.training.micro_batches as mbs
from conftest import update_context
from rlvr.algos.objectives import builtin_objectives
from rlvr.config.load import load_config
from rlvr.training.batch import Sample, collate, token_log_probs
from rlvr.training.micro_batches import by_sequences, by_tokens, micro_batches, positions
from rlvr.training.pad_free import collate_flat, flat_token_log_probs
from rlvr.training.update import batch_log_probs, policy_update
from test_share_prompt import _samples
from test_update import _batch


def _s(p: int, c: int, prompt_token: int = 5, group: int = 0) -> Sample:
    return Sample([prompt_token] * p, [7] * c, False, 0.0, False, group)


# ------------------------------------------------------------ the cut, by hand


def test_positions_by_hand():
    a, b = _s(3, 2), _s(5, 6, prompt_token=6)
    # padded: 2 rows x (5 + 6); real 3 + 2 + 5 + 6 = 16
    assert positions([a, b], "padded") == (22, 16)
    assert positions([a, b], "pad_free") == (16, 16)
    # shared, two distinct prompts: 2 x 5 prompt positions + 2 x 6 completion positions
    assert positions([a, b], "shared") == (22, 16)
    same = [_s(4, 1), _s(4, 3)]  # one prompt, forwarded once: 1 x 4 + 2 x 3; real 4 + 4
    assert positions(same, "shared") == (10, 8)
    assert positions([Sample.placeholder(0)], "padded") == (0, 0)


def test_by_tokens_by_hand():
    """Totals 10, 10, 12, 30, 31, 100 at budget 64 (a micro-batch weighs 64 / 32 = 2
    positions): [10, 10] (20 + 2 beats 10 + 2 + 10 + 2); [12] alone (with the two 10s it is
    3 x 12 = 36 + 2, apart 20 + 2 + 12 + 2 = 36); [30, 31] (2 x 31 + 2 = 64 beats 30 + 2 + 31
    + 2 = 65); [100] over the budget, alone."""
    samples = [_s(1, 29), _s(1, 9), _s(1, 99), _s(1, 11), _s(1, 9), _s(1, 30)]
    assert mbs.overhead(64) == 2
    assert by_tokens(samples, 64) == [[1, 4], [3], [0, 5], [2]]
    # without padding the positions are the sums: 10 + 10 + 12 + 30 = 62 fits, so the fewest
    # micro-batches win: three, the last the 100 alone
    pad_free = by_tokens(samples, 64, "pad_free")
    assert len(pad_free) == 3 and pad_free[-1] == [2]


def test_over_budget_sample_is_alone_and_said_once(caplog, monkeypatch):
    monkeypatch.setattr(mbs, "_said_over_budget", False)
    with caplog.at_level(logging.WARNING, logger=mbs.__name__):
        assert by_tokens([_s(1, 30), _s(1, 40), _s(1, 2), _s(1, 2)], 10) == [[2, 3], [0], [1]]
        by_tokens([_s(1, 30)], 10)
    said = [r for r in caplog.records if "micro_batch_tokens=10" in r.getMessage()]
    assert len(said) == 1


def test_by_sequences_is_the_default_cut():
    samples = _samples()
    assert micro_batches(samples, 5) == by_sequences(samples, 5)
    assert micro_batches(samples, 5, 0, "shared") == by_sequences(samples, 5, True)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 200)), min_size=1, max_size=40),
    budget=st.integers(1, 600),
    layout=st.sampled_from(["padded", "pad_free", "shared"]),
    prompts=st.integers(1, 4),
)
def test_by_tokens_partitions_within_the_budget(lengths, budget, layout, prompts):
    """Every row once; a micro-batch over the budget holds one sample (longer than it)."""
    samples = [_s(p, c, prompt_token=k % prompts) for k, (p, c) in enumerate(lengths)]
    micros = by_tokens(samples, budget, layout)
    assert sorted(i for m in micros for i in m) == list(range(len(samples)))
    for m in micros:
        computed, real = positions([samples[i] for i in m], layout)
        assert computed >= real
        if computed > budget:
            assert len(m) == 1


# ------------------------------------------------------------ the pad-free forward


@pytest.mark.parametrize("backend", ["sdpa", "native"])
def test_pad_free_log_probs_match_padded(tiny_model, backend):
    """Same log-probs, entropies and gradients as the padded forward, through SDPA and
    through the CPU backend's native attention kernel (fp32 reassociation: 1e-5)."""
    import rlvr.cpu as cpu

    samples = _samples()
    model = copy.deepcopy(tiny_model).train()
    padded = collate(samples, 0, "cpu")
    lp, ent = token_log_probs(model, padded, temperature=0.7, with_entropy=True)
    (lp * padded.response_mask).sum().backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    gate = cpu.backend(model) if backend == "native" else cpu.OFF
    flat = collate_flat(samples, 0, "cpu")
    with gate.training_ops(model):
        lp_f, ent_f = flat_token_log_probs(model, flat, temperature=0.7, with_entropy=True)
        lp_f.sum().backward()
    m = padded.response_mask.bool()
    torch.testing.assert_close(flat.response_mask, padded.response_mask)
    torch.testing.assert_close(lp_f[m], lp[m], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_f[m], ent[m], atol=1e-5, rtol=0)
    assert (lp_f[~flat.place] == 0).all()
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[k], atol=1e-5, rtol=1e-5, msg=k)
    assert model.config._attn_implementation == "sdpa"  # switched back after the block


def test_flat_row_by_hand():
    a, b = Sample([1, 2], [3], False, 0.0, False, 0), Sample([4], [5, 6], False, 0.0, False, 0)
    mb = collate_flat([a, b], 0, "cpu")
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert mb.cu_seqlens.tolist() == [0, 3, 6] and mb.max_length == 3
    # position 1 (token 2) scores 3; position 3 (token 4) scores 5, position 4 scores 6
    assert mb.scored.tolist() == [1, 3, 4] and mb.targets.tolist() == [[3, 5, 6]]
    assert mb.place.tolist() == [[True, False], [True, True]]


# ------------------------------------------------------------ the same update

EXTRA = {
    "clip_cov": {"clip_cov_ratio": 0.2, "clip_cov_lb": -50.0, "clip_cov_ub": 50.0},
    "kl_cov": {"clip_high": 0.2, "kl_cov_ratio": 0.2},
}
# (micro_batch_sequences, micro_batch_tokens, share_prompt, pad_free): today's padded cut
# first, the others compared with it; 30 positions split the 12 samples into several
WAYS = {
    "padded": (64, 0, False, False),
    "tokens": (64, 30, False, False),
    "tokens+shared": (64, 30, True, False),
    "tokens+pad_free": (64, 30, False, True),
    "pad_free": (5, 0, False, True),
}


PRESET = {"cispo": "cispo", "sapo": "sapo", "gmpo": "gmpo"}  # their own settings


def _cfg(loss: str = "clip", **algo):
    return load_config(
        None,
        {
            "preset": PRESET.get(loss, "dapo"),
            "rollout": {"group_size": 4, "prompts_per_step": 3, "temperature": 0.7},
            "algo": {"loss": loss, "mu": 2, **EXTRA.get(loss, {}), **algo},
        },
    )


def _update(model, batch, cfg, way):
    seqs, tokens, share, pad_free = WAYS[way]
    optim = dict(micro_batch_sequences=seqs, micro_batch_tokens=tokens, share_prompt=share)
    optim.update(pad_free=pad_free, max_grad_norm=0)
    cfg = replace(cfg, optim=replace(cfg.optim, **optim))
    model = copy.deepcopy(model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
    metrics = policy_update(batch, update_context(cfg, model), opt, sched)
    moved = {k: before[k] - p.detach() for k, p in model.named_parameters() if k in before}
    return moved, metrics


def _assert_same_updates(model, batch, cfg):
    """Every way of `WAYS` moves the weights as the padded one: fp32 sums reassociated over
    different micro-batches, 2e-6 absolute and 1e-5 relative (as tests/test_objectives.py)."""
    want, m0 = _update(model, batch, cfg, "padded")
    assert any(d.abs().max() > 0 for d in want.values())
    for way in list(WAYS)[1:]:
        got, m = _update(model, batch, cfg, way)
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=2e-6, rtol=1e-5, msg=f"{way} {k}")
        assert m["loss_tokens"] == m0["loss_tokens"], way
        assert m["loss"] == pytest.approx(m0["loss"], abs=1e-6), way
        assert m["entropy"] == pytest.approx(m0["entropy"], abs=1e-5), way
        if way.endswith("pad_free"):
            assert m["train/padding_frac"] == 0.0
    return m0


def _with_old(model, samples, cfg):
    """The batch with old log-probs off rho = 1 (noise 0.05: KL-Cov's |log rho| has no
    gradient sign at rho = 1 to agree on)."""
    batch = _batch(samples, cfg)
    old = batch_log_probs(model, batch, update_context(cfg, model))
    g = torch.Generator().manual_seed(0)
    return replace(batch, old_log_probs=old + 0.05 * torch.randn(old.shape, generator=g))


@pytest.mark.parametrize("loss", [o.name for o in builtin_objectives()])
def test_every_objective_same_update(tiny_model, loss):
    cfg = _cfg(loss)
    _assert_same_updates(tiny_model, _with_old(tiny_model, _samples(), cfg), cfg)


def test_same_update_with_tool_tokens(tiny_model):
    """Tool tokens (context, no loss) are masked the same way in every layout."""
    samples = [
        replace(s, tool_mask=torch.tensor([k % 3 == 1 for k in range(len(s.completion_ids))]))
        if i % 2
        else s
        for i, s in enumerate(_samples())
    ]
    cfg = _cfg()
    _assert_same_updates(tiny_model, _with_old(tiny_model, samples, cfg), cfg)


def test_same_update_with_lora(tiny_model_dir):
    pytest.importorskip("peft")
    from rlvr.training.policy import load_policy

    cfg = load_config(
        None,
        {
            "preset": "dapo",
            "rollout": {"group_size": 4, "prompts_per_step": 3, "temperature": 0.7},
            "model": {"name_or_path": str(tiny_model_dir), "lora_rank": 4},
            # one pass: SGD at lr 1 moves the adapters by up to 0.5, and a second pass from
            # there would compare the first's rounding amplified (~1e-4)
            "algo": {"mu": 1},
        },
    )
    model = load_policy(cfg, None, torch.device("cpu")).model
    g = torch.Generator().manual_seed(1)
    for name, p in model.named_parameters():  # B starts at 0: make A's gradient non-zero
        if "lora_B" in name:
            p.data.copy_(0.5 * torch.randn(p.shape, generator=g))
    _assert_same_updates(model, _with_old(model, _samples(), cfg), cfg)


def test_padding_frac_by_hand(tiny_model):
    """Two micro-batches by sequences (sorted by total length): positions computed over the
    samples' own tokens."""
    samples = [_s(2, 1, group=0), _s(2, 3, group=0), _s(2, 2, group=1), _s(2, 5, group=1)]
    cfg = load_config(None, {"preset": "dapo", "rollout": {"group_size": 2, "prompts_per_step": 2}})
    cfg = replace(cfg, optim=replace(cfg.optim, micro_batch_sequences=2, share_prompt=False))
    model = copy.deepcopy(tiny_model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    m = policy_update(_batch(samples, cfg), update_context(cfg, model), opt, sched)
    # totals 3, 5, 4, 7: [3, 4] -> 2 x (2 + 2) = 8, [5, 7] -> 2 x (2 + 5) = 14; real 19 of 22
    assert m["train/padding_frac"] == pytest.approx(1 - 19 / 22)


def test_memory_guard_follows_the_token_budget():
    """With a token budget a micro-batch's activations are the budget's, or the longest
    sample's (prompt + max_new_tokens) when that is longer, whatever the rows."""
    from rlvr.run.memory import Shape, Work, predict

    shape = Shape(layers=4, hidden=64, intermediate=256, kv=32, vocab=100, params=10**6,
                  trainable=10**6)  # fmt: skip
    one_row = predict(shape, Work(rows=64, micro_rows=1, prompt=0, response=4096))
    budget = predict(shape, Work(rows=64, micro_rows=64, prompt=47, response=2001,
                                 micro_tokens=4096))  # fmt: skip
    assert budget["activations"] == one_row["activations"]
    longest = predict(shape, Work(rows=64, micro_rows=64, prompt=47, response=2001,
                                  micro_tokens=512))  # fmt: skip
    alone = predict(shape, Work(rows=64, micro_rows=1, prompt=0, response=2048))
    assert longest["activations"] == alone["activations"]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_by_tokens_match_one_padded(tiny_model_dir, tmp_path, parallel):
    """2 gloo ranks with token budgets and no padding (each rank cuts its own half into its
    own number of micro-batches; under FSDP2 the counts are made equal) train as one rank
    with today's padded micro-batches of 3 sequences: metrics and weights after 2 steps
    within the suite's fp32 tolerances (tests/same_run.py)."""
    import json

    from safetensors.torch import load_file

    from same_run import assert_same_run, assert_same_weights
    from test_distributed import _train

    one = _train(tiny_model_dir, tmp_path / "one", 1, "token_mean", steps=2)
    extra = ("--optim.micro_batch_tokens=40", "--optim.pad_free=true")
    two = _train(tiny_model_dir, tmp_path / "two", 2, "token_mean", parallel, 2, extra=extra)
    m1 = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert_same_run(m1, m2, keys=("loss", "entropy", "loss_tokens", "reward/mean"))
    assert all(r["train/padding_frac"] == 0.0 for r in m2)
    assert all(r["train/padding_frac"] > 0.0 for r in m1)
    w1 = load_file(str(one / "checkpoints" / "step-000002" / "model.safetensors"))
    w2 = load_file(str(two / "checkpoints" / "step-000002" / "model.safetensors"))
    assert_same_weights(w1, w2)
