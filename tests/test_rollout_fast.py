"""The fast engine against the plain Hugging Face path (`hf` engine) and the trainer's log-probs."""

import pytest
import torch

from rlvr.models import build_tokenizer
from rlvr.rollout import ENGINES, FastEngine, HFEngine, SamplingParams
from rlvr.rollout.fast import filter_logits
from rlvr.training.batch import Sample, collate, token_log_probs

TEXTS = ["What is 2+3?", "hi", "Compute 17*3, then add 4.", "abc", "hi"]  # "hi" twice


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(scaled_tiny_model):
    return scaled_tiny_model


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(s) for s in TEXTS]


@pytest.fixture(scope="module")
def eos_ids(model, tok, prompts) -> list[int]:
    """An EOS id that greedy decoding emits at different steps in different rows and not at
    all in others (so rows finish at different steps, and some are truncated)."""
    out = HFEngine(model, pad_id=tok.pad_token_id, eos_ids=[10_000]).generate(
        prompts, SamplingParams(n=1, max_new_tokens=16, greedy=True)
    )
    rows = out.completion_ids.tolist()
    for c in rows[0][2:]:
        firsts = {row.index(c) if c in row else None for row in rows}
        if None in firsts and len(firsts) >= 3:
            return [c]
    raise AssertionError("no suitable EOS id in the greedy output")


GREEDY = SamplingParams(n=3, max_new_tokens=16, greedy=True)


@pytest.fixture(scope="module")
def hf_greedy(model, tok, prompts, eos_ids):
    """The plain Hugging Face path (`model.generate`), greedy."""
    return HFEngine(model, pad_id=tok.pad_token_id, eos_ids=eos_ids).generate(prompts, GREEDY)


def check_semantics(r, eos_ids, pad_id, max_new_tokens):
    """Lengths include EOS, padding after it, truncated iff no EOS within the cap."""
    eos = torch.tensor(eos_ids)
    B, T = r.completion_ids.shape
    assert r.sampling_log_probs.shape == (B, T) and r.sampling_log_probs.dtype == torch.float32
    for i in range(B):
        row, n = r.completion_ids[i], int(r.lengths[i])
        assert not torch.isin(row[: n - 1], eos).any()
        if r.truncated[i]:
            assert n == max_new_tokens == T and not torch.isin(row[n - 1], eos)
        else:
            assert torch.isin(row[n - 1], eos)
        assert (row[n:] == pad_id).all()
        assert (r.sampling_log_probs[i, n:] == 0).all() and (r.sampling_log_probs[i, :n] < 0).all()


def test_registered():
    assert ENGINES["fast"] is FastEngine


@pytest.mark.parametrize(
    "fast_kwargs",
    [
        {},
        {"retire_fraction": None},
        {"retire_fraction": 0.0},
        {"cache": "dynamic"},
        {"pack_weights": False},
        {"prefix_attention": False},
    ],
    ids=["default", "never-retire", "retire-each-step", "dynamic-cache", "unpacked", "no-prefix"],
)
def test_greedy_same_tokens_as_hf(model, tok, prompts, eos_ids, hf_greedy, fast_kwargs):
    fast = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=eos_ids, **fast_kwargs)
    a, b = hf_greedy, fast.generate(prompts, GREEDY)
    assert a.truncated.any() and not a.truncated.all()  # rows finish at different steps
    assert len(set(a.lengths.tolist())) > 2
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.lengths, b.lengths) and torch.equal(a.truncated, b.truncated)
    assert b.prompt_ids == a.prompt_ids and b.group_size == 3
    check_semantics(b, eos_ids, tok.pad_token_id, 16)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize(
    "filters", [dict(top_k=30, top_p=0.95), dict()], ids=["filtered", "plain-native-sampler"]
)
def test_sampling_log_probs_match_trainer(model, tok, prompts, eos_ids, temperature, filters):
    fast = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=[*eos_ids, tok.eos_token_id])
    # rows that end and rows cut at the limit, in one batch: the first seed that draws both
    # (which one does depends on the CPU's rounding of the logits)
    for seed in range(3, 43):
        params = SamplingParams(
            n=4, max_new_tokens=20, temperature=temperature, seed=seed, **filters
        )
        r = fast.generate(prompts, params)
        if r.truncated.any() and not r.truncated.all():
            break
    else:
        pytest.fail("no seed of 40 drew both finished and truncated rows")
    samples = [
        Sample(
            prompt_ids=p,
            completion_ids=r.completion_ids[i, : r.lengths[i]].tolist(),
            truncated=bool(r.truncated[i]),
            reward=0.0,
            correct=False,
            group=i // 4,
        )
        for i, p in enumerate(r.prompt_ids)
    ]
    mb = collate(samples, tok.pad_token_id, "cpu")
    with torch.no_grad():
        trainer, _ = token_log_probs(model, mb, temperature=temperature)
    mask = mb.response_mask.bool()
    assert mask.shape == r.sampling_log_probs.shape
    torch.testing.assert_close(r.sampling_log_probs[mask], trainer[mask], atol=1e-5, rtol=0)


