"""The built-in tokenizer and tiny model, and loading through `from_pretrained`."""

from __future__ import annotations

import pytest
import torch

from rlvr.models import (
    TAG_TOKENS,
    TOOL_TOKENS,
    build_tiny_model,
    build_tokenizer,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from rlvr.tasks import TASKS, format_ok


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_tokenizer_round_trips_text(tokenizer):
    text = "Compute 347-58 = ? (a, b)!\n<think>1+2=3</think> <answer>-289</answer> xyz_XYZ"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # one id per character, one per tag
    assert len(ids) == len(text) - sum(len(t) for t in TAG_TOKENS) + len(TAG_TOKENS)


def test_special_tokens_are_single_ids(tokenizer):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *TAG_TOKENS]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in specials]
    assert all(len(i) == 1 for i in ids)
    assert len({i[0] for i in ids}) == len(specials)
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    # eos is dropped by skip_special_tokens, the reasoning tags are not
    ids = tokenizer("<answer>7</answer><|im_end|>", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<answer>7</answer>"
    assert tokenizer("1")["input_ids"] == tokenizer("1", add_special_tokens=False)["input_ids"]


def test_unknown_characters_map_to_unk(tokenizer):
    ids = tokenizer("é€", add_special_tokens=False)["input_ids"]
    assert ids == [tokenizer.unk_token_id] * 2


def test_chat_template(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = tokenizer.apply_chat_template(messages, tokenize=False)
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")


def test_tool_tokens_follow_the_old_ids(tokenizer):
    assert len(tokenizer) == 108
    assert [tokenizer.convert_tokens_to_ids(t) for t in TOOL_TOKENS] == [104, 105, 106, 107]
    # the ids before them are the 104 of the character vocabulary, unchanged
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<think>", "\n", "0", " "]) == [
        0,
        4,
        8,
        9,
        103,
    ]
    text = '<tool_call>{"name": "calc"}</tool_call><tool_response>12</tool_response>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 104 and ids[-1] == 107 and 105 in ids and 106 in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_chat_template_tool_role(tokenizer):
    messages = [
        {"role": "user", "content": "Compute 3*4+1."},
        {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
        {"role": "tool", "content": "12"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>user\nCompute 3*4+1.<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>{}</tool_call><|im_end|>\n"
        "<|im_start|>tool\n<tool_response>12</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tiny_model_is_deterministic_per_seed(tokenizer):
    a, b, c = (build_tiny_model(tokenizer, seed=s) for s in (0, 0, 1))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    n_params = sum(p.numel() for p in a.parameters())
    assert 300_000 < n_params < 2_000_000
    assert a.config.pad_token_id == tokenizer.pad_token_id
    assert a.config.eos_token_id == a.generation_config.eos_token_id == tokenizer.eos_token_id


def test_building_does_not_touch_the_global_rng(tokenizer):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    build_tiny_model(tokenizer, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_save_and_load_give_identical_logits(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, seed=0, hidden_size=64, num_layers=2, intermediate_size=128)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    loaded_tok = load_tokenizer(str(tmp_path))
    text = loaded_tok.apply_chat_template(
        [{"role": "user", "content": "2+2"}], add_generation_prompt=True, tokenize=False
    )
    ids = loaded_tok(text, return_tensors="pt")["input_ids"]
    assert ids.tolist() == tokenizer(text, return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)
    assert loaded_tok.pad_token_id == tokenizer.pad_token_id
    assert load_model(str(tmp_path), dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        load_model(str(tmp_path), dtype="float64")


def test_builtin_model_loads_and_answers_in_format():
    path = resolve_model_path("rlvr-tiny")
    assert path.endswith("rlvr-tiny")
    assert resolve_model_path(path) == path
    model, tokenizer = load_model("rlvr-tiny"), load_tokenizer("rlvr-tiny")
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer("<think>\n", add_special_tokens=False)["input_ids"] == [4, 8]
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 2_000_000
    task = TASKS["arithmetic"]
    examples = task.make_examples("test", 8, seed=0)
    prompts = [
        tokenizer.apply_chat_template(
            task.prompt_messages(ex), add_generation_prompt=True, tokenize=False
        )
        for ex in examples
    ]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=task.max_new_tokens, do_sample=False)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert all(format_ok(t) for t in texts), texts
    assert sum(task.verify(t, ex) for t, ex in zip(texts, examples)) >= 5, texts


def test_missing_path_fails_naming_it(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        resolve_model_path(missing)
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model(missing)
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_tokenizer(missing)


def test_directory_without_a_model_fails_naming_it(tmp_path):
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty-dir"):
        load_model(str(empty))


def test_hub_ids_pass_through():
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_generic_tokenizer_beside_a_qwen2_config_keeps_its_spacing(tmp_path):
    """transformers 5 maps model_type qwen2 to Qwen2Tokenizer, which rebuilds the
    pre-tokenizer; a directory that declares a generic tokenizer must get that one back."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.models import build_tokenizer, load_tokenizer

    tok = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
    )
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(str(tmp_path))
    text = "Compute 3 + 4.\n<think>x</think>"
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.decode(again(text)["input_ids"]) == text
