"""Chunked scoring (rlvr.training.token_scores): the log-probs, entropies, losses and gradients of
every trained parameter equal the full-logits path's, on models with a 50,000-token
vocabulary and a tiny width, with ragged lengths, temperature 0.7, prompt sharing on and off,
LoRA (the head adapted too), tied embeddings and Gemma-2's final-logit soft cap.

The reference is the LM's own forward returning all its logits (soft cap included), scored
in fp32 as softmax(logits / temperature). Chunks of 7 tokens split rows mid-sequence. fp32
throughout: the same products summed in a different blocking differ by rounding only
(log-probs near log(50,000) = 10.8: atol 2e-5; a gradient, a sum over 50,000 vocabulary
entries of every token, within 1e-5 of its tensor's largest entry)."""

import os
from dataclasses import replace

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conftest import update_context
from rlvr.config.load import load_config
from rlvr.training.batch import (
    Batch,
    Sample,
    collate,
    collate_shared,
    shared_token_log_probs,
    token_log_probs,
)
from rlvr.training.micro import micro_loss as _micro_loss
from rlvr.training.token_scores import LMHead, chunk_tokens, score_hidden

VOCAB = 50_000
SLOW = pytest.mark.slow
TEMPERATURE = 0.7


def _qwen2(tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        initializer_range=0.3,  # peaked distributions: the log-softmax's gradient is not flat
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(config).train()


def _gemma2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        final_logit_softcapping=2.0,  # well inside tanh's bend for these logits
        initializer_range=0.3,
        pad_token_id=0,
    )
    return Gemma2ForCausalLM(config).train()


def _lora(model: torch.nn.Module) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"])
    model = get_peft_model(model, cfg)
    torch.manual_seed(1)
    for n, p in model.named_parameters():
        if "lora_B" in n:  # B = 0 at init would leave A without gradient
            torch.nn.init.normal_(p, std=0.1)
    return model


MODELS = {
    "qwen2": lambda: _qwen2(tied=False),
    "qwen2-tied": lambda: _qwen2(tied=True),
    "gemma2-softcap": _gemma2,
    "qwen2-lora": lambda: _lora(_qwen2(tied=False)),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


def _samples(groups=3, G=3, seed=0) -> list[Sample]:
    """Ragged prompts and completions over the whole vocabulary, some truncated."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(groups):
        prompt = torch.randint(1, VOCAB, (2 + 3 * k,), generator=g).tolist()
        for j in range(G):
            n = 1 + (5 * k + 3 * j) % 9
            out.append(
                Sample(
                    prompt_ids=prompt,
                    completion_ids=torch.randint(1, VOCAB, (n,), generator=g).tolist(),
                    truncated=j == 1,
                    reward=float(torch.rand(1, generator=g)),
                    correct=False,
                    group=k,
                )
            )
    return out


def _full_logits_scores(model, samples):
    """The reference: the LM's whole forward, its logits for every completion token."""
    mb = collate(samples, 0, "cpu")
    T = mb.response_mask.shape[1]
    logits = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        use_cache=False,
    ).logits[:, -T - 1 : -1]
    z = logits.float() / TEMPERATURE
    log_p = torch.log_softmax(z, -1)
    lp = log_p.gather(-1, mb.input_ids[:, -T:, None]).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return lp, entropy.detach(), mb.response_mask.bool()


def _chunked_scores(model, samples, share: bool, chunk: int):
    if share:
        mb = collate_shared(samples, 0, "cpu")
        return shared_token_log_probs(
            model, mb, temperature=TEMPERATURE, with_entropy=True, chunk=chunk
        )
    mb = collate(samples, 0, "cpu")
    return token_log_probs(model, mb, temperature=TEMPERATURE, with_entropy=True, chunk=chunk)


def _grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out


def _close(got: torch.Tensor, ref: torch.Tensor, name: str) -> None:
    scale = float(ref.abs().max())
    torch.testing.assert_close(got, ref, atol=1e-5 * scale, rtol=1e-4, msg=name)


def _weights(mask: torch.Tensor) -> torch.Tensor:
    """Per-token loss weights of both signs, so no gradient cancels by symmetry."""
    g = torch.Generator().manual_seed(3)
    return torch.randn(mask.shape, generator=g) * mask


