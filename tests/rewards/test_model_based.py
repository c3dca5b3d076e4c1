"""Model-based rewards on tiny randomly initialised Qwen2 models built here: what is tested is
the wiring (text in, logit 0 out), batching with padding, and verdict parsing."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

from rlvr.models import build_tokenizer
from rlvr.rewards import make_reward
from rlvr.rewards.model_based import parse_verdict


def _config(vocab: int, pad: int, eos: int) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
        pad_token_id=pad, eos_token_id=eos, num_labels=1, tie_word_embeddings=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def reward_model():
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(_config(len(tok), tok.pad_token_id, tok.eos_token_id))
    return model.eval(), tok


PROMPTS = ["2+2=", "Say hi.", "A much longer prompt than the others, to force padding: "]
COMPLETIONS = ["4", "hi there", "ok"]


def test_reward_model_scores_logit_zero_of_each_text(reward_model):
    model, tok = reward_model
    fn = make_reward("reward_model", model=model, tokenizer=tok, batch_size=2)
    got = fn(prompts=PROMPTS, completions=COMPLETIONS, answer=["", "", ""])
    for p, c, score in zip(PROMPTS, COMPLETIONS, got):
        ids = tok(p + c, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            want = model(**ids).logits[0, 0].item()
        assert score == pytest.approx(want, abs=1e-5)
    # batch size does not change the scores (padding is masked)
    one = make_reward("reward_model", model=model, tokenizer=tok, batch_size=1)
    assert one(prompts=PROMPTS, completions=COMPLETIONS, answer=["", "", ""]) == pytest.approx(
        got, abs=1e-5
    )


def test_reward_model_loads_from_a_directory(reward_model, tmp_path):
    model, tok = reward_model
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "tokenizer")
    # (the tokenizer sits apart: next to a qwen2 config.json, AutoTokenizer picks
    # Qwen2Tokenizer, whose pre-tokenizer drops the spaces of this character-level one)
    fn = make_reward(
        "reward_model", model=str(tmp_path / "model"), tokenizer=str(tmp_path / "tokenizer")
    )
    direct = make_reward("reward_model", model=model, tokenizer=tok)
    assert fn(prompts=PROMPTS, completions=COMPLETIONS, answer=[""] * 3) == pytest.approx(
        direct(prompts=PROMPTS, completions=COMPLETIONS, answer=[""] * 3)
    )


def test_reward_model_needs_a_model():
    with pytest.raises(ValueError, match="needs `model`"):
        make_reward("reward_model")


def _judge(verdict_word: str):
    """A word-level tokenizer and a causal LM whose head always picks `verdict_word`: zero
    weights plus a bias on that token (the rest of the model is random)."""
    words = ["<pad>", "<eos>", "CORRECT", "INCORRECT", "maybe", "Question:", "Reference",
             "answer:", "Response:", "Verdict:", "4", "5", "2+2"]  # fmt: skip
    tok_model = models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="maybe")
    backend = Tokenizer(tok_model)
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config(len(words), 0, 1))
    head = torch.nn.Linear(32, len(words), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[words.index(verdict_word)] = 10.0
    model.lm_head = head
    return model.eval(), tok


@pytest.mark.parametrize(("word", "want"), [("CORRECT", 1.0), ("INCORRECT", 0.0), ("maybe", None)])
def test_judge_parses_the_generated_verdict(word, want):
    model, tok = _judge(word)
    fn = make_reward("judge", model=model, tokenizer=tok, batch_size=2, max_new_tokens=3)
    prompts, comps, refs = ["2+2", "2+2", "2+2 2+2 2+2"], ["4", "5", "4"], ["4", "4", "4"]
    assert fn(prompts=prompts, completions=comps, answer=refs) == [want] * 3


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("CORRECT", 1.0),
        (" correct.", 1.0),
        ("INCORRECT", 0.0),
        ("incorrect, because", 0.0),
        ("Yes", 1.0),
        ("no", 0.0),
        ("Wrong answer", 0.0),
        ("The response is right", 1.0),
        ("I cannot tell", None),
        ("", None),
        ("INCORRECTLY", None),
    ],
)
def test_parse_verdict(text, want):
    assert parse_verdict(text) == want


def test_judge_template_must_have_fields():
    with pytest.raises(ValueError, match="reference"):
        make_reward("judge", model="x", template="{question} {response}")
