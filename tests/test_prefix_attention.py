"""Shared-prefix decode attention (`rlvr.cpu.prefix_attention`) against SDPA over the
expanded cache, a plain loop, and the `hf` engine on Llama and Qwen2."""

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from conftest import require_native_kernels
from rlvr.cpu import native
from rlvr.cpu.prefix_attention import (
    NAME,
    PrefixLayer,
    PrefixLayout,
    prefix_attention,
    prefix_decoding,
    supports_prefix_attention,
)
from rlvr.rollout import FastEngine, HFEngine, SamplingParams
from rlvr.rollout.live_cache import LiveLayer


@pytest.fixture(params=["torch", "native"])
def path(request):
    """Both implementations: the torch ops, and `rlvr.cpu.native`'s C kernel."""
    if request.param == "native":
        require_native_kernels()
    return request.param


def _case(expand, U=3, P=5, t=4, Hkv=2, r=2, D=8, seed=0, path="torch"):
    g = torch.Generator().manual_seed(seed)
    n = len(expand)
    expand = torch.tensor(expand)
    prompt_mask = torch.ones(U, P, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    prompt_mask[2, :1] = 0
    layer = PrefixLayer(max_new_tokens=t)
    k_p, v_p = (torch.randn(U, Hkv, P, D, generator=g) for _ in range(2))
    layer.update(k_p, v_p)
    k, v = (torch.randn(n, Hkv, t, D, generator=g) for _ in range(2))
    q = torch.randn(n, Hkv * r, 1, D, generator=g)
    layout = PrefixLayout.build([layer], prompt_mask, expand)
    layout.native = path == "native"
    return q, k, v, k_p, v_p, prompt_mask, expand, layout


def _check_path(path, layout, q, k, v):
    """The native case must really reach the kernel (not fall back because a layout differs)."""
    n, H, _, D = q.shape
    k_p, v_p = layout.layers[0].prefix
    bias = layout.bias.reshape(n, -1)
    assert native.fits(q.reshape(n, H, D), k_p, v_p, bias, layout.group, k, v), path


class _Attn(nn.Module):
    layer_idx = 0


def _sdpa_reference(q, k, v, k_p, v_p, prompt_mask, rows):
    """SDPA over each row's full cache: its prompt's keys (copied) then its own."""
    r = q.shape[1] // k.shape[1]
    keys = torch.cat([k_p[rows], k], dim=2).repeat_interleave(r, dim=1)
    values = torch.cat([v_p[rows], v], dim=2).repeat_interleave(r, dim=1)
    allowed = torch.cat([prompt_mask[rows].bool(), torch.ones(len(rows), k.shape[2]).bool()], 1)
    out = nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=allowed[:, None, None]
    )
    return out.transpose(1, 2)  # (n, 1, H, D)


