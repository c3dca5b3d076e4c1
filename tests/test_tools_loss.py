"""Tool tokens are context: out of the policy loss, its normalisers, the entropy, and PPO's
rewards, GAE and value targets; the model's tokens after a tool turn are scored on the whole
conversation."""

import torch

from conftest import update_context
from rlvr.config.load import load_config
from rlvr.training.batch import Batch, Sample, collate, token_log_probs
from rlvr.training.micro import loss_counts as _loss_counts
from rlvr.training.micro import micro_loss as _micro_loss
from rlvr.training.ppo import loss_mask

PROMPT = [9, 10, 11, 12]
BEFORE = [20, 21, 22, 105]  # the model's turn, ending with </tool_call>


def _sample(tool: list[int], after: list[int], truncated=False, reward=1.0, group=0) -> Sample:
    ids = BEFORE + tool + after
    mask = torch.tensor([False] * len(BEFORE) + [True] * len(tool) + [False] * len(after))
    return Sample(PROMPT, ids, truncated, reward, True, group, tool_mask=mask)


def _loss_and_grads(model, samples: list[Sample], cfg):
    batch = Batch(samples, 1, advantages=torch.tensor([1.0, -1.0][: len(samples)]))
    counts = _loss_counts(samples, cfg.algo.overlong_filter)
    model.zero_grad()
    r = _micro_loss(
        batch, update_context(cfg, model, num_tokens=counts[0], num_sequences=counts[1])
    )
    r.out.loss.backward()
    return counts, r, [p.grad.clone() for p in model.parameters()]


def test_tool_text_changes_no_normaliser_and_no_gradient_before_it(tiny_model):
    cfg = load_config(overrides={"algo": {"agg": "token_mean", "overlong_filter": False}})
    short, long = [30, 31], [40, 41, 42, 43, 44, 45, 46]  # two tool results, other lengths
    # a response cut inside its tool turn: every loss token comes before the tool's text
    a_counts, a, a_grads = _loss_and_grads(tiny_model, [_sample(short, [], truncated=True)], cfg)
    b_counts, b, b_grads = _loss_and_grads(tiny_model, [_sample(long, [], truncated=True)], cfg)
    assert a_counts == b_counts == [len(BEFORE), 1.0]
    assert a.loss_tokens == b.loss_tokens == a.generated_tokens == len(BEFORE)
    # Equal in exact arithmetic (causal attention: no loss token sees the tool's text), not
    # bit for bit: the two batches are padded to other lengths, so the matmuls block and sum
    # in another order. A few fp32 ulps of the values compared, on any CPU's kernels.
    torch.testing.assert_close(a.out.loss, b.out.loss, rtol=1e-5, atol=1e-6)
    for ga, gb in zip(a_grads, b_grads):
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-6)
    # with the model's tokens after the tool turn the normalisers still count only them
    after = [50, 51, 2]
    counts, r, _ = _loss_and_grads(tiny_model, [_sample(long, after), _sample(short, after)], cfg)
    assert counts == [2.0 * (len(BEFORE) + len(after)), 2.0]
    assert r.loss_tokens == r.generated_tokens == 2 * (len(BEFORE) + len(after))


def test_log_probs_after_a_tool_turn_see_the_whole_conversation(tiny_model):
    after = [50, 51, 2]
    samples = [_sample([30, 31], after), _sample([40, 41, 42], after)]
    mb = collate(samples, 0, "cpu")
    n = len(BEFORE)
    assert mb.response_mask[0].tolist() == [1.0] * n + [0.0, 0.0] + [1.0] * 3 + [0.0]
    assert mb.response_mask[1].tolist() == [1.0] * n + [0.0] * 3 + [1.0] * 3
    with torch.no_grad():
        lp, _ = token_log_probs(tiny_model, mb, temperature=1.0)
        # each row alone, unpadded: the same log-probs of the model's tokens after the tool
        for i, s in enumerate(samples):
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            logits = tiny_model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1].float()
            want = logits.log_softmax(-1).gather(1, ids[0, len(PROMPT) :, None]).squeeze(1)
            m = s.model_mask(len(s.completion_ids))
            torch.testing.assert_close(lp[i, : len(want)][m], want[m], atol=1e-5, rtol=0)
    # the tool's text changes the log-probs of the model's tokens after it
    k = len(BEFORE)
    assert not torch.allclose(lp[0, k + 2 : k + 5], lp[1, k + 3 : k + 6])


def test_ppo_mask_skips_tool_tokens():
    cfg = load_config(preset="ppo")
    samples = [_sample([30, 31], [50, 2]), _sample([30, 31], [], truncated=True)]
    mask = loss_mask(Batch(samples, 2), cfg.algo.overlong_filter)
    assert mask.tolist() == [
        [True] * 4 + [False, False] + [True, True],
        [True] * 4 + [False] * 4,
    ]
    assert Batch(samples, 2).model_mask(9).shape == (2, 9)
