"""The golden cases: what the policy loss, one update and a short training run give under
each preset, computed the same way by `make.py` (which stores them in golden.json) and by
tests/test_golden.py (which recomputes and compares).

Three levels:
  loss    `policy_loss` on fixed synthetic tensors: the loss, its gradient to the log-probs,
          the metrics (PPO clip, DAPO clip-higher, Dr. GRPO's normaliser, GSPO, dual clip,
          log-ratio clamp, KL estimators).
  update  one `policy_update` of a tiny Llama on a fixed batch (stale old log-probs so the
          clip bounds act, a reference so the KL acts), prompt sharing off and on: the
          metrics and the weights after it (an SGD step of lr 1, so the gradient).
  run     `rlvr train` for 2 steps of the built-in task from a tiny Llama, prompt sharing off
          and on: every step's metrics (wall-clock fields left out) and the final weights.
          `run2` is the same on 2 gloo ranks (dapo only).

Weights are stored as a fingerprint: the sha256 of their bytes (bit identity) and, per
tensor, the sum and the dot product with a fixed N(0, 1) vector in float64 (for the
tolerance comparison on another CPU).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent

# A digit anywhere in the response: a random model's groups are mixed, so every step trains.
ACCURACY = f"{TESTS / 'e2e_rewards.py'}:has_digit"

PRESETS = ["grpo", "dapo", "dr_grpo", "ppo", "reinforce_pp"]

# Variants beyond the presets: (name, preset, algo overrides).
VARIANTS = [
    *[(p, p, {}) for p in PRESETS],
    ("gspo", "grpo", {"ratio": "sequence", "clip_low": 3e-4, "clip_high": 4e-4, "kl_coef": 0.0}),
    ("rloo_dual", "dapo", {"advantage": "rloo", "dual_clip": 3.0}),
    ("clamp_k2", "grpo", {"log_ratio_clamp": 0.1, "kl_kind": "k2"}),
    ("gspo_clamp", "grpo", {"ratio": "sequence", "log_ratio_clamp": 0.05, "agg": "token_mean"}),
]

TOKEN_LEVEL_PRESETS = {"ppo", "reinforce_pp"}


def fingerprint(tensors: dict[str, torch.Tensor]) -> dict:
    h = hashlib.sha256()
    per = {}
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
        g = torch.Generator().manual_seed(len(name))
        r = torch.randn(t.numel(), generator=g, dtype=torch.float64)
        flat = t.reshape(-1).double()
        per[name] = [float(flat.sum()), float((flat * r).sum())]
    return {"sha256": h.hexdigest(), "per_tensor": per}


# ---------------------------------------------------------------- loss level


def _loss_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 7
    lengths = torch.tensor([7, 3, 5, 1, 6, 0])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logp = -torch.rand(B, T, generator=g) * 2 - 0.05
    old = logp + 0.4 * torch.randn(B, T, generator=g)
    ref = logp + 0.3 * torch.randn(B, T, generator=g)
    adv_seq = torch.randn(B, generator=g)
    adv_tok = torch.randn(B, T, generator=g)
    return logp, old, ref, adv_seq, adv_tok, mask


def loss_cases() -> dict:
    from rlvr.algos import policy_loss
    from rlvr.config.load import load_config

    out = {}
    logp0, old, ref, adv_seq, adv_tok, mask = _loss_inputs()
    for name, preset, algo in VARIANTS:
        a = load_config(None, {"preset": preset, "algo": algo}).algo
        for adv_kind, adv in (("seq", adv_seq), ("tok", adv_tok)):
            logp = logp0.clone().requires_grad_(True)
            res = policy_loss(
                logp,
                old,
                adv,
                mask,
                clip_low=a.clip_low,
                clip_high=a.clip_high,
                dual_clip=a.dual_clip,
                agg=a.agg,
                num_tokens=30.0,
                num_sequences=8.0,
                norm_constant=9.0,
                kl_coef=a.kl_coef if not a.kl_in_reward else 0.0,
                ref_log_probs=ref,
                kl_kind=a.kl_kind,
                ratio=a.ratio,
                log_ratio_clamp=a.log_ratio_clamp,
            )
            res.loss.backward()
            out[f"{name}/{adv_kind}"] = {
                "loss": float(res.loss.detach()),
                "grad": logp.grad.reshape(-1).tolist(),
                "metrics": res.metrics,
            }
    return out


# ---------------------------------------------------------------- update level


def _model():
    from rlvr.models import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    model = build_tiny_model(
        tok, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
        intermediate_size=64, max_position_embeddings=128,
    )  # fmt: skip
    return model, tok.pad_token_id


def _samples(groups: int = 4, G: int = 3, seed: int = 0):
    from rlvr.training.batch import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(groups):
        prompt = torch.randint(5, 100, (2 + 3 * k + int(torch.randint(0, 3, (1,), generator=g)),),
                               generator=g).tolist()  # fmt: skip
        for _ in range(G):
            n = int(torch.randint(1, 10, (1,), generator=g))
            out.append(
                Sample(
                    prompt_ids=prompt,
                    completion_ids=torch.randint(5, 100, (n,), generator=g).tolist(),
                    truncated=bool(torch.rand(1, generator=g) < 0.3),
                    reward=float(torch.rand(1, generator=g)),
                    correct=False,
                    group=k,
                )
            )
    return out


def _update_case(model, pad_id, preset, algo, share, stale):
    from rlvr.config.algorithm import Algorithm
    from rlvr.config.load import load_config
    from rlvr.training.batch import Batch
    from rlvr.training.settings import step_context
    from rlvr.training.update import advantages, batch_log_probs, policy_update

    cfg = load_config(
        None,
        {
            "preset": preset,
            "rollout": {"group_size": 3, "prompts_per_step": 4, "max_new_tokens": 12},
            "algo": algo,
            "optim": {"micro_batch_sequences": 5, "share_prompt": share, "max_grad_norm": 1.0},
        },
    )
    model = copy.deepcopy(model)
    samples = _samples()
    G = cfg.rollout.group_size
    batch = Batch.from_groups([samples[i : i + G] for i in range(0, len(samples), G)])
    g = torch.Generator().manual_seed(1)
    algorithm = Algorithm.from_config(cfg)
    u = step_context(cfg, algorithm, model, pad_id, "cpu")
    lp = batch_log_probs(model, batch, u)
    valid = (lp != 0).float()
    if preset in TOKEN_LEVEL_PRESETS:
        adv = torch.randn(lp.shape, generator=g) * valid
    else:
        adv = advantages(batch, algorithm, G)
    batch = replace(batch, advantages=adv)
    if stale:
        batch = replace(batch, old_log_probs=lp + 0.3 * torch.randn(lp.shape, generator=g) * valid)
    if cfg.algo.kl_coef > 0:
        batch = replace(batch, ref_log_probs=lp + 0.2 * torch.randn(lp.shape, generator=g) * valid)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    metrics = policy_update(batch, u, opt, sched)
    return {"metrics": metrics, "weights": fingerprint(dict(model.named_parameters()))}


def update_cases() -> dict:
    model, pad_id = _model()
    out = {}
    for name, preset, algo in VARIANTS:
        # stale: old log-probs that differ from the live ones, as after an earlier mini-batch
        for share, stale in ((False, True), (True, True), (False, False)):
            key = f"{name}/share={int(share)}/stale={int(stale)}"
            out[key] = _update_case(model, pad_id, preset, algo, share, stale)
    return out


# ---------------------------------------------------------------- run level


def _run_args(model_dir, run_dir, preset, share, nproc=1):
    return [
        sys.executable, "-m", "rlvr", "train", "--preset", preset,
        f"--model.name_or_path={model_dir}", f"--reward.accuracy={ACCURACY}",
        "--rollout.prompts_per_step=4", "--rollout.group_size=3",
        "--rollout.max_new_tokens=10", "--algo.overlong_cache=4",
        # a random model rarely ends a response: filtered, dapo would have no loss tokens
        "--algo.overlong_filter=false",
        "--rollout.seed_per_prompt=true", "--train.eval_size=0", "--data.train_size=32",
        "--optim.lr=1e-3", "--optim.micro_batch_sequences=5",
        f"--optim.share_prompt={'true' if share else 'false'}",
        "--train.threads=1", "--max-steps", "2", "--output-dir", str(run_dir),
        "--no-progress", "--nproc", str(nproc),
    ]  # fmt: skip


def _math(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))
         and k not in ("tokens_per_s", "timestamp", "wall_time")}
        for r in rows
    ]  # fmt: skip


def _final(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    return fingerprint(load_file(str(ckpt / "model.safetensors")))


def tiny_model_dir(root: Path) -> Path:
    from rlvr.models import build_tokenizer

    model, _ = _model()
    path = root / "tiny"
    model.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


def run_case(model_dir: Path, preset: str, share: bool, nproc: int = 1) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        res = subprocess.run(
            _run_args(model_dir, run_dir, preset, share, nproc),
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        if res.returncode != 0:
            raise AssertionError(res.stderr[-3000:])
        return {"metrics": _math(run_dir), "weights": _final(run_dir)}


def run_cases(model_dir: Path) -> dict:
    out = {}
    for preset in PRESETS:
        for share in (False, True):
            out[f"{preset}/share={int(share)}"] = run_case(model_dir, preset, share)
    return out


def environment() -> dict:
    """What decides the kernels, hence the bits: torch, its CPU capability (ATen's dispatch:
    AVX512, AVX2, DEFAULT), the processor (oneDNN and MKL pick kernels per model: an Intel and
    an AMD machine, both AVX512, differ at 1e-7), torch's thread count (a parallel reduction
    splits its sum by thread), whether rlvr's own C kernels are on, and transformers (the
    model code of the run level)."""
    import transformers

    from rlvr.cpu import native

    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": _cpu_model(),
        "native_kernels": native.available(),
        "threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"
