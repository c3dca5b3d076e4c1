"""`rlvr.cpu.attention`: the native masked attention, forward and backward, against SDPA, against a
plain loop over the formula, through a whole Qwen2, and what it declines."""

import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conftest import require_native_kernels
from rlvr.cpu import attention as A
from rlvr.cpu.fused import fused_ops

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler on this machine"
)


@pytest.fixture(autouse=True)
def _kernels_built():
    require_native_kernels()


def _prefix_mask(B, Lq, Lk, pads):
    """GRPO's shared-prompt mask: a left-padded prompt of Lk - Lq keys (the first pads[b] of
    row b are padding), then causal over the row's own Lq tokens."""
    P = Lk - Lq
    mask = torch.ones(B, 1, Lq, Lk, dtype=torch.bool)
    mask[:, :, :, P:] = torch.tril(torch.ones(Lq, Lq, dtype=torch.bool))
    for b, n in enumerate(pads):
        mask[b, :, :, :n] = False
    return mask


def _inputs(B, Hq, Hkv, Lq, Lk, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    # q as the attention forward makes it: a transposed view of a (B, Lq, Hq, D) buffer
    q = torch.randn(B, Lq, Hq, D, generator=g).transpose(1, 2).requires_grad_()
    k = torch.randn(B, Hkv, Lk, D, generator=g).requires_grad_()
    v = torch.randn(B, Hkv, Lk, D, generator=g).requires_grad_()
    return q, k, v


def _sdpa(q, k, v, mask, causal, scale):
    """SDPA in the (B, Lq, Hq, D) layout; rows with no visible key read as zero."""
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    ).transpose(1, 2)
    if mask is not None:
        seen = mask.expand(q.shape[0], q.shape[1], *mask.shape[2:]).any(-1).transpose(1, 2)
        out = torch.where(seen[..., None], out, 0.0)
    return out


def _compare(q, k, v, mask, causal):
    scale = q.shape[-1] ** -0.5
    got = A.attention(q, k, v, mask, causal=causal, scale=scale)
    assert got is not None
    want = _sdpa(q, k, v, mask, causal, scale)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    dout = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, (q, k, v), dout)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    for name, a, b in zip("qkv", got_grads, want_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"d{name}")


@pytest.mark.parametrize(
    "B, Hq, Hkv, Lq, Lk, D",
    [
        (3, 4, 4, 63, 110, 64),  # bench/vs_trl.py: 63 completion tokens over a 47-token prompt
        (2, 4, 2, 17, 40, 32),  # GQA, the built-in model's head size
        (2, 8, 1, 9, 30, 128),  # MQA, a large head
        (2, 2, 2, 130, 150, 32),  # more than one chunk of query rows in the backward
        (1, 2, 2, 1, 12, 64),  # one query: a decoding-shaped call
    ],
)
def test_prefix_masks_match_sdpa(B, Hq, Hkv, Lq, Lk, D):
    q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, D)
    mask = _prefix_mask(B, Lq, Lk, pads=[b % 4 for b in range(B)])
    _compare(q, k, v, mask, causal=False)


@pytest.mark.parametrize("Lq, Lk", [(37, 37), (20, 33)])
def test_causal_without_a_mask_and_no_mask_at_all_match_sdpa(Lq, Lk):
    q, k, v = _inputs(2, 4, 2, Lq, Lk, 64)
    _compare(q, k, v, None, causal=True)  # SDPA's is_causal: query i sees keys j <= i
    _compare(q, k, v, None, causal=False)


def test_masks_broadcast_over_batch_or_given_per_head():
    q, k, v = _inputs(2, 4, 2, 11, 19, 32)
    shared = _prefix_mask(1, 11, 19, pads=[3])
    _compare(q, k, v, shared, causal=False)
    per_head = torch.rand(2, 4, 11, 19, generator=torch.Generator().manual_seed(1)) > 0.4
    per_head[..., 0] = True  # every row sees something (fully masked rows: test below)
    _compare(q, k, v, per_head, causal=False)


def test_a_row_with_no_visible_key_gives_zeros_and_no_gradient():
    q, k, v = _inputs(2, 2, 2, 6, 6, 32)
    mask = torch.tril(torch.ones(6, 6, dtype=torch.bool)).expand(2, 1, 6, 6).clone()
    mask[0, :, :2, :] = False  # batch 0's first two queries see nothing (left padding)
    out = A.attention(q, k, v, mask, causal=False, scale=0.3)
    assert (out[0, :2] == 0).all() and torch.isfinite(out).all()
    (dq,) = torch.autograd.grad(out, (q,), torch.ones_like(out))
    assert (dq[0, :, :2] == 0).all() and torch.isfinite(dq).all()
    _compare(q, k, v, mask, causal=False)


