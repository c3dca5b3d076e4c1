"""`rlvr.cpu.fused`: native RMSNorm and SiLU-gate passes, forward and backward, against the modules
and the formulas; `fused_ops` swaps and restores module forwards without changing the math."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2 import modeling_qwen2

from conftest import require_native_kernels
from rlvr.cpu import fused

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler on this machine"
)


@pytest.fixture(autouse=True)
def _kernels_built():
    require_native_kernels()


def test_rms_norm_forward_and_backward_match_the_llama_norm():
    torch.manual_seed(0)
    norm = LlamaRMSNorm(40, eps=1e-5)
    with torch.no_grad():
        norm.weight.add_(torch.randn(40))
    x = (torch.randn(3, 7, 40) * 3).requires_grad_()
    dy = torch.randn(3, 7, 40)
    want = norm(x)
    gx, gw = torch.autograd.grad(want, (x, norm.weight), dy)
    got = fused.rms_norm(x, norm.weight, 1e-5)
    fx, fw = torch.autograd.grad(got, (x, norm.weight), dy)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fx, gx, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fw, gw, atol=1e-5, rtol=1e-5)
    row = x[1, 2].detach()  # the formula, one row
    expect = norm.weight * row / torch.sqrt(row.pow(2).mean() + 1e-5)
    torch.testing.assert_close(got[1, 2], expect, atol=1e-6, rtol=1e-5)


def test_silu_mul_forward_and_backward_match_torch():
    torch.manual_seed(0)
    g = (torch.randn(5, 3001) * 6).requires_grad_()  # odd size: the vector loop's tail
    u = torch.randn(5, 3001).requires_grad_()
    with torch.no_grad():
        g[0, :4] = torch.tensor([0.0, -90.0, 90.0, 1e-8])  # zero, both saturations, tiny
    dy = torch.randn(5, 3001)
    want = torch.nn.functional.silu(g) * u
    got = fused.silu_mul(g, u)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(got, (g, u), dy), torch.autograd.grad(want, (g, u), dy)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _rope_inputs(B=3, H=5, T=7, D=64, seed=0):
    """q as the attention forward makes it: a (B, H, T, D) view of a (B, T, H, D) buffer."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g).transpose(1, 2).requires_grad_()
    angles = torch.randn(B, T, D // 2, generator=g) * 3
    angles = torch.cat([angles, angles], -1)  # the halves repeat, as rotary embeddings make them
    return q, angles.cos(), angles.sin()


@pytest.mark.parametrize("D", [64, 6])
def test_rope_forward_and_backward_match_the_llama_family_function(D):
    q, cos, sin = _rope_inputs(D=D)
    dy = torch.randn(q.shape)
    want, _ = modeling_qwen2.apply_rotary_pos_emb(q, q, cos, sin)
    got = fused.rope(q, cos, sin)
    assert got.stride() == want.stride()  # the layout downstream ops would have seen
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    (g_got,) = torch.autograd.grad(got, q, dy)
    (g_want,) = torch.autograd.grad(want, q, dy)
    torch.testing.assert_close(g_got, g_want, atol=1e-6, rtol=1e-5)
    # the formula, one head of one token: [x1 c - x2 s, x2 c + x1 s] with c, s per half
    x, c, s = q[1, 2, 3].detach(), cos[1, 3, : D // 2], sin[1, 3, : D // 2]
    x1, x2 = x[: D // 2], x[D // 2 :]
    expect = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s])
    torch.testing.assert_close(got[1, 2, 3], expect, atol=1e-6, rtol=1e-5)


def test_rope_declines_what_the_kernel_does_not_read():
    q, cos, sin = _rope_inputs()
    assert fused.rope(q.detach().contiguous(), cos, sin) is None  # not the attention layout
    assert fused.rope(q, cos[:1], sin[:1]) is None  # broadcast over the batch
    assert fused.rope(q.double(), cos.double(), sin.double()) is None
    assert fused.rope(q, cos.requires_grad_(), sin) is None
    q7, cos7, sin7 = _rope_inputs(D=8)
    assert fused.rope(q7[..., :7], cos7[..., :7], sin7[..., :7]) is None  # odd D


def test_declines_what_the_kernels_do_not_read():
    w = torch.ones(8)
    assert fused.rms_norm(torch.randn(2, 8).double(), w.double(), 1e-6) is None
    assert fused.rms_norm(torch.randn(8, 2).t(), w, 1e-6) is None
    assert fused.rms_norm(torch.randn(2, 8), torch.ones(4), 1e-6) is None
    assert fused.silu_mul(torch.randn(2, 8).bfloat16(), torch.randn(2, 8).bfloat16()) is None
    assert fused.silu_mul(torch.randn(2, 8), torch.randn(2, 4)) is None


def _model():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return Qwen2ForCausalLM(config)


def test_fused_ops_give_the_modules_logits_and_gradients_and_restore_them():
    model = _model()
    ids = torch.randint(0, 40, (3, 9))

    def run():
        model.zero_grad()
        logits = model(input_ids=ids).logits
        logits.square().mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    want_logits, want_grads = run()
    original_rope = modeling_qwen2.apply_rotary_pos_emb
    with fused.fused_ops(model) as swapped:
        assert swapped == 2 * 2 + 1 + 2  # 2 norms per layer, the final norm, 2 MLPs
        assert modeling_qwen2.apply_rotary_pos_emb.rlvr_original is original_rope
        with fused.fused_ops(model):  # nested: not wrapped twice, and the outer one stays
            assert modeling_qwen2.apply_rotary_pos_emb.rlvr_original is original_rope
        assert modeling_qwen2.apply_rotary_pos_emb.rlvr_original is original_rope
        got_logits, got_grads = run()
    assert modeling_qwen2.apply_rotary_pos_emb is original_rope
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=1e-5)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    assert not [m for m in model.modules() if "forward" in vars(m)], "a forward was left swapped"


def test_under_bf16_autocast_the_mlp_keeps_its_own_math():
    model = _model()
    ids = torch.randint(0, 40, (2, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        want = model(input_ids=ids).logits
        with fused.fused_ops(model):
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)  # bf16 matmuls either way


def test_nothing_is_swapped_with_the_kernels_off(tmp_path):
    code = (
        "from transformers import Qwen2Config, Qwen2ForCausalLM\n"
        "from rlvr.cpu.fused import fused_ops\n"
        "m = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))\n"
        "with fused_ops(m) as n: print(n)\n"
    )
    env = {**os.environ, "RLVR_NATIVE": "0", "RLVR_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0"


def test_a_frozen_model_multiplies_with_weights_packed_once_and_keeps_autocast_and_grads():
    ref = _model().eval().requires_grad_(False)
    ids = torch.randint(0, 40, (2, 7))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    assert fused.pack_frozen_linears(ref) == 7 * 2 + 1
    assert fused.pack_frozen_linears(ref) == 0  # already packed: not wrapped twice
    with torch.no_grad():
        torch.testing.assert_close(ref(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast: the module's own bf16
            got = ref(input_ids=ids).logits
        assert got.dtype == torch.bfloat16  # the bf16 matmuls ran, not the fp32 packed ones
        torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
    x = torch.randn(3, 32, requires_grad=True)  # a gradient wanted: the module's own forward
    (dx,) = torch.autograd.grad(ref.lm_head(x).sum(), x)
    torch.testing.assert_close(dx, ref.lm_head.weight.sum(0).expand(3, -1))
    trainable = _model()
    assert fused.pack_frozen_linears(trainable) == 0  # weights that will change: never
