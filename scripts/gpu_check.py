"""One check of scripts/gpu_check.sh; prints one result line, `RESULT NAME: PASS|FAIL ...`.

    python scripts/gpu_check.py engine {hf,fast,vllm} [--device cuda] [--autocast bfloat16]
    python scripts/gpu_check.py train {fp32,bf16,lora,nccl2,vllm,pad_free} [--device cuda] [--steps 20]
    python scripts/gpu_check.py pad_free {flash_attention_2,sdpa} [--device cuda]

`engine`: the built-in model samples 8 prompts x 8 responses; the engine's own log-probs of
its samples (fast, vllm) are compared with the trainer's forward on the same sequences (max
absolute difference over response tokens), which, unlike exact greedy tokens, does not flip
at near-ties between two numerically different kernels; hf (no own log-probs) is checked for
well-formed rollouts and finite trainer log-probs. `vllm` prints `vllm: not installed` when
vllm cannot be imported. `train`: `rlvr train` for a few DAPO steps; finite losses, the
held-out accuracy before and after, generation and end-to-end tokens/s (pad_free: with
token-budget micro-batches without padding). `pad_free`: the built-in model in bf16 with
that attention implementation, micro-batches without padding (`rlvr.training.pad_free`)
against padded ones on 32 long-tailed samples: log-probs (max |difference| over response
tokens), finite gradients, and the forward + backward time of each; flash_attention_2 prints
`flash-attn: not installed` without the flash_attn package.
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
    "pad_free": ["--optim.micro_batch_tokens=4096", "--optim.pad_free=true"],
}
# bf16 forwards of one model, padded against pad-free: the same math in a different order
PAD_FREE_TOLERANCE = 0.05


def check_pad_free(impl: str, device: str) -> tuple[bool, str]:
    """Padded against pad-free micro-batches under `impl` (see the module doc). Written
    against transformers' documented flash-attention interface; not yet run on a GPU."""
    from rlvr.models import load_model
    from rlvr.training.batch import Sample, collate, token_log_probs
    from rlvr.training.pad_free import collate_flat, flat_token_log_probs, segment_attention

    if impl == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return True, "not installed"
    model = load_model("rlvr-tiny", device=device).to(torch.bfloat16).train()
    model.set_attn_implementation(impl)
    g = torch.Generator().manual_seed(0)
    lengths = [min(max(int(300 * float(torch.exp(0.9 * torch.randn(1, generator=g)))), 16), 2000)
               for _ in range(32)]  # fmt: skip
    vocab = model.config.vocab_size
    samples = [
        Sample(torch.randint(5, vocab, (40,), generator=g).tolist(),
               torch.randint(5, vocab, (n,), generator=g).tolist(), False, 0.0, False, 0)
        for n in lengths
    ]  # fmt: skip

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def timed(fn):
        sync()
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        lp, mask = fn()
        (lp * mask).sum().backward()
        sync()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return lp.detach(), time.perf_counter() - t0, all(bool(x.isfinite().all()) for x in grads)

    padded = collate(samples, 0, device)
    flat = collate_flat(samples, 0, device)
    with segment_attention(model) as used:
        pass
    for _ in range(2):  # the second of each is timed
        lp_p, t_p, fin_p = timed(lambda: (token_log_probs(model, padded, temperature=1.0)[0],
                                          padded.response_mask))  # fmt: skip
        lp_f, t_f, fin_f = timed(lambda: (flat_token_log_probs(model, flat, temperature=1.0)[0],
                                          flat.response_mask))  # fmt: skip
    m = padded.response_mask.bool()
    diff = (lp_p - lp_f).abs()[m]
    ok = fin_p and fin_f and float(diff.max()) < PAD_FREE_TOLERANCE
    return ok, (
        f"attention {used}; |padded - pad_free| log-prob max {float(diff.max()):.2e} "
        f"(tol {PAD_FREE_TOLERANCE}), mean {float(diff.mean()):.2e}; gradients finite "
        f"{fin_p and fin_f}; forward+backward padded {t_p * 1e3:.0f} ms, pad-free "
        f"{t_f * 1e3:.0f} ms ({t_p / max(t_f, 1e-9):.2f}x)"
    )


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
    p.add_argument("what", choices=["engine", "train", "pad_free"])
    p.add_argument("name")
    p.add_argument("--device", default="cuda")
    p.add_argument("--autocast", default="none", choices=["none", "bfloat16"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="engine: 2 prompts x 2, 8 tokens")
    a = p.parse_args(argv)
    label = a.name if a.what == "engine" else f"{a.what}-{a.name}"
    if a.autocast != "none":
        label += f"-{a.autocast}"
    try:
        if a.what == "engine":
            ok, text = check_engine(a.name, a.device, a.autocast, a.quick)
        elif a.what == "pad_free":
            ok, text = check_pad_free(a.name, a.device)
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