@pytest.mark.parametrize(
    "share, chunk",
    [(False, 7), pytest.param(True, 7, marks=SLOW), pytest.param(False, 1, marks=SLOW)],
)
def test_log_probs_entropy_and_gradients_match_full_logits(model, share, chunk):
    samples = _samples()
    lp_ref, ent_ref, mask = _full_logits_scores(model, samples)
    w = _weights(mask)
    (lp_ref * w).sum().backward()
    ref = _grads(model)
    lp, ent = _chunked_scores(model, samples, share, chunk)
    assert mask.sum() > chunk  # several chunks, split inside rows
    torch.testing.assert_close(lp[mask], lp_ref[mask].detach(), atol=2e-5, rtol=0)
    torch.testing.assert_close(ent[mask], ent_ref[mask], atol=2e-5, rtol=0)
    assert not ent.requires_grad
    (lp * w).sum().backward()
    got = _grads(model)
    assert set(got) == set(ref) and len(ref) > 0
    for n in ref:
        assert ref[n].abs().max() > 0, n  # every trained parameter gets a gradient
        _close(got[n], ref[n], n)


def test_no_grad_chunks_match_one_piece(model):
    samples = _samples(seed=1)
    with torch.no_grad():
        one, ent_one = _chunked_scores(model, samples, False, 0)
        many, ent_many = _chunked_scores(model, samples, False, 5)
    mask = collate(samples, 0, "cpu").response_mask.bool()
    torch.testing.assert_close(many[mask], one[mask], atol=2e-5, rtol=0)
    torch.testing.assert_close(ent_many[mask], ent_one[mask], atol=2e-5, rtol=0)


def _cfg(share: bool, chunk: int):
    return load_config(
        None,
        {
            "preset": "dapo",
            "rollout": {"group_size": 3, "prompts_per_step": 3, "temperature": TEMPERATURE},
            "algo": {"kl_coef": 0.05, "kl_in_reward": False},
            "optim": {"share_prompt": share, "logits_chunk_tokens": chunk},
        },
    )


@pytest.mark.slow
@pytest.mark.parametrize("share", [False, True])
def test_policy_loss_and_gradients_match_one_piece(model, share):
    """Through the update's micro-batch loss (clipped ratio against old log-probs, a KL to a
    reference): 7-token chunks give the loss, entropy and gradients of one piece."""
    samples = _samples(seed=2)
    batch = Batch(samples, 3)
    g = torch.Generator().manual_seed(4)
    width = batch.width
    mask = batch.model_mask().float()
    batch = replace(
        batch,
        advantages=torch.randn(len(samples), generator=g),
        old_log_probs=(-10.8 + 0.3 * torch.randn(len(samples), width, generator=g)) * mask,
        ref_log_probs=(-10.8 + 0.3 * torch.randn(len(samples), width, generator=g)) * mask,
    )
    counts = (float(mask.sum()), float(len(samples)))
    results = {}
    for chunk in (0, 7):
        assert chunk_tokens(int(mask.numel()), VOCAB, chunk) == (chunk or mask.numel())
        r = _micro_loss(
            batch,
            update_context(
                _cfg(share, chunk), model, num_tokens=counts[0], num_sequences=counts[1]
            ),
        )
        r.out.loss.backward()
        results[chunk] = (r, _grads(model))
    (r0, g0), (r7, g7) = results[0], results[7]
    torch.testing.assert_close(r7.out.loss, r0.out.loss, atol=1e-6, rtol=1e-5)
    assert r7.entropy_sum == pytest.approx(r0.entropy_sum, rel=1e-5)
    for n in g0:
        _close(g7[n], g0[n], n)


@pytest.mark.slow
def test_bf16_autocast_chunks_match_one_piece():
    """Under bf16 autocast the recomputed chunks run in bf16 as their forward did: the same
    values as one piece under autocast, within bf16's rounding of the logits."""
    model = _qwen2(tied=True)
    samples = _samples(seed=5)
    out = {}
    for chunk in (0, 7):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp, _ = _chunked_scores(model, samples, False, chunk)
        mask = collate(samples, 0, "cpu").response_mask.bool()
        (lp * _weights(mask)).sum().backward()
        out[chunk] = (lp.detach(), _grads(model), mask)
    (lp0, g0, mask), (lp7, g7, _) = out[0], out[7]
    torch.testing.assert_close(lp7[mask], lp0[mask], atol=0.1, rtol=0)
    for n in g0:
        torch.testing.assert_close(g7[n], g0[n], atol=0.05, rtol=0.05, msg=n)


