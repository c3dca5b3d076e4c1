"""rm.arch=surprise (rlvr.rm.verifier): the score by hand from the backbone's own token
log-probabilities, the vectorised per-position readout against a plain loop, the response
found after the marker under either padding, the marker taken from the prompts, and the saved
model loaded by transformers alone (trust_remote_code) and by the `reward_model` reward."""

import subprocess
import sys

import pytest
import torch

from rlvr.rewards.registry import make_reward
from rlvr.rm.model import RewardModel, response_marker

PROMPTS = ["<|im_start|>user\nCompute 3+4.<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nCompute 12-5.<|im_end|>\n<|im_start|>assistant\n"]  # fmt: skip
RESPONSES = ["<think>3+4=7</think><answer>7</answer>", "<answer>8</answer>"]


@pytest.fixture(scope="module")
def rm(tiny_model_dir):
    return RewardModel.from_backbone(str(tiny_model_dir), seed=0, arch="surprise", prompts=PROMPTS)


def _logprobs(rm, ids: list[int]) -> list[float]:
    """log p(x_t | x_<t) for t = 1.. under the backbone's own LM head, one text at a time."""
    with torch.no_grad():
        logits = rm.model.lm(input_ids=torch.tensor([ids])).logits[0].float()
    return [float(logits[t - 1].log_softmax(-1)[ids[t]]) for t in range(1, len(ids))]


def test_the_marker_is_the_prompts_common_last_tokens(rm):
    tok = rm.tokenizer
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    full = response_marker(tok, PROMPTS, limit=1000)
    n = len(full)
    assert ids[0][-n:] == ids[1][-n:] == full and ids[0][-n - 1] != ids[1][-n - 1]
    assert 8 < n <= 16 and response_marker(tok, PROMPTS, limit=8) == full[-8:]  # capped
    assert rm.model.config.response_marker == full
    assert response_marker(tok, ["ab", "cd"]) == []
    assert tok.decode(response_marker(tok, ["x=1\nA:", "y=22\nA:"], limit=4)) == "\nA:"


def test_the_initial_score_is_the_lowest_response_token_logprob(rm):
    """w = 0, a = (1, 0), b = 0: the response's lowest log-probability under the backbone,
    computed here one token at a time from the response start the prompt gives."""
    ids, starts = rm.encode_with_starts(PROMPTS, RESPONSES)
    got = rm.score(PROMPTS, RESPONSES)
    for k, (x, s) in enumerate(zip(ids, starts, strict=True)):
        lp = _logprobs(rm, x)  # lp[t - 1] is token t's
        assert got[k].item() == pytest.approx(min(lp[s - 1 :]), abs=1e-5)


@pytest.mark.parametrize("logit_rows", [1024, 3])
def test_per_position_readout_matches_a_plain_loop(rm, logit_rows, monkeypatch):
    """With every head weight nonzero: at each response position t, w . h_t + a . [min, mean
    of the response's log-probs up to t] + b; the last position's value is the score, with
    the batch padded on the right and on the left alike; the same when the vocabulary logits
    are made a position at a time (3 rows for a batch of 2) instead of all at once."""
    monkeypatch.setattr("rlvr.rm.verifier.LOGIT_ROWS", logit_rows)
    torch.manual_seed(0)
    m = rm.model
    with torch.no_grad():
        m.score.weight.normal_()
        m.surprise.weight.copy_(torch.tensor([[0.7, -1.3]]))
        m.surprise.bias.fill_(0.25)
    ids, starts = rm.encode_with_starts(PROMPTS, RESPONSES)
    with torch.no_grad():
        per_token, mask = rm.forward_tokens(ids)
        for k, (x, s) in enumerate(zip(ids, starts, strict=True)):
            lp = _logprobs(rm, x)
            h = m.lm(input_ids=torch.tensor([x]), output_hidden_states=True).hidden_states[-1][0]
            for t in range(s, len(x)):
                seen = lp[s - 1 : t]
                want = float(m.score(h[t])) + 0.7 * min(seen) - 1.3 * sum(seen) / len(seen) + 0.25
                assert per_token[k, t].item() == pytest.approx(want, abs=1e-4)
        right = rm.forward(ids)
        width = max(map(len, ids))
        left_ids = torch.full((len(ids), width), rm.tokenizer.pad_token_id)
        left_mask = torch.zeros((len(ids), width), dtype=torch.long)
        for k, x in enumerate(ids):
            left_ids[k, width - len(x) :] = torch.tensor(x)
            left_mask[k, width - len(x) :] = 1
        left = m(input_ids=left_ids, attention_mask=left_mask).logits[:, 0]
    torch.testing.assert_close(right, per_token[torch.arange(2), mask.sum(1) - 1])
    torch.testing.assert_close(left, right, atol=1e-4, rtol=0)


def test_without_the_marker_every_token_after_the_first_is_read(rm):
    m = rm.model
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    assert m.response_starts(ids, torch.ones_like(ids)).tolist() == [1]
    x = rm.encode(PROMPTS[:1], RESPONSES[:1])[0]
    n = len(m.config.response_marker)
    assert m.response_starts(torch.tensor([x]), torch.ones(1, len(x))).tolist() == [
        len(rm.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"])
    ]
    assert n > 0


def test_saved_model_loads_without_rlvr_and_in_the_reward(rm, tmp_path):
    rm.save(tmp_path)
    ours = rm.score(PROMPTS, RESPONSES)
    reward = make_reward("reward_model", model=str(tmp_path), batch_size=1)
    theirs = reward(completions=RESPONSES, prompt_texts=PROMPTS, prompts=PROMPTS)
    torch.testing.assert_close(torch.tensor(theirs), ours, atol=1e-5, rtol=0)
    code = (
        "import sys; sys.modules['rlvr'] = None\n"  # importing rlvr now fails
        "import torch\n"
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer\n"
        f"d = {str(tmp_path)!r}\n"
        "m = AutoModelForSequenceClassification.from_pretrained(d, trust_remote_code=True)\n"
        "tok = AutoTokenizer.from_pretrained(d)\n"
        f"b = tok({[p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)]!r}, "
        "return_tensors='pt', padding=True, add_special_tokens=False)\n"
        "print(type(m).__module__, *m(**b).logits[:, 0].tolist())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    module, *scores = res.stdout.split()
    assert not module.startswith("rlvr")
    torch.testing.assert_close(torch.tensor([float(s) for s in scores]), ours, atol=1e-5, rtol=0)


def test_any_causal_lm_family_round_trips(tiny_qwen2_dir, tmp_path):
    """A Qwen2 backbone (biases in q/k/v): built, saved, loaded, the same scores."""
    rm = RewardModel.from_backbone(str(tiny_qwen2_dir), seed=0, arch="surprise", prompts=PROMPTS)
    assert rm.model.lm.config.model_type == "qwen2"
    rm.save(tmp_path)
    again = RewardModel.load(tmp_path)
    torch.testing.assert_close(again.score(PROMPTS, RESPONSES), rm.score(PROMPTS, RESPONSES))
