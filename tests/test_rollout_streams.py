"""Counter-based per-row streams (the fast engine's batched sampling on CUDA), on the CPU:
the hash against a plain loop, the Gumbel-max draw against the softmax it samples, rows
independent of each other and of their batch, and the engine's loop with them."""

import math

import pytest
import torch

from rlvr.models import build_tokenizer
from rlvr.rollout import FastEngine, SamplingParams
from rlvr.rollout.fast import row_generators, sample_tokens
from rlvr.rollout.streams import CounterStreams, _mix32_int, mix32, row_key
from rlvr.training.batch import Sample, collate, token_log_probs


def test_mixer_matches_the_plain_integer_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2**32, (1000,), generator=g, dtype=torch.long)
    assert mix32(x).tolist() == [_mix32_int(v) for v in x.tolist()]
    assert int(mix32(x).min()) >= 0 and int(mix32(x).max()) < 2**32


def test_uniforms_are_uniform():
    u = CounterStreams.from_seeds(list(range(64)), "cpu").uniform(step=5, vocab=4096)
    assert float(u.min()) > 0 and float(u.max()) < 1
    n = u.numel()  # 262144
    counts = torch.histc(u, bins=16, min=0, max=1)
    expected = n / 16
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 40  # 15 degrees of freedom: P(chi2 > 40) < 0.001
    assert abs(float(u.mean()) - 0.5) < 4.5 * math.sqrt(1 / 12 / n)


def _frequencies(tokens: torch.Tensor, V: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=V).float() / tokens.numel()


def test_draws_follow_the_softmax_across_rows_and_across_steps():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, float("-inf")])
    p = logits.softmax(-1)
    N = 40_000
    across_rows = CounterStreams.from_seeds(list(range(N)), "cpu").draw(logits.expand(N, 6), 0)
    one_row = CounterStreams.from_seeds([123], "cpu")
    across_steps = torch.cat([one_row.draw(logits[None], t) for t in range(4000)])
    for tokens in (across_rows, across_steps):
        f, n = _frequencies(tokens, 6), tokens.numel()
        se = (p * (1 - p) / n).sqrt()
        assert ((f - p).abs() <= 4.5 * se + 1e-12).all(), (f, p)
        assert f[5] == 0  # a -inf logit is never drawn


def test_neighbouring_seeds_are_independent():
    """Rows seeded s and s+1 (samples j and j+1 of a prompt) agree as often as two
    independent draws would: sum_v p_v^2."""
    logits = torch.linspace(1.0, -1.0, 8)
    p = logits.softmax(-1)
    N = 20_000
    streams = CounterStreams.from_seeds([1009 * 77 + j for j in range(N)], "cpu")
    tokens = streams.draw(logits.expand(N, 8), 3)
    agree = (tokens[1:] == tokens[:-1]).float().mean()
    q = float((p**2).sum())
    assert abs(float(agree) - q) < 4.5 * math.sqrt(q * (1 - q) / (N - 1))


def test_a_rows_draw_does_not_depend_on_its_batch():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    seeds = [11, 22, 33, 44, 55]
    whole = CounterStreams.from_seeds(seeds, "cpu")
    for t in range(5):
        batched = whole.draw(logits, t)
        alone = torch.cat(
            [
                CounterStreams.from_seeds([s], "cpu").draw(logits[i : i + 1], t)
                for i, s in enumerate(seeds)
            ]
        )
        assert torch.equal(batched, alone)
        keep = torch.tensor([1, 3])
        assert torch.equal(whole.rows(keep).draw(logits[keep], t), batched[keep])


def test_chunked_draw_equals_the_whole(monkeypatch):
    import rlvr.rollout.streams as streams

    logits = torch.randn(7, 30, generator=torch.Generator().manual_seed(3))
    rows = CounterStreams.from_seeds(list(range(7)), "cpu")
    whole = rows.draw(logits, 4)
    monkeypatch.setattr(streams, "CHUNK_ELEMENTS", 60)  # 2 rows a chunk
    assert torch.equal(rows.draw(logits, 4), whole)


def test_row_keys_differ_for_64_bit_seeds():
    keys = {row_key(s) for s in [0, 1, 2**32, 2**32 + 1, 2**63 - 1, 5 * 1009 + 1]}
    assert len(keys) == 6


def test_sample_tokens_with_counter_streams_keeps_filters_and_log_probs():
    logits = torch.randn(64, 40, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(n=1, max_new_tokens=1, temperature=0.7, top_k=5, seed=0)
    streams = CounterStreams.from_seeds(list(range(64)), "cpu")
    tokens, lp = sample_tokens(logits, params, None, streams, step=2)
    top5 = logits.topk(5, dim=-1).indices
    assert (top5 == tokens[:, None]).any(-1).all()
    scaled = logits / 0.7
    want = scaled.gather(-1, tokens[:, None]).squeeze(1) - scaled.logsumexp(-1)
    torch.testing.assert_close(lp, want)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(scaled_tiny_model):
    return scaled_tiny_model


def _engine(model, tok, eos, streams="counter", check_every=None, retire=0.25):
    engine = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=eos, retire_fraction=retire)
    engine.row_streams, engine.check_every = streams, check_every
    return engine


def test_engine_loop_with_counter_streams(model, tok):
    prompts = [tok.encode(s) for s in ["What is 2+3?", "hi", "Compute 17*3."]]
    eos = [tok.encode("3")[-1], tok.eos_token_id]
    params = SamplingParams(n=4, max_new_tokens=16, seed=1, row_seeds=(5, 6, 7))
    ref = _engine(model, tok, eos, check_every=1).generate(prompts, params)
    assert ref.lengths.min() < 16  # some rows finish early
    # Checking finished rows every 4 steps, or never compacting, samples the same tokens.
    for kw in (dict(check_every=3, retire=None),):
        other = _engine(model, tok, eos, **kw).generate(prompts, params)
        assert torch.equal(other.completion_ids, ref.completion_ids)
        assert torch.equal(other.lengths, ref.lengths)
        torch.testing.assert_close(
            other.sampling_log_probs, ref.sampling_log_probs, atol=1e-5, rtol=0
        )
    # A prompt's samples do not depend on the other prompts of the batch.
    alone = _engine(model, tok, eos).generate(
        prompts[1:2], SamplingParams(n=4, max_new_tokens=16, seed=1, row_seeds=(6,))
    )
    w = alone.completion_ids.shape[1]
    assert torch.equal(alone.completion_ids, ref.completion_ids[4:8, :w])
    # Log-probs are the trainer's.
    samples = [
        Sample(
            p,
            ref.completion_ids[i, : ref.lengths[i]].tolist(),
            bool(ref.truncated[i]),
            0.0,
            False,
            i // 4,
        )
        for i, p in enumerate(ref.prompt_ids)
    ]
    mb = collate(samples, tok.pad_token_id, "cpu")
    with torch.no_grad():
        trainer, _ = token_log_probs(model, mb, temperature=1.0)
    mask = mb.response_mask.bool()
    torch.testing.assert_close(ref.sampling_log_probs[mask], trainer[mask], atol=1e-5, rtol=0)


def test_cpu_default_keeps_per_row_generators(model, tok):
    prompts = [tok.encode("hi"), tok.encode("abc")]
    params = SamplingParams(n=3, max_new_tokens=12, seed=4, row_seeds=(1, 2))
    assert isinstance(row_generators(params, 2, "cpu"), list)
    auto = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id]).generate(
        prompts, params
    )
    gens = _engine(model, tok, [tok.eos_token_id], streams="generators").generate(prompts, params)
    assert torch.equal(auto.completion_ids, gens.completion_ids)