def test_chunk_size_from_the_budget():
    """A small vocabulary scores every token in one piece; a real one in chunks of what
    256 MiB of vocabulary-wide tensors hold; a user's chunk wins."""
    assert chunk_tokens(8 * 1024, 358) == 8 * 1024
    assert chunk_tokens(8 * 1024, 151_936) == 256 * 2**20 // (24 * 151_936) == 73
    assert chunk_tokens(8 * 1024, 151_936, 512) == 512
    assert chunk_tokens(5, 151_936, 512) == 5


def test_score_hidden_against_a_plain_loop():
    """One token at a time by hand: logits = W h, log-softmax of logits / temperature."""
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 11, bias=True)
    hidden, targets = torch.randn(2, 3, 4), torch.randint(0, 11, (2, 3))
    lp, ent = score_hidden(
        LMHead(head, softcap=1.5), hidden, targets, temperature=0.5, with_entropy=True, chunk=2
    )
    for b in range(2):
        for t in range(3):
            z = 1.5 * torch.tanh((head.weight @ hidden[b, t] + head.bias) / 1.5) / 0.5
            p = torch.softmax(z, 0)
            assert float(lp[b, t]) == pytest.approx(float(torch.log(p[targets[b, t]])), abs=1e-6)
            assert float(ent[b, t]) == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_two_ranks_chunked_match_full_logits(tmp_path, kind):
    """2 ranks (gloo), each scoring half the rows in 7-token chunks under DDP or FSDP2 (tied
    embeddings: the head's weight is the embedding's, in FSDP2's root group), give the whole
    batch's full-logits gradients."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from test_weight_sync import _free_port

    model = _qwen2(tied=True)
    samples = _samples()
    lp_ref, _, mask = _full_logits_scores(model, samples)
    (lp_ref * _weights(mask)).sum().backward()
    ref = _grads(model)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        f"--master-port={_free_port()}",
        str(Path(__file__).parent / "token_scores_worker.py"),
        kind,
        str(tmp_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "grads.pt")
    assert set(got) == set(ref)
    for n in ref:
        _close(got[n], ref[n], n)


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine",
    [
        pytest.param(
            "hf",
            marks=pytest.mark.skipif(
                not os.environ.get("RLVR_LONG_TESTS"),
                reason="minutes of CPU on top of the fast engine's case; RLVR_LONG_TESTS=1 runs it",
            ),
        ),
        "fast",
    ],
)
def test_one_step_at_a_real_vocabulary_stays_under_4_gib(tmp_path, tokenizer, engine):
    """`rlvr train`, one step: a 2-layer Qwen2 256 wide with Qwen's 151,936-token vocabulary,
    8 responses forced to 1,024 tokens, one micro-batch of 8. Their full fp32 logits alone
    would be 8,192 x 151,936 x 4 bytes = 5.0 GB; the whole process peaks under 4 GiB."""
    import json
    import subprocess
    import sys

    config = Qwen2Config(
        vocab_size=151_936,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    args = [
        "train",
        "--preset=grpo",
        f"--model.name_or_path={tmp_path / 'model'}",
        "--data.task=arithmetic",
        "--data.train_size=8",
        f"--rollout.engine={engine}",
        "--rollout.prompts_per_step=1",
        "--rollout.group_size=8",
        "--rollout.max_new_tokens=1024",
        "--rollout.min_new_tokens=1024",
        "--algo.kl_coef=0",
        "--algo.dynamic_sampling=false",
        "--optim.micro_batch_sequences=8",
        "--train.eval_size=0",
        "--train.threads=2",
        "--max-steps=1",
        f"--output-dir={tmp_path / 'run'}",
        "--no-progress",
    ]
    code = (
        "import json, resource, sys; from rlvr.cli import main; rc = main(sys.argv[1:]); "
        "print(json.dumps({'rc': rc, 'peak_kib': resource.getrusage(resource.RUSAGE_SELF)"
        ".ru_maxrss}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=2400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["response/length_mean"] == 1024
    assert got["peak_kib"] * 1024 <= 4 * 2**30, got
