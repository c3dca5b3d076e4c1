"""The trainer's log-probs: padding, positions and temperature must not change them."""

import pytest
import torch

from rlvr.rollout import left_pad, lengths_from_eos
from rlvr.training.batch import Sample, collate, token_log_probs


def _sample(prompt, completion):
    return Sample(
        prompt_ids=prompt,
        completion_ids=completion,
        truncated=False,
        reward=0.0,
        correct=False,
        group=0,
    )


def _plain_log_probs(model, prompt, completion, temperature):
    """One unpadded sequence, scored token by token with a plain loop."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0].float() / temperature
    out = []
    for t, tok in enumerate(completion):
        logp = torch.log_softmax(logits[len(prompt) + t - 1], dim=-1)
        out.append(logp[tok])
    return torch.stack(out)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_padded_batch_matches_unpadded_loop(tiny_model, seed, temperature):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(4):
        p = torch.randint(5, 100, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
        c = torch.randint(5, 100, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g)
        samples.append(_sample(p.tolist(), c.tolist()))
    mb = collate(samples, pad_id=0, device="cpu")
    with torch.no_grad():
        lp, ent = token_log_probs(tiny_model, mb, temperature=temperature, with_entropy=True)
        for i, s in enumerate(samples):
            want = _plain_log_probs(tiny_model, s.prompt_ids, s.completion_ids, temperature)
            n = len(s.completion_ids)
            torch.testing.assert_close(lp[i, :n], want, atol=1e-5, rtol=1e-5)
            assert mb.response_mask[i, :n].all() and not mb.response_mask[i, n:].any()
    assert (ent[mb.response_mask.bool()] > 0).all()


def test_entropy_matches_definition(tiny_model):
    samples = [_sample([5, 6, 7], [8, 9])]
    mb = collate(samples, pad_id=0, device="cpu")
    with torch.no_grad():
        _, ent = token_log_probs(tiny_model, mb, temperature=1.0, with_entropy=True)
        logits = tiny_model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits[0, 2:4].float()
        p = torch.softmax(logits, -1)
        want = -(p * torch.log(p)).sum(-1)
    torch.testing.assert_close(ent[0], want, atol=1e-5, rtol=1e-5)


def test_lengths_from_eos_matches_loop():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6, (50, 9), generator=g)
    eos = [3, 4]
    lengths, truncated = lengths_from_eos(ids, eos)
    for row, n, tr in zip(ids.tolist(), lengths.tolist(), truncated.tolist()):
        first = next((i for i, t in enumerate(row) if t in eos), None)
        assert tr == (first is None)
        assert n == (len(row) if first is None else first + 1)  # EOS counted


def test_lengths_from_eos_of_empty_batches():
    lengths, truncated = lengths_from_eos(torch.zeros(0, 9, dtype=torch.long), [3])
    assert lengths.shape == truncated.shape == (0,)
    lengths, truncated = lengths_from_eos(torch.zeros(2, 0, dtype=torch.long), [3])
    assert lengths.tolist() == [0, 0] and truncated.tolist() == [True, True]  # cut at 0 tokens


def test_left_pad():
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0, device="cpu")
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
