"""The characters-per-token bound that refuses an over-long prompt before tokenizing it: it
holds for real tokenizers of each kind (property tests), is withheld where it cannot hold,
and a 10 MB prompt is refused in a real `rlvr train` without gigabytes of memory."""

import json
import resource
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rlvr.data.token_bound import chars_per_token, min_tokens

CORPUS = ["hello world, this is some text: 12345 + 678 = 9. Ünïcödé 数学 ∑ é"] * 50


def _bpe(normalizer=None, pre=None, **model_kw):
    tok = Tokenizer(models.BPE(**model_kw))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def _metaspace_bpe():
    """SentencePiece-style (Llama 2): Metaspace, byte fallback for unknown characters."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=200,
        special_tokens=["<unk>", *(f"<0x{b:02X}>" for b in range(256))],
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


@pytest.fixture(scope="module")
def tokenizers_with_a_bound(tokenizer):
    return {
        "builtin": tokenizer,
        "byte_level_nfc": _bpe(normalizers.NFC()),
        "byte_level_nfkc_lower": _bpe(
            normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        ),
        "metaspace_byte_fallback": _metaspace_bpe(),
    }


TEXT = st.lists(
    st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(["\u0301", "\u0308", "\u0304", "\u1100", "\u1161", "\u11a8", " ", "<"]),
        st.sampled_from(["<|endoftext|>", "hello", "\ufb03", "\u1f82", "\u212b", "e\u0301"]),
    ),
    max_size=60,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    text=TEXT,
    which=st.sampled_from(
        sorted(["builtin", "byte_level_nfc", "byte_level_nfkc_lower", "metaspace_byte_fallback"])
    ),
)
def test_the_bound_never_exceeds_the_real_count(tokenizers_with_a_bound, text, which):
    tok = tokenizers_with_a_bound[which]
    per_token = chars_per_token(tok)
    assert per_token is not None
    assert len(tok(text, add_special_tokens=False)["input_ids"]) >= min_tokens(text, per_token)


def test_builtin_bound_is_its_longest_token(tokenizer):
    assert chars_per_token(tokenizer) == len("</tool_response>")


@pytest.mark.parametrize(
    "build",
    [
        lambda: _bpe(pre=pre_tokenizers.WhitespaceSplit()),  # drops whitespace
        lambda: _bpe(normalizers.Strip()),  # deletes text
        lambda: _bpe(normalizers.Replace("  ", "")),
        lambda: _bpe(unk_token="<|endoftext|>", fuse_unk=True),  # one <unk> for a run
    ],
)
def test_no_bound_where_a_part_can_swallow_text(build):
    assert chars_per_token(build()) is None


def test_a_10mb_prompt_is_refused_before_it_costs_gigabytes(tmp_path):
    data = tmp_path / "big.jsonl"
    rows = [{"prompt": "1+1?", "answer": "2"}] * 20 + [{"prompt": "7" * 10_000_000, "answer": "1"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr",
            "train",
            f"--data.path={data}",
            "--rollout.prompts_per_step=4",
            "--max-steps=1",
            f"--output-dir={tmp_path / 'run'}",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "error: big.jsonl:21: the prompt has 100000" in res.stderr
    assert "exceeds the model's context of" in res.stderr
    # tokenizing it would peak near 4 GB (module docstring of rlvr.data.token_bound); the run's
    # own baseline (torch, the model, the 10 MB row) is a few hundred MB
    assert before / 1024 > 1500 or peak_mb < 1500, peak_mb
