"""Weight sync to an inference engine: what the receiver gets is what the policy computes.

The receiver is a plain object with vLLM's `load_weights(iterable of (name, tensor))` shape
that keeps what it is handed, the harshest loader: anything that aliases a parameter the
sync later changes back (PEFT's in-place unmerge) shows up in what it kept."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvr.models import build_tiny_model, build_tokenizer
from rlvr.rollout.weight_sync import base_name, push_weights, trainable_names

peft = pytest.importorskip("peft")


class KeepingReceiver:
    def __init__(self):
        self.got: dict[str, torch.Tensor] = {}
        self.calls = 0

    def load_weights(self, weights):
        self.calls += 1
        for name, tensor in weights:
            assert name not in self.got, f"{name} sent twice"
            self.got[name] = tensor


def _tiny():
    tok = build_tokenizer()
    return build_tiny_model(
        tok,
        seed=0,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        max_position_embeddings=128,
    )


def _lora(targets=("q_proj", "v_proj", "down_proj"), r=4, alpha=8.0, dora=False):
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), use_dora=dora)
    model = peft.get_peft_model(_tiny(), config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B starts at zero in PEFT: a merge would then change nothing
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.eval()


def test_base_names():
    assert base_name("base_model.model.model.layers.0.mlp.down_proj.base_layer.weight") == (
        "model.layers.0.mlp.down_proj.weight"
    )
    assert base_name("base_model.model.model.layers.0.mlp.down_proj.lora_A.default.weight") is None
    assert base_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert base_name("base_model.model.lm_head.original_module.weight") is None
    assert base_name("model.layers.1._checkpoint_wrapped_module.mlp.up_proj.weight") == (
        "model.layers.1.mlp.up_proj.weight"
    )
    assert base_name("model.norm.weight") == "model.norm.weight"


def test_lora_receiver_gets_the_merged_weights_and_the_model_stays_unmerged():
    model = _lora()
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    logits_before = model(input_ids=ids).logits
    # The merge computed independently: W + (alpha / r) * B @ A per targeted module.
    expected = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            A, B = module.lora_A["default"].weight, module.lora_B["default"].weight
            w = module.base_layer.weight.detach()
            expected[base_name(f"{name}.base_layer.weight")] = w + (8.0 / 4) * (B @ A)
    assert len(expected) == 2 * 3
    receiver = KeepingReceiver()
    sent = push_weights(receiver, model)
    assert receiver.calls == 1 and set(sent) == set(receiver.got)
    for name, want in expected.items():
        torch.testing.assert_close(receiver.got[name], want, rtol=1e-6, atol=1e-6)
        assert not torch.equal(
            receiver.got[name], before[f"base_model.model.{name}"[:-7] + ".base_layer.weight"]
        )
    # Every other base weight is sent as is; no adapter tensor is sent.
    plain = {
        base_name(n): p for n, p in before.items() if base_name(n) and base_name(n) not in expected
    }
    assert set(receiver.got) == set(expected) | set(plain)
    for name, p in plain.items():
        assert torch.equal(receiver.got[name], p)
    # Unmerged afterwards: parameters and outputs as before the sync.
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    assert not any(getattr(m, "merged", False) for m in model.modules())
    torch.testing.assert_close(model(input_ids=ids).logits, logits_before)


def test_a_lora_variant_is_merged_by_peft_and_unmerged_after():
    """DoRA has no out-of-place delta: PEFT's in-place merge, each tensor cloned before the
    unmerge, which restores the weights up to rounding (W + d - d)."""
    model = _dora = _lora(dora=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    reference = KeepingReceiver()
    model.merge_adapter()
    for name, p in model.named_parameters():
        if base_name(name):
            reference.got[base_name(name)] = p.detach().clone()
    model.unmerge_adapter()
    receiver = KeepingReceiver()
    push_weights(receiver, _dora)
    assert set(receiver.got) == set(reference.got)
    for name, t in reference.got.items():
        torch.testing.assert_close(receiver.got[name], t)
    assert not any(getattr(m, "merged", False) for m in model.modules())
    for n, p in model.named_parameters():
        torch.testing.assert_close(p, before[n], rtol=0, atol=1e-6)


def test_only_changed_weights_are_sent_under_lora():
    model = _lora(targets=("q_proj",))
    names = trainable_names(model)
    assert names == {f"model.layers.{i}.self_attn.q_proj.weight" for i in range(2)}
    receiver = KeepingReceiver()
    assert sorted(push_weights(receiver, model, only=names)) == sorted(names)


def test_trainable_names_of_a_plain_model_follow_requires_grad():
    model = _tiny()
    assert trainable_names(model) >= {n for n, _ in model.named_parameters()}
    model.model.embed_tokens.requires_grad_(False)
    assert "model.embed_tokens.weight" not in trainable_names(model)


def test_a_failing_receiver_leaves_the_model_unmerged():
    model = _lora()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    class Failing:
        def load_weights(self, weights):
            next(iter(weights))
            raise ValueError("loader broke")

    with pytest.raises(ValueError, match="loader broke"):
        push_weights(Failing(), model)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_merge_runs_outside_autocast():
    model = _lora()
    exact = KeepingReceiver()
    push_weights(exact, model)
    under = KeepingReceiver()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        push_weights(under, model)
    for name, t in exact.got.items():
        assert under.got[name].dtype == torch.float32
        assert torch.equal(under.got[name], t), name


@pytest.mark.slow
def test_fsdp2_receiver_gets_whole_tensors(tmp_path):
    """2 gloo ranks under torchrun: 17-21 s on 2 shared cores, mostly two interpreters starting."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        f"--master-port={_free_port()}",
        str(Path(__file__).parent / "fsdp2_sync_worker.py"),
        str(tmp_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["sharded"] > 0  # the parameters really were DTensor shards
        assert result["outside"], "outside a gather: full_tensor() per parameter"
        assert result["inside"], "inside gathered(): the unsharded parameters"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
