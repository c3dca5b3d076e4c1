"""oneDNN-packed linears (`rlvr.cpu.packed`): same math as `F.linear` up to float
reassociation, every plain linear packed, everything restored afterwards."""

import pytest
import torch
from torch import nn

from conftest import require_native_kernels
from rlvr.cpu.packed import packed_linears, packing_available
from rlvr.models import build_tiny_model

pytestmark = pytest.mark.skipif(not packing_available(), reason="torch built without oneDNN")


@pytest.fixture()
def model(tokenizer):
    return build_tiny_model(
        tokenizer, seed=0, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        intermediate_size=128, max_position_embeddings=128,
    ).eval()  # fmt: skip


def _linears(model):
    return [m for m in model.modules() if type(m) is nn.Linear]


@pytest.mark.parametrize("rows", [1, 5, 32, 200])
def test_linear_matches_plain_for_any_row_count(rows):
    torch.manual_seed(0)
    layer = nn.Linear(96, 80)
    x = torch.randn(rows, 3, 96)
    with torch.no_grad():
        plain = layer(x)
        with packed_linears(layer, rows_hint=32) as n:
            assert n == 1
            packed = layer(x)
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=1e-5)
    # the loop reference: one row at a time, x @ W^T + b
    with torch.no_grad():
        loop = torch.stack([xi @ layer.weight.T + layer.bias for xi in x])
    torch.testing.assert_close(packed, loop, atol=1e-5, rtol=1e-5)


def test_model_logits_match_and_forward_is_restored(model, tokenizer):
    ids = torch.tensor([tokenizer.encode("What is 12+30?"), tokenizer.encode("Add 7 and 8...")])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with packed_linears(model) as n:
            assert n == len(_linears(model)) == 2 * 7 + 1  # q k v o gate up down, lm_head
            assert all("forward" in vars(m) for m in _linears(model))
            packed = model(input_ids=ids).logits
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=1e-5)
    assert not any("forward" in vars(m) for m in _linears(model))
    loss = model(input_ids=ids).logits.sum()  # autograd works again on the plain forward
    loss.backward()
    assert model.lm_head.weight.grad is not None


def test_restored_after_an_exception(model):
    with pytest.raises(RuntimeError, match="boom"), packed_linears(model):
        raise RuntimeError("boom")
    assert not any("forward" in vars(m) for m in _linears(model))


def test_packs_the_weight_of_the_moment(model, tokenizer):
    """Packing happens on entry: a later rollout sees weights changed by an optimiser step."""
    ids = torch.tensor([tokenizer.encode("1+1=")])
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
        plain = model(input_ids=ids).logits
        with packed_linears(model):
            packed = model(input_ids=ids).logits
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=1e-5)


def test_bf16_and_mixed_dtype_inputs():
    torch.manual_seed(0)
    layer = nn.Linear(64, 48).to(torch.bfloat16)
    x = torch.randn(8, 64)
    with torch.no_grad():
        plain = layer(x.bfloat16()).float()
        with packed_linears(layer):
            packed = layer(x.bfloat16()).float()
            with pytest.raises(RuntimeError):  # fp32 into a bf16 layer fails as it does plainly
                layer(x)
    torch.testing.assert_close(packed, plain, atol=2e-2, rtol=2e-2)


def test_subclasses_and_non_cpu_weights_are_left_alone():
    class MyLinear(nn.Linear):
        pass

    net = nn.Sequential(MyLinear(4, 4), nn.Linear(4, 4))
    with packed_linears(net) as n:
        assert n == 1 and "forward" not in vars(net[0]) and "forward" in vars(net[1])


def _loop_linear(x, w, b):
    """One output element at a time: y[m][n] = sum_k x[m][k] w[n][k] + b[n] (float64)."""
    x2, w2 = x.reshape(-1, x.shape[-1]).double(), w.double()
    y = torch.zeros(x2.shape[0], w.shape[0], dtype=torch.float64)
    for m in range(x2.shape[0]):
        for n in range(w.shape[0]):
            y[m, n] = (x2[m] * w2[n]).sum() + (0.0 if b is None else float(b[n]))
    return y.reshape(*x.shape[:-1], w.shape[0])


@pytest.mark.parametrize(
    "rows, K, N, bias", [(32, 64, 96, True), (13, 40, 70, False), (1, 17, 5, True)]
)
def test_native_decode_linear_and_its_epilogues_match_a_loop(rows, K, N, bias):
    """The decoding-step kernel on panel-packed weights: full and partial row blocks and
    panels, with and without bias, each fused epilogue of the lean decoder."""
    from rlvr.cpu.packed import pack_linear, pack_panels

    require_native_kernels()
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(N, K, generator=g), torch.randn(rows, K, generator=g)
    b = torch.randn(N, generator=g) if bias else None
    other = torch.randn(rows, N, generator=g)
    packed = pack_linear(w, b, rows_hint=32)
    assert packed.panels is not None  # the native kernel, not oneDNN
    y = _loop_linear(x, w, b).float()
    torch.testing.assert_close(packed(x), y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        packed.unary(x, "swish"), nn.functional.silu(y), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(packed.binary(x, other, "add"), y + other, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.binary(x, other, "mul"), y * other, atol=1e-5, rtol=1e-5)
    # what the kernel does not read (a strided input) takes F.linear, epilogue included
    xt = torch.randn(rows, 2 * K, generator=g)[:, ::2]
    torch.testing.assert_close(
        packed.unary(xt, "swish"),
        nn.functional.silu(xt @ w.T + (0 if b is None else b)),
        atol=1e-5,
        rtol=1e-5,
    )
    assert packed.panels(xt) is None
    assert packed.panels(x[:, :-1].contiguous()) is None  # another K
    assert packed.panels(x, "add", other[:, :-1].contiguous()) is None  # another shape
    assert packed.panels(x, "add") is None  # an epilogue without its operand
    assert pack_panels(w, torch.zeros(N + 1)) is None  # a bias of another width
    assert pack_linear(w, b, rows_hint=1024).panels is None  # large calls: oneDNN