def test_sampling_reproducible(model, tok, prompts, eos_ids):
    fast = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=eos_ids)
    params = SamplingParams(n=4, max_new_tokens=16, temperature=0.9, seed=7)
    a, b = fast.generate(prompts, params), fast.generate(prompts, params)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.sampling_log_probs, b.sampling_log_probs)
    c = fast.generate(prompts, SamplingParams(n=4, max_new_tokens=16, temperature=0.9, seed=8))
    assert not torch.equal(a.completion_ids[:, :5], c.completion_ids[:, :5])
    check_semantics(a, eos_ids, tok.pad_token_id, 16)


def test_pad_equal_to_eos(model, prompts, eos_ids, hf_greedy):
    r = FastEngine(model, pad_id=eos_ids[0], eos_ids=eos_ids).generate(prompts, GREEDY)
    ref = hf_greedy
    assert torch.equal(r.lengths, ref.lengths) and torch.equal(r.truncated, ref.truncated)
    assert torch.equal(r.response_mask * r.completion_ids, ref.response_mask * ref.completion_ids)


def test_min_new_tokens_same_as_hf(model, tok, prompts, eos_ids, hf_greedy):
    assert (hf_greedy.lengths <= 6).any()  # without it, some rows end before 7 tokens
    params = SamplingParams(n=2, max_new_tokens=16, greedy=True, min_new_tokens=6)
    a = HFEngine(model, pad_id=tok.pad_token_id, eos_ids=eos_ids).generate(prompts, params)
    b = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=eos_ids).generate(prompts, params)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.lengths, b.lengths)
    assert (b.lengths > 6).all()
    sampled = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=eos_ids).generate(
        prompts, SamplingParams(n=4, max_new_tokens=16, min_new_tokens=6, seed=2)
    )
    assert (sampled.lengths > 6).all()


def test_truncation_when_no_eos(model, tok, prompts):
    r = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=[10_000]).generate(
        prompts, SamplingParams(n=2, max_new_tokens=7, seed=1)
    )
    assert r.completion_ids.shape == (10, 7)
    assert r.truncated.all() and (r.lengths == 7).all()


@pytest.mark.parametrize(
    "sampling",
    [dict(top_k=1), dict(top_p=1e-6), dict(top_k=1, top_p=0.5)],
    ids=["top_k=1", "top_p-tiny", "both"],
)
def test_degenerate_filters_equal_greedy(model, tok, prompts, eos_ids, hf_greedy, sampling):
    fast = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=eos_ids)
    for seed in (0, 1):
        params = SamplingParams(n=3, max_new_tokens=16, temperature=0.8, seed=seed, **sampling)
        assert torch.equal(fast.generate(prompts, params).completion_ids, hf_greedy.completion_ids)


def test_mode_restored_and_autograd_after(model, tok, prompts):
    model.train()
    try:
        r = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id]).generate(
            prompts[:2], SamplingParams(n=2, max_new_tokens=4)
        )
        assert model.training
        samples = [
            Sample(p, r.completion_ids[i].tolist(), True, 0.0, False, i // 2)
            for i, p in enumerate(r.prompt_ids)
        ]
        lp, _ = token_log_probs(model, collate(samples, tok.pad_token_id, "cpu"), temperature=1.0)
        lp.sum().backward()
        assert model.lm_head.weight.grad is not None
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


def reference_filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """One row at a time, in plain Python: keep the k largest (ties with the k-th kept), then
    the most likely tokens, in order, until their probability reaches top_p."""
    out = torch.full_like(logits, float("-inf"))
    for r in range(logits.shape[0]):
        row = logits[r].tolist()
        keep = set(range(len(row)))
        if 0 < top_k < len(row):
            kth = sorted(row, reverse=True)[top_k - 1]
            keep = {j for j in keep if row[j] >= kth}
        if top_p < 1.0:
            probs = torch.tensor([row[j] if j in keep else float("-inf") for j in range(len(row))])
            probs = probs.softmax(0).tolist()
            nucleus, mass = set(), 0.0
            for j in sorted(keep, key=lambda j: -row[j]):
                if mass >= top_p:
                    break
                nucleus.add(j)
                mass += probs[j]
            keep = nucleus
        for j in keep:
            out[r, j] = row[j]
    return out


@pytest.mark.parametrize("top_k", [0, 1, 5, 40, 100])
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.5, 0.1, 1e-6])
def test_filter_matches_loop_reference(top_k, top_p):
    gen = torch.Generator().manual_seed(top_k * 1000 + int(top_p * 100))
    logits = torch.randn(16, 60, generator=gen, dtype=torch.float64) * 2
    if top_p == 1.0:  # ties at the k-th value (with top-p their order would matter)
        logits[0, :10] = logits[0, 10]
    got = filter_logits(logits, top_k, top_p)
    want = reference_filter(logits, top_k, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(want)])


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(n=0), "n >= 1"),
        (dict(top_k=-1), "top_k"),
    ],
)
def test_sampling_params_refuse_values_that_would_give_nan_or_nothing(bad, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{"n": 2, "max_new_tokens": 4, **bad})
