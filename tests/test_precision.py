"""Mixed precision (`model.autocast`), gradient checkpointing, and training mode in the update."""

import copy

import pytest
import torch

from conftest import update_context
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.cpu.packed import packed_linears, packing_available
from rlvr.models import autocast
from rlvr.rollout import FastEngine, SamplingParams
from rlvr.training.update import policy_update
from test_update import _batch, _samples


def test_autocast_needs_fp32_weights():
    with pytest.raises(ConfigError, match=r"model\.autocast.*float32"):
        load_config(None, {"model": {"dtype": "bfloat16", "autocast": "bfloat16"}})
    cfg = load_config(None, {"model": {"autocast": "bfloat16"}})
    assert cfg.model.autocast == "bfloat16"


def _updated(model, cfg_overrides, seed=0):
    cfg = load_config(None, cfg_overrides)
    model, samples = copy.deepcopy(model), _batch(_samples(G=4, groups=2), cfg)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    torch.manual_seed(seed)
    metrics = policy_update(samples, update_context(cfg, model), opt, sched)
    return model, metrics


BASE = {"preset": "grpo", "rollout": {"group_size": 4, "prompts_per_step": 2}}


def test_bf16_autocast_update_keeps_fp32_weights_and_tracks_fp32(tiny_model):
    fp32, m32 = _updated(tiny_model, BASE)
    bf16, m16 = _updated(tiny_model, {**BASE, "model": {"autocast": "bfloat16"}})
    assert all(p.dtype == torch.float32 for p in bf16.parameters())
    assert m16["loss"] == pytest.approx(m32["loss"], abs=2e-2)
    # the same update up to bf16 rounding of the forward: every weight moved alike
    for (name, a), b, w in zip(bf16.named_parameters(), fp32.parameters(), tiny_model.parameters()):
        d16, d32 = a - w, b - w
        assert torch.linalg.vector_norm(d16 - d32) <= 0.1 * torch.linalg.vector_norm(d32) + 1e-6, (
            name
        )
    assert not bf16.training and not fp32.training  # the update left the policy in eval mode


def test_bf16_autocast_sampling_agrees_with_fp32(tiny_model, tokenizer):
    engine = FastEngine(tiny_model, pad_id=tokenizer.pad_token_id, eos_ids=[10_000])
    prompts = [tokenizer.encode("What is 3+4?"), tokenizer.encode("1+1")]
    params = SamplingParams(n=2, max_new_tokens=6, greedy=True)
    fp32 = engine.generate(prompts, params)
    with autocast("bfloat16", "cpu"):
        bf16 = engine.generate(prompts, params)
    diff = (bf16.sampling_log_probs - fp32.sampling_log_probs).abs()
    assert 0 < float(diff.max()) < 0.1  # computed in bf16 (not fp32), and close to it


@pytest.mark.skipif(not packing_available(), reason="torch built without oneDNN")
def test_packed_bf16_compute_matches_bf16_matmul():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(16, 64)
    with torch.no_grad():
        ref = torch.nn.functional.linear(
            x.bfloat16().float(), layer.weight.bfloat16().float(), layer.bias.bfloat16().float()
        )  # bf16-rounded operands, fp32 accumulation
        with packed_linears(layer, compute_dtype=torch.bfloat16):
            packed = layer(x)
    assert packed.dtype == torch.float32  # only the matmul ran in bf16
    torch.testing.assert_close(packed, ref, atol=1e-2, rtol=1e-2)
    assert not torch.allclose(packed, layer(x), atol=1e-5, rtol=0)  # and it did run in bf16


def test_gradient_checkpointing_gives_the_same_update(tiny_model):
    plain, _ = _updated(tiny_model, {**BASE, "optim": {"share_prompt": False}})
    model = copy.deepcopy(tiny_model)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    ckpt, _ = _updated(model, {**BASE, "optim": {"gradient_checkpointing": True}})
    for (name, a), b in zip(ckpt.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5, msg=name)


def test_gradient_checkpointing_turns_prompt_sharing_off():
    from rlvr.training.micro import shares_prompt
    from rlvr.training.settings import UpdateSettings

    def _share(cfg, model):
        return shares_prompt(UpdateSettings.from_config(cfg), model)

    on = load_config(None, {"optim": {"gradient_checkpointing": True}})
    off = load_config(None, {})
    assert off.optim.share_prompt and _share(off, torch.nn.Linear(1, 1))
    assert not _share(on, torch.nn.Linear(1, 1))


def test_lora_dropout_acts_in_the_update(tiny_model):
    """The update runs in training mode: LoRA dropout (0.5 here) makes two seeds differ; at 0
    they give the same weights."""
    peft = pytest.importorskip("peft")

    def lora(p):
        cfg = peft.LoraConfig(
            r=4, lora_alpha=8, lora_dropout=p, target_modules=["q_proj", "v_proj"]
        )
        torch.manual_seed(0)
        m = peft.get_peft_model(copy.deepcopy(tiny_model), cfg)
        for name, w in m.named_parameters():  # B starts at 0: give it values so A gets gradient
            if "lora_B" in name:
                torch.nn.init.normal_(w, std=0.1)
        return m.eval()

    def weights(model):
        return torch.cat([p.detach().flatten() for p in model.parameters() if p.requires_grad])

    for p, differ in [(0.5, True), (0.0, False)]:
        base = lora(p)
        a, _ = _updated(base, BASE, seed=1)
        b, _ = _updated(base, BASE, seed=2)
        assert (not torch.equal(weights(a), weights(b))) == differ, p


def test_config_turns_checkpointing_on(tiny_model_dir):
    from rlvr.training.policy import load_policy

    cfg = load_config(
        None,
        {"model": {"name_or_path": str(tiny_model_dir)}, "optim": {"gradient_checkpointing": True}},
    )
    model = load_policy(cfg, None, torch.device("cpu")).model
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
    assert layers  # every decoder layer recomputes in the backward
