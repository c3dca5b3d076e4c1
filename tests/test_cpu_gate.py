"""The CPU backend's gate (`rlvr.cpu.enabled`): true only for fp32 weights on the CPU, and when
false nothing of the backend runs, not even at import: no module swapped, no transformers
function patched, no attention registered, nothing compiled, malloc not retuned.

Each check runs in a fresh process (what was imported, registered or built is per process),
with `RLVR_CACHE_DIR` pointed at an empty directory: where the kernels would be built."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlvr import cpu

BACKEND_MODULES = [
    f"rlvr.cpu.{m}"
    for m in ("native", "fused", "attention", "prefix_attention", "lean", "packed", "allocator")
] + ["rlvr.cpu.decoding"]

# What the process looks like to transformers and glibc: its attention and mask registries,
# the Llama and Qwen2 modeling modules' RoPE, the backend's modules, the kernel cache.
SNAPSHOT = """
import os, sys
import transformers.models.llama.modeling_llama as llama
import transformers.models.qwen2.modeling_qwen2 as qwen2
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

def snapshot():
    cache = os.environ["RLVR_CACHE_DIR"]
    return {
        "attention": {k: id(v) for k, v in ALL_ATTENTION_FUNCTIONS._global_mapping.items()},
        "masks": {k: id(v) for k, v in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.items()},
        "rope": [id(llama.apply_rotary_pos_emb), id(qwen2.apply_rotary_pos_emb)],
        "backend_modules": sorted(m for m in sys.modules if m.startswith("rlvr.cpu.")),
        "cache_files": sorted(
            os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs
        ) if os.path.isdir(cache) else [],
    }
"""

# Every forward call of every module (a global pre-hook, torch's own API): its class, whether
# an instance attribute shadows the class's forward, the RoPE function and attention
# implementation it ran with.
WATCH = """
import torch
seen = {"classes": set(), "shadowed": [], "rope": set(), "attn": set()}

def watch(module, args):
    seen["classes"].add(f"{type(module).__module__}.{type(module).__qualname__}")
    if "forward" in module.__dict__:
        seen["shadowed"].append(type(module).__name__)
    seen["rope"].add(id(llama.apply_rotary_pos_emb))
    seen["attn"].add(str(getattr(getattr(module, "config", None), "_attn_implementation", None)))

torch.nn.modules.module.register_module_forward_pre_hook(watch)

def report():
    return {k: sorted(v) if isinstance(v, set) else v for k, v in seen.items()}
"""


def _run(code: str, tmp_path, **env) -> dict:
    full_env = {**os.environ, "RLVR_CACHE_DIR": str(tmp_path / "cache"), **env}
    proc = subprocess.run(
        [sys.executable, "-c", SNAPSHOT + code],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _llama(**kw) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return LlamaForCausalLM(config).to(**kw)


def test_enabled_only_for_fp32_weights_on_the_cpu():
    assert cpu.enabled(_llama())
    assert not cpu.enabled(_llama(dtype=torch.bfloat16))
    assert not cpu.enabled(_llama(dtype=torch.float16))
    with torch.device("meta"):
        meta = _llama()
    assert not cpu.enabled(meta)
    mixed = _llama()
    mixed.lm_head.to(torch.bfloat16)  # one bf16 weight is enough to refuse
    assert not cpu.enabled(mixed)
    assert not cpu.enabled(torch.nn.Module())  # no weights: nothing to speed up
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the weights decide, not autocast
        assert cpu.enabled(_llama())
    assert cpu.backend(_llama()).on and not cpu.backend(meta).on


def test_importing_rlvr_changes_nothing(tmp_path):
    got = _run(
        """
import json
before = snapshot()
import rlvr, rlvr.cli, rlvr.rollout, rlvr.training.trainer, rlvr.cpu
print(json.dumps({"before": before, "after": snapshot()}))
""",
        tmp_path,
    )
    assert got["after"] == got["before"]
    assert got["after"]["backend_modules"] == [] and got["after"]["cache_files"] == []


def test_a_refused_model_gets_nothing_from_the_backend(tmp_path):
    """A model on the meta device (where no step can run): the gate says no, and what the
    trainer, the fast engine and the update would call of the backend does nothing."""
    got = _run(
        """
