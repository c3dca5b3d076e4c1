"""`rlvr.fused`: native RMSNorm and SiLU-gate passes, forward and backward, against the modules
and the formulas; `fused_ops` swaps and restores module forwards without changing the math."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from rlvr import fused
from rlvr.rollout import native

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler on this machine"
)


@pytest.fixture(autouse=True)
def _kernels_built():
    assert native.kernel() is not None, native.status()


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
    with fused.fused_ops(model) as swapped:
        assert swapped == 2 * 2 + 1 + 2  # 2 norms per layer, the final norm, 2 MLPs
        got_logits, got_grads = run()
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
        "from rlvr.fused import fused_ops\n"
        "m = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64,"
        " num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))\n"
        "with fused_ops(m) as n: print(n)\n"
    )
    env = {**os.environ, "RLVR_NATIVE": "0", "RLVR_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0"