def _loop_attention(q, k, v, mask, scale):
    """The formula, one query at a time in float64: out_i = sum_j softmax_j(s_ij) v_j over the
    keys the mask allows, s_ij = scale q_i . k_j; GQA reads KV head h // (Hq / Hkv)."""
    B, Hq, Lq, D = q.shape
    r = Hq // k.shape[1]
    out = torch.zeros(B, Lq, Hq, D, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            for i in range(Lq):
                seen = [j for j in range(k.shape[2]) if mask[b, 0, i, j]]
                s = [scale * float(q[b, h, i] @ k[b, h // r, j]) for j in seen]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                for wj, j in zip(w, seen):
                    out[b, i, h] += wj / sum(w) * v[b, h // r, j].double()
    return out


def test_matches_a_plain_loop_over_the_formula():
    q, k, v = _inputs(2, 4, 2, 9, 14, 32, seed=3)
    mask = _prefix_mask(2, 9, 14, pads=[0, 2])
    got = A.attention(q, k, v, mask, causal=False, scale=0.2)
    want = _loop_attention(q.detach(), k.detach(), v.detach(), mask, 0.2)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_declines_what_the_kernel_does_not_read():
    q, k, v = _inputs(1, 2, 2, 4, 4, 64)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    call = lambda *t, m=mask: A.attention(*t, m, causal=False, scale=1.0)  # noqa: E731
    assert call(q, k, v) is not None
    assert call(q.bfloat16(), k.bfloat16(), v.bfloat16()) is None  # bf16 autocast: SDPA
    assert call(*_inputs(1, 2, 2, 4, 4, 48)) is None  # a head size without a kernel variant
    assert call(*_inputs(1, 3, 2, 4, 4, 64)) is None  # heads not a multiple of KV heads
    assert call(q, k, v[:, :, :3]) is None  # k and v differ
    assert call(q, k, v, m=torch.zeros(1, 1, 4, 4)) is None  # a float (additive) mask
    assert call(q, k, v, m=mask.transpose(2, 3)) is None  # keys not contiguous in the mask
    assert call(q, k, v, m=torch.ones(1, 1, 4, 5, dtype=torch.bool)) is None  # wrong width
    assert call(q.transpose(2, 3).contiguous().transpose(2, 3), k, v) is None  # D strided


def test_keys_past_the_scratch_budget_go_to_sdpa(monkeypatch):
    q, k, v = _inputs(1, 2, 2, 4, 40, 64)
    assert A.attention(q, k, v, None, causal=True, scale=1.0) is not None
    monkeypatch.setattr(A, "SCRATCH_BUDGET", A._scratch_bytes(32, 64))
    assert A.attention(q, k, v, None, causal=True, scale=1.0) is None  # 40 keys: over it
    assert A.attention(q, k[:, :, :16], v[:, :, :16], None, causal=True, scale=1.0) is not None


def _config(cls, **kw):
    return cls(
        vocab_size=50,
        hidden_size=128,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
        **kw,
    )


@pytest.mark.parametrize("cls", [(Qwen2Config, Qwen2ForCausalLM), (LlamaConfig, LlamaForCausalLM)])
def test_a_whole_model_gives_sdpas_logits_and_gradients_on_left_padded_rows(cls):
    torch.manual_seed(0)
    model = cls[1](_config(cls[0]))
    ids = torch.randint(0, 50, (3, 12))
    attn = torch.ones(3, 12, dtype=torch.long)
    attn[1, :4], attn[2, :7] = 0, 0  # left padding, as the trainer collates prompts
    positions = (attn.cumsum(-1) - 1).clamp(min=0)

    def run():
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=attn, position_ids=positions).logits
        (logits * attn[..., None]).square().mean().backward()
        return logits.detach() * attn[..., None], {
            n: p.grad.clone() for n, p in model.named_parameters()
        }

    want_logits, want_grads = run()
    calls = []
    kernel = A._Attention.apply
    A._Attention.apply = lambda *a: calls.append(a[0].shape) or kernel(*a)
    try:
        with fused_ops(model):
            assert model.config._attn_implementation == A.NAME
            got_logits, got_grads = run()
    finally:
        A._Attention.apply = kernel
    assert model.config._attn_implementation == "sdpa"
    assert len(calls) == 2  # one per layer: the native pass ran, SDPA did not
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=1e-5)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_only_sdpa_models_of_the_llama_family_are_switched():
    eager = Qwen2ForCausalLM(_config(Qwen2Config)).eval()
    eager.config._attn_implementation = "eager"
    with A.native_attention(eager) as switched:
        assert not switched and eager.config._attn_implementation == "eager"
    sdpa = Qwen2ForCausalLM(_config(Qwen2Config))
    with A.native_attention(sdpa) as switched, A.native_attention(sdpa) as nested:
        assert switched and not nested  # nested: the outer block owns the switch
        assert sdpa.config._attn_implementation == A.NAME
    assert sdpa.config._attn_implementation == "sdpa"