import json, torch
from transformers import LlamaConfig, LlamaForCausalLM
from rlvr import cpu
from rlvr.rollout import FastEngine
before = snapshot()
with torch.device("meta"):
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2))
backend = cpu.backend(model)
engine = FastEngine(model, pad_id=0, eos_ids=[1])
with backend.training_ops(model) as swapped:
    pass
out = {
    "on": backend.on,
    "engine_on": engine.backend.on,
    "swapped": swapped,
    "packed": backend.pack_frozen(model),
    "decoding": backend.decoding(model, pack_weights=True, prefix_attention=True, lean=True),
    "malloc": backend.tune_malloc(),
    "kernels": backend.kernels(),
    "forwards": sum("forward" in m.__dict__ for m in model.modules()),
}
print(json.dumps({"out": out, "before": before, "after": snapshot()}))
""",
        tmp_path,
    )
    out = got["out"]
    assert not out["on"] and not out["engine_on"]
    assert out["swapped"] == 0 and out["packed"] == 0 and out["decoding"] is None
    assert out["malloc"] == out["kernels"] == cpu.OFF_REASON
    assert out["forwards"] == 0
    assert got["after"] == got["before"]


TRAIN = (
    """
import json
from rlvr.config.load import load_config
from rlvr.training.trainer import train
before = snapshot()
cfg = load_config(None, {
    "preset": "grpo",
    "model": {"name_or_path": MODEL, "dtype": DTYPE},
    "rollout": {"engine": "fast", "prompts_per_step": 2, "group_size": 3, "max_new_tokens": 6},
    "algo": {"kl_coef": 0.04, "mini_batches": 2},
    "train": {"max_steps": 2, "eval_size": 4, "output_dir": "run", "save_every": 0},
    "data": {"train_size": 16},
})
"""
    + WATCH
    + """
run_dir = train(cfg, show_progress=False)
summary = json.loads((run_dir / "summary.json").read_text())
metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
print(json.dumps({"before": before, "after": snapshot(), "seen": report(), "summary": summary,
                  "steps": len(metrics), "metrics": metrics[-1]}))
"""
)


def _train(tmp_path, model_dir, dtype: str, **env) -> dict:
    code = TRAIN.replace("MODEL", repr(str(model_dir))).replace("DTYPE", repr(dtype))
    return _run(code, tmp_path, **env)


@pytest.mark.parametrize("native", ["1", "0"])
def test_training_a_bf16_model_leaves_transformers_and_malloc_alone(
    tmp_path, tiny_model_dir, native
):
    """Two real training steps (fast engine, a frozen reference, old log-probs) on CPU bf16
    weights: every module ran its own class's forward with transformers' own RoPE and SDPA
    attention, the registries are the same objects, no backend module was even imported, and
    no kernel was built."""
    got = _train(tmp_path, tiny_model_dir, "bfloat16", RLVR_NATIVE=native)
    assert got["steps"] == 2
    assert got["after"] == got["before"]
    assert got["after"]["backend_modules"] == [] and got["after"]["cache_files"] == []
    seen = got["seen"]
    assert seen["shadowed"] == []
    assert seen["rope"] == [got["before"]["rope"][0]]
    assert seen["attn"] == ["None", "sdpa"]  # modules without a config, and the attention
    assert not [c for c in seen["classes"] if c.startswith("rlvr.")]
    assert got["summary"]["native_kernels"] == got["summary"]["malloc_tuning"] == cpu.OFF_REASON
    assert "rollout/logprob_diff_mean" in got["metrics"]  # the fast engine's log-probs


def test_the_same_harness_sees_the_backend_on_an_fp32_model(tmp_path, tiny_model_dir):
    """The control: on fp32 weights the same run does use the backend, so the checks above
    can fail (with the kernels on: native passes swapped in during the forwards)."""
    from conftest import require_native_kernels

    require_native_kernels()
    got = _train(tmp_path, tiny_model_dir, "float32")
    assert "rlvr.cpu.fused" in got["after"]["backend_modules"]
    assert got["after"]["cache_files"]  # the kernels were built into RLVR_CACHE_DIR
    seen = got["seen"]
    assert "LlamaRMSNorm" in seen["shadowed"]
    assert len(seen["rope"]) > 1  # the native RoPE (a new wrapper each block) in the forwards
    assert "rlvr_attention" in seen["attn"]
    assert got["summary"]["native_kernels"] == "on"