@pytest.mark.parametrize(
    "expand",
    [[0, 0, 1, 1, 2, 2], [0, 1, 0, 2, 1, 0], [2, 2, 2, 0]],
    ids=["regular", "interleaved-duplicates", "uneven-groups"],
)
def test_matches_sdpa_over_the_expanded_cache(expand, path):
    q, k, v, k_p, v_p, mask, rows, layout = _case(expand, path=path)
    assert layout.regular == (expand == [0, 0, 1, 1, 2, 2])
    _check_path(path, layout, q, k, v)
    with _layout(layout):
        out, _ = prefix_attention(_Attn(), q, k, v, None)
    torch.testing.assert_close(
        out, _sdpa_reference(q, k, v, k_p, v_p, mask, rows), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    "shape",
    [
        dict(),
        dict(P=1, t=1, D=7),
        dict(P=9, t=13, Hkv=1, r=4, D=5),
        dict(Hkv=3, r=1, D=64),
        dict(P=6, t=3, D=32),
        dict(P=2, t=7, Hkv=1, r=2, D=128),
    ],
    ids=["default", "one-each-odd-D", "mqa", "mha-D64", "D32", "mqa-D128"],
)
def test_matches_a_loop_after_retiring_rows(path, shape):
    q, k, v, k_p, v_p, mask, rows, layout = _case([0, 0, 1, 1, 2, 2], path=path, **shape)
    keep = torch.tensor([1, 2, 5])
    layout.select(keep)
    q, k, v = q[keep], k[keep], v[keep]
    _check_path(path, layout, q, k, v)
    with _layout(layout):
        out, _ = prefix_attention(_Attn(), q, k, v, None)
    r, D = q.shape[1] // k.shape[1], q.shape[-1]
    for i, row in enumerate(rows[keep].tolist()):  # one row, one head at a time
        real = mask[row].bool()
        for h in range(q.shape[1]):
            keys = torch.cat([k_p[row, h // r][real], k[i, h // r]])
            values = torch.cat([v_p[row, h // r][real], v[i, h // r]])
            w = torch.softmax(keys @ q[i, h, 0] / D**0.5, dim=0)
            torch.testing.assert_close(out[i, 0, h], w @ values, atol=1e-5, rtol=1e-5)


def test_own_tokens_read_from_a_slice_of_the_preallocated_buffer(path):
    """In decoding the own keys are the first t slots of a (n, Hkv, T, D) buffer: strided."""
    q, k, v, k_p, v_p, mask, rows, layout = _case([0, 0, 1, 1, 2, 2], t=3, path=path)
    big_k, big_v = torch.randn(6, 2, 10, 8), torch.randn(6, 2, 10, 8)
    big_k[:, :, :3], big_v[:, :, :3] = k, v
    _check_path(path, layout, q, big_k[:, :, :3], big_v[:, :, :3])
    with _layout(layout):
        out, _ = prefix_attention(_Attn(), q, big_k[:, :, :3], big_v[:, :, :3], None)
    torch.testing.assert_close(
        out, _sdpa_reference(q, k, v, k_p, v_p, mask, rows), atol=1e-5, rtol=1e-5
    )


class _layout:
    """Set the layout the way `prefix_decoding` does, without a model."""

    def __init__(self, layout):
        from rlvr.cpu import prefix_attention as pa

        self.pa, self.layout = pa, layout

    def __enter__(self):
        self.token = self.pa._LAYOUT.set(self.layout)

    def __exit__(self, *exc):
        self.pa._LAYOUT.reset(self.token)


def test_refuses_outside_decoding():
    q = torch.randn(2, 2, 1, 4)
    with pytest.raises(RuntimeError, match="decoding steps only"):
        prefix_attention(_Attn(), q, q, q, None)


@pytest.fixture(params=["llama", "qwen2"])
def model(request, tiny_model_dir, tiny_qwen2_dir):
    path = tiny_model_dir if request.param == "llama" else tiny_qwen2_dir
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():  # at init these are nearly uniform: scale so greedy paths vary
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


def test_greedy_same_tokens_as_hf_and_attention_restored(model, tokenizer):
    assert supports_prefix_attention(model)
    prompts = [tokenizer.encode(s) for s in ["What is 2+3?", "hi", "Compute 17*3.", "hi"]]
    params = SamplingParams(n=3, max_new_tokens=12, greedy=True)
    hf = HFEngine(model, pad_id=tokenizer.pad_token_id, eos_ids=[10_000]).generate(prompts, params)
    before = model.config._attn_implementation
    fast = FastEngine(model, pad_id=tokenizer.pad_token_id, eos_ids=[10_000])
    # the path under test: the gate is on and the engine's cache takes prefix layers
    plan = fast.backend.decoding(model, pack_weights=True, prefix_attention=True, lean=False)
    cache = fast._new_cache(8)
    plan.prepare(cache, 12, 12, plain_layers=all(type(x) is LiveLayer for x in cache.layers))
    assert all(isinstance(x, PrefixLayer) for x in cache.layers)
    out = fast.generate(prompts, params)
    assert torch.equal(out.completion_ids, hf.completion_ids)
    assert model.config._attn_implementation == before != NAME


def test_prefix_decoding_restores_after_an_exception(model):
    before = model.config._attn_implementation
    layout = _case([0, 0])[-1]
    with pytest.raises(RuntimeError, match="boom"), prefix_decoding(model, layout):
        assert model.config._attn_implementation == NAME
        raise RuntimeError("boom")
    assert model.config._attn_implementation == before
