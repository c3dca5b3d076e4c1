"""One check of scripts/gpu_check.sh; prints one result line, `RESULT NAME: PASS|FAIL ...`.

    python scripts/gpu_check.py engine {hf,fast,vllm} [--device cuda] [--autocast bfloat16]
    python scripts/gpu_check.py train {fp32,bf16,lora,nccl2,vllm} [--device cuda] [--steps 20]

`engine`: the built-in model samples 8 prompts x 8 responses; the engine's own log-probs of
its samples (fast, vllm) are compared with the trainer's forward on the same sequences (max
absolute difference over response tokens), which, unlike exact greedy tokens, does not flip
at near-ties between two numerically different kernels; hf (no own log-probs) is checked for
well-formed rollouts and finite trainer log-probs. `vllm` prints `vllm: not installed` when
vllm cannot be imported. `train`: `rlvr train` for a few DAPO steps; finite losses, the
held-out accuracy before and after, generation and end-to-end tokens/s.
Exit status 0 on PASS or not installed, 1 on FAIL.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = [
    "Compute 12+34.",
    "Compute 50-7.",
    "What is 9*8?",
    "Sort: 3 1 2",
    "Compute 100-58.",
    "What is 6+7?",
    "Compute 81-19.",
    "What is 4*12?",
]
# Max |engine - trainer| log-prob over response tokens, by engine and precision: the fast
# engine runs the trainer's own module (fp32: rounding only, 3.9e-05 measured on the CPU);
# vLLM its own kernels.
# Under bf16 single tokens of low probability can move by more, so there the mean is bounded.
TOLERANCE = {("fast", "none"): 1e-3, ("vllm", "none"): 2e-3, ("vllm", "bfloat16"): 0.02}


def check_engine(
    name: str, device: str, autocast: str = "none", quick: bool = False
) -> tuple[bool, str]:
    from rlvr.models import autocast as autocast_ctx
    from rlvr.models import eos_ids, load_model, load_tokenizer
    from rlvr.rollout import ENGINES, SamplingParams
    from rlvr.training.batch import rollout_log_probs

    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        return True, "not installed"
    tok = load_tokenizer("rlvr-tiny")
    model = load_model("rlvr-tiny", device=device).eval()
    kw = dict(pad_id=tok.pad_token_id, eos_ids=eos_ids(tok, model))
    if name == "vllm":
        kw.update(device=torch.device(device), autocast=autocast)
    engine = ENGINES[name](model, **kw)
    prompts = [tok(p)["input_ids"] for p in PROMPTS[: 2 if quick else None]]
    n = 2 if quick else 8
    params = SamplingParams(
        n=n,
        max_new_tokens=8 if quick else 48,
        seed=1,
        row_seeds=tuple(range(101, 101 + len(prompts))),
    )
    if not quick:
        engine.generate(prompts, params)  # warm-up (compilation, CUDA graphs, cache)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with autocast_ctx(autocast, torch.device(device)):
        out = engine.generate(prompts, params)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens = int(out.lengths.sum())
    with autocast_ctx(autocast, torch.device(device)):
        ours = rollout_log_probs(model, out, tok.pad_token_id)
    mask = out.response_mask.bool()[:, : ours.shape[1]]
    speed = f"{tokens / seconds:,.0f} tok/s ({tokens} tokens)"
    well_formed = out.completion_ids.shape[0] == len(prompts) * n and tokens > 0
    if not well_formed or not torch.isfinite(ours[mask]).all():
        return False, f"malformed rollout or non-finite trainer log-probs; {speed}"
    if out.sampling_log_probs is None:
        return True, f"rollout well-formed, trainer log-probs finite; {speed}"
    diff = (ours[mask] - out.sampling_log_probs[:, : ours.shape[1]][mask]).abs()
    tol = TOLERANCE[(name, autocast)]
    bounded = diff.mean().item() if autocast == "bfloat16" else diff.max().item()
    what = "mean" if autocast == "bfloat16" else "max"
    return bounded <= tol, (
        f"{what} |logp - trainer's| {bounded:.2e} (tol {tol:.0e}; max {diff.max().item():.2e}, "
        f"mean {diff.mean().item():.2e}); {speed}"
    )


TRAIN = {
    "fp32": [],
    "bf16": ["--model.autocast=bfloat16"],
    "lora": ["--model.lora_rank=8", "--model.lora_alpha=16"],
    "nccl2": ["--nproc", "2"],
    "vllm": ["--rollout.engine=vllm", "--model.autocast=bfloat16"],
}


def check_train(kind: str, device: str, steps: int) -> tuple[bool, str]:
    from rlvr.cli.main import main

    if kind == "nccl2" and torch.cuda.device_count() < 2:
        return True, f"skipped ({torch.cuda.device_count()} GPU)"
    if kind == "vllm" and importlib.util.find_spec("vllm") is None:
        return True, "not installed"
    engine = [] if kind == "vllm" else ["--rollout.engine=fast"]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        argv = [
            "train",
            f"--model.device={device}",
            f"--max-steps={steps}",
            "--rollout.prompts_per_step=32",
            "--rollout.group_size=8",
            "--train.eval_size=64",
            "--output-dir",
            str(run),
            "--no-progress",
            *engine,
            *TRAIN[kind],
        ]
        rc = main(argv)
        if rc != 0:
            return False, f"rlvr train exited {rc}"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
        summary = json.loads((run / "summary.json").read_text())
    losses = [r.get("loss", 0.0) for r in rows]
    timed = rows[2:] or rows  # the first steps include warm-up
    tok = sum(r["generated_tokens"] for r in timed)
    gen = sum(r["time/generation"] for r in timed)
    step = sum(r["time/step"] for r in timed)
    acc = f"{summary['eval_before']['accuracy']:.3f} -> {summary['eval_after']['accuracy']:.3f}"
    ok = len(rows) == steps and all(math.isfinite(x) for x in losses)
    return ok, (
        f"{len(rows)} steps, losses finite: {ok}; held-out acc {acc}; generation "
        f"{tok / max(gen, 1e-9):,.0f} tok/s, end-to-end {tok / max(step, 1e-9):,.0f} tok/s"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["engine", "train"])
    p.add_argument("name")
    p.add_argument("--device", default="cuda")
    p.add_argument("--autocast", default="none", choices=["none", "bfloat16"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="engine: 2 prompts x 2, 8 tokens")
    a = p.parse_args(argv)
    label = a.name if a.what == "engine" else f"train-{a.name}"
    if a.autocast != "none":
        label += f"-{a.autocast}"
    try:
        if a.what == "engine":
            ok, text = check_engine(a.name, a.device, a.autocast, a.quick)
        else:
            ok, text = check_train(a.name, a.device, a.steps)
    except Exception as e:  # one line, whatever broke; the log keeps the traceback
        import traceback

        traceback.print_exc()
        ok, text = False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if text in ("not installed",) or text.startswith("skipped"):
        print(f"RESULT {label}: {text}")
        return 0
    print(f"RESULT {label}: {'PASS' if ok else 'FAIL'} {text}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
