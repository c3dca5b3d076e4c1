"""The lean decoding step (`rlvr.cpu.lean`) against the model's own modules: same next-token
logits within 1e-5 on Llama, Qwen2 (q/k/v biases) and Qwen3 (per-head q/k norms), with GQA,
left padding and duplicated prompts; and refusal where a part is not the plain one."""

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from conftest import require_native_kernels
from rlvr.cpu.lean import LeanDecoder
from rlvr.cpu.packed import packing_available
from rlvr.cpu.prefix_attention import PrefixLayer, PrefixLayout, prefix_decoding
from rlvr.rollout import FastEngine, HFEngine, SamplingParams, left_pad
from rlvr.rollout.live_cache import LiveLayer

pytestmark = pytest.mark.skipif(not packing_available(), reason="torch built without oneDNN")

SHAPE = dict(
    vocab_size=50,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _qwen2_v_without_bias():
    """q and k with biases, v without: the fused q/k/v bias must add zeros for v."""
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    for layer in model.model.layers:
        layer.self_attn.v_proj.bias = None
    return model


FAMILIES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, attention_bias=True)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16)),
    "qwen2-mixed-bias": _qwen2_v_without_bias,
    # head sizes the native attention kernel has unrolled variants for (others: generic)
    "llama-D32": lambda: LlamaForCausalLM(LlamaConfig(**{**SHAPE, "hidden_size": 128})),
    "qwen2-D128": lambda: Qwen2ForCausalLM(
        Qwen2Config(**{**SHAPE, "hidden_size": 256, "num_attention_heads": 2})
    ),
}


@pytest.fixture(params=list(FAMILIES))
def model(request):
    torch.manual_seed(0)
    model = FAMILIES[request.param]().eval()
    with torch.no_grad():  # spread the logits so that greedy paths differ between rows
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
            elif p.dim() == 1:  # biases and norm weights away from 0 and 1
                p.add_(0.1 * torch.randn_like(p))
    return model


def _prefilled(model, prompts, G):
    """A cache of PrefixLayers after the modules' prefill, and the decoding layout."""
    engine = FastEngine(model, pad_id=0, eos_ids=[999])
    ids, mask = left_pad(prompts, 0, "cpu")
    cache = engine._new_cache(ids.shape[1] + 8)
    assert all(type(layer) is LiveLayer for layer in cache.layers)
    cache.layers = [PrefixLayer(8) for _ in cache.layers]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    expand = torch.arange(len(prompts)).repeat_interleave(G)
    return cache, PrefixLayout.build(cache.layers, mask, expand), mask.sum(-1)[expand]


@pytest.fixture(params=["torch", "native"])
def path(request):
    """The lean step's attention: torch ops, or `rlvr.cpu.native`'s fused RoPE + cache
    write + attention kernel."""
    if request.param == "native":
        require_native_kernels()
    return request.param


def test_step_logits_match_the_modules(model, path):
    """Four steps, rows retired after the second; the reference is the modules with the
    torch attention path."""
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    lean = LeanDecoder.build(model, rows=6)
    assert lean is not None
    c_lean, lay_lean, pos = _prefilled(model, prompts, G=2)
    c_ref, lay_ref, _ = _prefilled(model, prompts, G=2)
    lay_lean.native, lay_ref.native = path == "native", False
    tokens = torch.tensor([20, 21, 22, 23, 24, 25])
    for t in range(4):  # the own-token cache grows in both
        if t == 2:  # retire rows 1, 3 and 4, as the engine does
            keep = torch.tensor([0, 2, 5])
            for cache, lay in ((c_lean, lay_lean), (c_ref, lay_ref)):
                cache.reorder_cache(keep)
                lay.select(keep)
            tokens, pos = tokens[keep], pos[keep]
        with prefix_decoding(model, lay_lean):
            got = lean.step(tokens, pos + t, c_lean)
        with prefix_decoding(model, lay_ref), torch.no_grad():
            want = model(
                input_ids=tokens[:, None], position_ids=(pos + t)[:, None], cache=c_ref
            ).logits[:, -1]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        tokens = want.argmax(-1)
    assert [layer.live for layer in c_lean.layers] == [4] * len(c_lean.layers)


def test_greedy_same_tokens_as_hf(model):
    prompts = [[5, 6, 7, 8, 9], [10, 11], [5, 6, 7, 8, 9]]  # a duplicate: irregular layout
    params = SamplingParams(n=3, max_new_tokens=10, greedy=True)
    hf = HFEngine(model, pad_id=0, eos_ids=[999]).generate(prompts, params)
    for lean in (True, False):
        out = FastEngine(model, pad_id=0, eos_ids=[999], lean=lean).generate(prompts, params)
        assert torch.equal(out.completion_ids, hf.completion_ids), lean
    assert len({tuple(r) for r in hf.completion_ids.tolist()}) > 1  # the rows do differ


def test_refuses_what_it_does_not_implement(model):
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert LeanDecoder.build(lora.base_model.model, rows=4) is None  # LoRA-wrapped q_proj
    assert LeanDecoder.build(torch.nn.Linear(2, 2), rows=4) is None


def test_fp16_weights_keep_the_module_path(model):
    """oneDNN packs fp32 and bf16 only: an fp16 model decodes through its modules."""
    assert LeanDecoder.build(model.half(), rows=4) is None
