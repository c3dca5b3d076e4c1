"""rlvr against TRL's GRPOTrainer, side by side on identical settings.

    python bench/vs_trl.py --quick          # 2 rounds, beta 0 and 0.04, 2 + 4 steps a run
    python bench/vs_trl.py                  # 3 rounds, 3 warm-up + 10 timed steps a run
    python bench/vs_trl.py --rlvr-engine fast --betas 0

Settings (both trainers): the comparison Qwen2 of `_shared.py` (hidden 256, 4 layers, 4 heads, intermediate
1024, rlvr's character vocabulary, 4.25M parameters) built with a fixed seed and saved once
with save_pretrained, which both load by path; fp32 on CPU, `torch.set_num_threads(2)`;
prompts of rlvr's built-in `arithmetic` task rendered by the chat template; 4 prompts x G=8
per step; every completion exactly 64 tokens (TRL: `max_completion_length=64` and
`generation_kwargs={"min_new_tokens": 64}`; rlvr: `rollout.max_new_tokens=64`,
`rollout.min_new_tokens=64`), checked on every step; temperature 1, no top-p/top-k; the
task's verifier as reward (1 correct, 0 wrong); GRPO loss (per-sequence token mean, TRL
`loss_type="grpo"`, rlvr preset `grpo`), clip 0.2, k3 KL with beta 0 or 0.04; one
optimiser step per generation batch (TRL: batch 32, steps_per_generation 1, num_iterations
1; rlvr: mu 1, mini_batches 1, one micro-batch); AdamW lr 1e-5 constant, weight decay 0,
grad-norm clip 1.0; no dynamic sampling (TRL has none); no gradient checkpointing (TRL's
GRPOConfig turns it on by default, recomputing the forward in the backward; rlvr has none, so
it is off for the same work: `--trl-gradient-checkpointing` measures TRL's default). Each
keeps its own optimiser implementation (TRL: `adamw_torch_fused`; rlvr: `torch.optim.AdamW`).

Runs alternate A B A B (TRL, rlvr, TRL, rlvr, ...), each in its own subprocess, so drift in
the machine's load hits both alike and peak RSS (`ru_maxrss` of the child) is per run. The
first `--warmup` steps of each run are not timed. Per-phase numbers are medians over all
timed steps of all rounds; speedups are TRL time / rlvr time.

How each number is measured:
  step:        wall time between consecutive step ends (rlvr: returns of `run_step`; TRL: the
               `on_step_end` callback); logging falls inside it for both.
  completion tokens/s: completion tokens per step (always 32 x 64 = 2048) / median step.
  generation:  rlvr `time/generation` (the engine's `generate`); TRL `_generate_single_turn`
               (see `_shared.TRLTimer`).
  log_probs:   no-grad forwards (reference model under beta > 0): rlvr `time/log_probs`; TRL
               `_get_per_token_logps_and_entropies` called with grad disabled.
  train:       forward + loss + backward + clip + optimiser step: rlvr `time/update`; TRL from
               the start of `training_step` to `on_step_end` minus `_prepare_inputs`.
  peak RSS:    `resource.getrusage(RUSAGE_SELF).ru_maxrss` at the end of the child.
  MFU:         model FLOPs / (phase seconds x peak). Peak: best of several timed fp32
               `torch.matmul` of 1024 x 1024 matrices with the same thread count, measured in
               this process before and after the runs and in every run's process before and
               after training; the best of all is used (a busy machine only lowers it). FLOPs, with
               N = parameters in matmuls (all but the input embedding), L layers, width d:
                 forward of one token seeing c positions: 2 N + 4 L d c (QK^T and AV);
                 generation: forward over each distinct prompt once (prefill; HF generate
                   prefills every sample, which is not counted as useful work) plus every
                   completion token at its context length;
                 train: 3 x forward FLOPs of what each trainer runs: TRL every prompt +
                   completion token of every row; rlvr (prompt sharing) each distinct prompt
                   once plus every completion token at its context (`train_mfu`; the JSON's
                   `train_mfu_trl_flops` credits rlvr with TRL's count instead);
                 log_probs: 1 x forward FLOPs of the same (per no-grad forward).

The last line printed is one JSON object (beta 0 unless a key says otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _shared import (  # noqa: E402
    build_qwen2,
    load_char_tokenizer,
    peak_rss_mib,
    set_threads,
    trl_dataset,
    trl_task_reward,
)

PROMPTS_PER_STEP = 4
GROUP = 8
LENGTH = 64
LR = 1e-5
TASK = "arithmetic"
TRAIN_SIZE = 512


# ----------------------------------------------------------------------------- children


def child_trl(args) -> dict:
    from _shared import TRLTimer
    from trl import GRPOConfig, GRPOTrainer

    timer = TRLTimer()
    timer.install(GRPOTrainer)
    tok = load_char_tokenizer(args.model_dir)
    config = GRPOConfig(
        output_dir=str(Path(args.work_dir) / "trl"),
        use_cpu=True,
        bf16=args.bf16,  # accelerate's CPU autocast; weights stay fp32
        fp16=False,
        # TRL's default is True; rlvr has none, so the same computation means off here.
        gradient_checkpointing=args.trl_gradient_checkpointing,
        model_init_kwargs={"dtype": "float32"},
        per_device_train_batch_size=args.prompts * args.group,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=args.group,
        max_completion_length=args.length,
        generation_kwargs={"min_new_tokens": args.length},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=args.beta,
        loss_type="grpo",
        epsilon=0.2,
        scale_rewards="group",
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        seed=args.seed,
        data_seed=args.seed,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=args.model_dir,
        reward_funcs=trl_task_reward(TASK),
        args=config,
        train_dataset=trl_dataset(tok, TASK, TRAIN_SIZE, args.seed, args.system_prompt),
        processing_class=tok,
        callbacks=[timer.callback()],
    )
    torch.set_num_threads(args.threads)
    trainer.train()
    steps = [
        {
            "step": s["step"],
            "generation": s["generation"],
            "log_probs": s["log_probs"],
            "train": s["train"],
            "step_cpu": s["step_cpu"],
            "generation_cpu": s["generation_cpu"],
            "train_cpu": s["train_cpu"],
            "completion_tokens": s["completion_tokens"],
            "prompt_tokens": s["prompt_tokens"],
            "unique_prompt_tokens": s["unique_prompt_tokens"],
            "rows": s["rows"],
        }
        for s in timer.steps
    ]
    return {"steps": steps, "threads": torch.get_num_threads()}


def child_rlvr(args) -> dict:
    import rlvr.training.setup as rs  # builds the run: its tokenizer loader, Run.evaluate
    import rlvr.training.trainer as rt  # the loop: run_step
    from rlvr.config.load import load_config
    from rlvr.config.schema import ConfigError
    from rlvr.config.schema_rollout import RolloutConfig
    from rlvr.rollout import ENGINES

    if "min_new_tokens" not in RolloutConfig.__dataclass_fields__:
        raise SystemExit(
            "rlvr has no rollout.min_new_tokens: completion lengths cannot be forced to "
            f"{args.length}; the comparison needs it (EOS suppressed before that many tokens)"
        )
    overrides = {
        "model": {
            "name_or_path": args.model_dir,
            "dtype": "float32",
            "device": "cpu",
            "autocast": "bfloat16" if args.bf16 else "none",
        },
        "data": {"task": TASK, "train_size": TRAIN_SIZE, "system_prompt": args.system_prompt},
        "rollout": {
            "prompts_per_step": args.prompts,
            "group_size": args.group,
            "max_new_tokens": args.length,
            "min_new_tokens": args.length,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
        },
        "algo": {
            "kl_coef": args.beta,
            "dynamic_sampling": False,
            "mu": 1,
            "mini_batches": 1,
            "clip_low": 0.2,
            "clip_high": 0.2,
        },
        "reward": {"correct_score": 1.0, "wrong_score": 0.0},
        "optim": {
            "lr": LR,
            "warmup_steps": 0,
            "weight_decay": 0.0,
            "max_grad_norm": 1.0,
            "micro_batch_sequences": args.prompts * args.group,
        },
        "train": {
            "max_steps": args.warmup + args.steps,
            "seed": args.seed,
            "output_dir": str(Path(args.work_dir) / "rlvr"),
            "eval_size": 0,
            "eval_every": 0,
            "save_every": 0,
            "log_samples": 0,
            "threads": args.threads,
        },
    }
    if args.rlvr_engine:
        overrides["rollout"]["engine"] = args.rlvr_engine
    try:
        cfg = load_config(None, overrides, preset="grpo")
    except ConfigError as e:
        raise SystemExit(f"rlvr config: {e}") from None

    # See _shared.load_char_tokenizer: AutoTokenizer mis-loads this tokenizer beside a qwen2
    # config, so rlvr's loader is pointed at the same loader TRL gets.
    rs.load_tokenizer = load_char_tokenizer
    ends: list[float] = []
    ends_cpu: list[float] = []  # the same instants in CPU time
    gen_cpu: list[float] = []
    counts: list[dict] = []
    run_step = rt.run_step

    def timed_run_step(*a, **k):
        metrics, examples = run_step(*a, **k)
        ends.append(time.perf_counter())
        ends_cpu.append(time.process_time())
        counts.append(metrics)
        return metrics, examples

    rt.run_step = timed_run_step
    ends.append(time.perf_counter())  # replaced below by the end of the first evaluation
    ends_cpu.append(time.process_time())
    engine_cls = ENGINES[cfg.rollout.engine]
    gen = engine_cls.generate
    prompt_stats: list[tuple[int, int, int]] = []

    def generate(self, prompt_ids, params):
        c0 = time.process_time()
        out = gen(self, prompt_ids, params)
        gen_cpu.append(time.process_time() - c0)
        prompt_stats.append(
            (
                sum(len(p) for p in prompt_ids) * params.n,
                sum(len(p) for p in {tuple(p) for p in prompt_ids}),
                len(prompt_ids) * params.n,
            )
        )
        return out

    engine_cls.generate = generate
    evaluate = rs.evaluate

    def timed_evaluate(*a, **k):
        out = evaluate(*a, **k)
        if not counts:
            ends[0], ends_cpu[0] = time.perf_counter(), time.process_time()
        return out

    rs.evaluate = timed_evaluate
    rt.train(cfg, show_progress=False)
    steps = []
    for i, m in enumerate(counts):
        prompt_tokens, unique, rows = prompt_stats[i]
        steps.append(
            {
                "step": ends[i + 1] - ends[i],
                "step_inner": m["time/step"],
                "generation": m["time/generation"],
                "log_probs": m["time/log_probs"],
                "train": m["time/update"],
                "step_cpu": ends_cpu[i + 1] - ends_cpu[i],
                "generation_cpu": gen_cpu[i],
                # the rest of the step: scoring, log-probs (none at beta 0), the update
                "train_cpu": ends_cpu[i + 1] - ends_cpu[i] - gen_cpu[i],
                "completion_tokens": int(m["generated_tokens"]),
                "prompt_tokens": prompt_tokens,
                "unique_prompt_tokens": unique,
                "rows": rows,
            }
        )
    return {"steps": steps, "threads": torch.get_num_threads(), "engine": cfg.rollout.engine}


def child_main(args) -> None:
    set_threads(args.threads)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    peaks = [matmul_peak(args.threads, rounds=3, dtype=dtype)]
    cpu_peaks = [matmul_peak(args.threads, rounds=3, dtype=dtype, clock=time.process_time)]
    result = child_trl(args) if args.child == "trl" else child_rlvr(args)
    result["peak_rss_mib"] = peak_rss_mib()  # before the matmul below (it allocates 12 MiB)
    result["matmul_peaks"] = [*peaks, matmul_peak(args.threads, rounds=3, dtype=dtype)]
    cpu_peaks.append(matmul_peak(args.threads, rounds=3, dtype=dtype, clock=time.process_time))
    result["matmul_peaks_cpu"] = cpu_peaks
    Path(args.out).write_text(json.dumps(result))


# ----------------------------------------------------------------------------- parent


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The run's shape, passed to the children (bench/shapes.py varies these)."""
    p.add_argument("--prompts", type=int, default=PROMPTS_PER_STEP, help=argparse.SUPPRESS)
    p.add_argument("--group", type=int, default=GROUP, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, default=LENGTH, help=argparse.SUPPRESS)
    p.add_argument("--system-prompt", default=None, help=argparse.SUPPRESS)


def matmul_peak(
    threads: int,
    n: int = 1024,
    reps: int = 10,
    rounds: int = 7,
    dtype=torch.float32,
    clock=time.perf_counter,
) -> float:
    """Best matmul rate (FLOP/s) of n x n `dtype` matrices with `threads` threads, timed by
    `clock` (`time.process_time`: per CPU second, which time-sharing does not lower)."""
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
    out = torch.empty(n, n, dtype=dtype)
    torch.matmul(a, b, out=out)
    best = float("inf")
    for _ in range(rounds):
        t0 = clock()
        for _ in range(reps):
            torch.matmul(a, b, out=out)
        best = min(best, clock() - t0)
    return 2 * n**3 * reps / best


def model_shape(model_dir: Path) -> dict:
    cfg = json.loads((model_dir / "config.json").read_text())
    d, L, f, V = (
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
    )
    kv = cfg["num_key_value_heads"] * (d // cfg["num_attention_heads"])
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * f  # q, k, v, o, gate/up/down
    per_layer += d + 2 * kv  # q/k/v biases
    matmul = L * per_layer + d * V  # lm_head (untied); the input embedding is a lookup
    total = matmul + d * V + (2 * L + 1) * d  # + embedding + RMSNorm weights
    return dict(d=d, L=L, N=matmul, total=total)


def fwd_flops(shape: dict, tokens: int, ctx_sum: float) -> float:
    """Forward FLOPs of `tokens` tokens whose attention contexts sum to `ctx_sum` positions."""
    return 2 * shape["N"] * tokens + 4 * shape["L"] * shape["d"] * ctx_sum


def step_flops(shape: dict, s: dict) -> dict[str, float]:
    """Model FLOPs of one step's phases (see the module docstring)."""
    rows = s["rows"]
    P = s["prompt_tokens"] / rows  # prompts of one task have one length here
    T = s["completion_tokens"] / rows
    uniq_tokens = s["unique_prompt_tokens"]
    # prefill of a P-token prompt: contexts 1..P; completion token t (1-based) sees P + t.
    prefill = fwd_flops(shape, uniq_tokens, uniq_tokens * (P + 1) / 2)
    decode = fwd_flops(shape, rows * T, rows * (T * P + T * (T + 1) / 2))
    S = P + T
    full = fwd_flops(shape, rows * S, rows * S * (S + 1) / 2)
    return {
        "generation": prefill + decode,
        "train": 3 * full,
        # rlvr's prompt sharing: each distinct prompt forwarded once, completions on its cache
        "train_shared": 3 * (prefill + decode),
        "log_probs_per_pass": full,
    }


def child_command(
    kind: str, beta: float, args, model_dir: Path, work: Path, tag: str
) -> tuple[list[str], dict[str, str], Path]:
    """The command line, environment and result file of one child run (`--child kind`)."""
    out = work / f"{tag}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--beta", str(beta)]
    cmd += ["--model-dir", str(model_dir), "--work-dir", str(work / tag), "--out", str(out)]
    cmd += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    cmd += ["--threads", str(args.threads), "--seed", str(args.seed)]
    cmd += ["--prompts", str(args.prompts), "--group", str(args.group)]
    cmd += ["--length", str(args.length)]
    if args.system_prompt:
        cmd += ["--system-prompt", args.system_prompt]
    if args.rlvr_engine:
        cmd += ["--rlvr-engine", args.rlvr_engine]
    if args.trl_gradient_checkpointing:
        cmd += ["--trl-gradient-checkpointing"]
    if args.bf16:
        cmd += ["--bf16"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    env["TRANSFORMERS_VERBOSITY"] = "error"
    return cmd, env, out


def checked_result(kind: str, args, out: Path, tag: str) -> dict:
    """A finished child's result, with its steps' forced lengths and step count checked."""
    res = json.loads(out.read_text())
    expected = args.prompts * args.group * args.length
    bad = [s["completion_tokens"] for s in res["steps"] if s["completion_tokens"] != expected]
    if bad:
        raise SystemExit(
            f"{kind} run {tag}: steps generated {bad} completion tokens, not {expected}: "
            "lengths were not forced (does this rollout engine honour min_new_tokens?)"
        )
    if len(res["steps"]) != args.warmup + args.steps:
        raise SystemExit(f"{kind} run {tag}: {len(res['steps'])} steps logged")
    res["timed"] = res["steps"][args.warmup :]
    return res


def run_child(kind: str, beta: float, args, model_dir: Path, work: Path, tag: str) -> dict:
    cmd, env, out = child_command(kind, beta, args, model_dir, work, tag)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out.exists():
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"{kind} run {tag} failed (exit {proc.returncode})")
    res = checked_result(kind, args, out, tag)
    res["wall_s"] = wall
    return res


def _median(run: dict, key: str) -> float:
    return statistics.median(s[key] for s in run["timed"])


def summarise(
    runs: list[dict], shape: dict, peak: float, beta: float, kind: str, cpu_peak: float = 0.0
) -> dict:
    """Medians over every timed step of `runs`; with `cpu_peak` (FLOP per CPU second) also the
    CPU-time figures (`*_cpu`)."""
    timed = [s for r in runs for s in r["timed"]]

    def med(key: str) -> float:
        return statistics.median(s[key] for s in timed)

    tokens = statistics.median(s["completion_tokens"] for s in timed)
    flops = step_flops(shape, timed[0])
    out = {
        "sec_per_step": med("step"),
        "tokens_per_s": tokens / med("step"),
        "generation_s": med("generation"),
        "log_probs_s": med("log_probs"),
        "train_s": med("train"),
        "other_s": statistics.median(
            s["step"] - s["generation"] - s["log_probs"] - s["train"] for s in timed
        ),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "gen_mfu": flops["generation"] / med("generation") / peak,
        # hardware use: the FLOPs this trainer actually runs (rlvr shares prompts; TRL doesn't)
        "train_mfu": flops["train_shared" if kind == "rlvr" else "train"] / med("train") / peak,
        # the same work credited as TRL does it (counts the work prompt sharing avoids)
        "train_mfu_trl_flops": flops["train"] / med("train") / peak,
        "step_spread": [min(s["step"] for s in timed), max(s["step"] for s in timed)],
        "threads": sorted({r["threads"] for r in runs}),
    }
    if cpu_peak and all("step_cpu" in s for s in timed):
        gen_flops = flops["generation"]
        trn_flops = flops["train_shared" if kind == "rlvr" else "train"]
        out.update(
            sec_per_step_cpu=med("step_cpu"),
            tokens_per_cpu_s=tokens / med("step_cpu"),
            generation_cpu_s=med("generation_cpu"),
            train_cpu_s=med("train_cpu"),
            gen_mfu_cpu=gen_flops / med("generation_cpu") / cpu_peak,
            train_mfu_cpu=trn_flops / med("train_cpu") / cpu_peak,
        )
    if beta > 0 and out["log_probs_s"] > 0:
        out["log_probs_mfu"] = flops["log_probs_per_pass"] / out["log_probs_s"] / peak
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of 2 warm-up + 4 timed steps")
    p.add_argument("--rounds", type=int, default=3, help="A B rounds per beta")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of a run")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run")
    p.add_argument("--betas", default="0,0.04", help="comma list of KL coefficients")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rlvr-engine", default=None, help="rollout.engine (default: rlvr's default)")
    p.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="TRL's own default (recomputes the forward in the backward); off: same work as rlvr",
    )
    p.add_argument(
        "--bf16",
        action="store_true",
        help="mixed precision in both: TRL bf16=True, rlvr model.autocast=bfloat16 (fp32 "
        "weights); MFU against a bf16 matmul peak",
    )
    p.add_argument("--keep", default=None, help="keep the model and run files in this directory")
    # child mode (internal)
    p.add_argument("--child", choices=["trl", "rlvr"], help=argparse.SUPPRESS)
    p.add_argument("--beta", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--work-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    add_shape_args(p)
    args = p.parse_args()
    if args.child:
        child_main(args)
        return
    if args.quick:
        args.rounds, args.warmup, args.steps = 2, 2, 4
    betas = [float(b) for b in args.betas.split(",")]

    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="vs_trl_")
    work = Path(args.keep or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = build_qwen2(work / "model", seed=args.seed)
    shape = model_shape(model_dir)
    import transformers
    import trl

    print(
        f"model: Qwen2 {shape['total'] / 1e6:.2f}M parameters ({shape['N'] / 1e6:.2f}M in "
        f"matmuls), {PROMPTS_PER_STEP} prompts x G={GROUP}, {LENGTH} tokens forced, "
        f"{'bf16 autocast over fp32 weights' if args.bf16 else 'fp32'}, "
        f"{args.threads} threads; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, trl {trl.__version__}"
    )
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    peaks = [matmul_peak(args.threads, dtype=dtype)]
    print(
        f"{str(dtype).removeprefix('torch.')} matmul peak (1024^3, {args.threads} threads): "
        f"{peaks[0] / 1e9:.1f} GFLOP/s"
    )
    print(
        f"{args.rounds} rounds x betas {betas}, {args.warmup} warm-up + {args.steps} timed "
        "steps per run, alternating TRL / rlvr"
    )

    runs: dict[tuple[str, float], list[dict]] = {}
    t_start = time.perf_counter()
    for r in range(args.rounds):
        for beta in betas:
            for kind in ("trl", "rlvr"):
                tag = f"{kind}-b{beta:g}-r{r}"
                res = run_child(kind, beta, args, model_dir, work, tag)
                runs.setdefault((kind, beta), []).append(res)
                t = [s["step"] for s in res["timed"]]
                g = [s["generation"] for s in res["timed"]]
                print(
                    f"  round {r} beta {beta:<5g} {kind:>4}: {statistics.median(t):6.3f} s/step "
                    f"(gen {statistics.median(g):6.3f} s), rss {res['peak_rss_mib']:6.0f} MiB, "
                    f"run {res['wall_s']:5.1f} s"
                )
    peaks.append(matmul_peak(args.threads, dtype=dtype))
    child_peaks = [p for rs in runs.values() for r in rs for p in r["matmul_peaks"]]
    peak = max(peaks + child_peaks)
    print(
        f"matmul peak after the runs: {peaks[1] / 1e9:.1f} GFLOP/s, in the runs "
        f"{min(child_peaks) / 1e9:.1f}..{max(child_peaks) / 1e9:.1f}; using the best, "
        f"{peak / 1e9:.1f}; total {time.perf_counter() - t_start:.0f} s"
    )

    result: dict[str, float] = {}
    for beta in betas:
        s = {k: summarise(runs[(k, beta)], shape, peak, beta, k) for k in ("trl", "rlvr")}
        engine = runs[("rlvr", beta)][0].get("engine")
        print(f"\n== beta {beta:g} (rlvr engine {engine}); medians over timed steps")
        print(
            f"  {'':>6} {'tok/s':>8} {'s/step':>8} {'gen s':>7} {'logp s':>7} {'train s':>8} "
            f"{'other s':>8} {'gen MFU':>8} {'trn MFU':>8} {'RSS MiB':>8}"
        )
        for k in ("trl", "rlvr"):
            v = s[k]
            print(
                f"  {k:>6} {v['tokens_per_s']:8.0f} {v['sec_per_step']:8.3f} "
                f"{v['generation_s']:7.3f} {v['log_probs_s']:7.3f} {v['train_s']:8.3f} "
                f"{v['other_s']:8.3f} {v['gen_mfu']:8.1%} {v['train_mfu']:8.1%} "
                f"{v['peak_rss_mib']:8.0f}"
            )
        ratios = {
            "speedup_end_to_end": s["trl"]["sec_per_step"] / s["rlvr"]["sec_per_step"],
            "speedup_generation": s["trl"]["generation_s"] / s["rlvr"]["generation_s"],
            "speedup_train": s["trl"]["train_s"] / s["rlvr"]["train_s"],
            "train_mfu": s["rlvr"]["train_mfu"],
            "train_mfu_trl_flops": s["rlvr"]["train_mfu_trl_flops"],
            "gen_mfu": s["rlvr"]["gen_mfu"],
            "trl_train_mfu": s["trl"]["train_mfu"],
            "trl_gen_mfu": s["trl"]["gen_mfu"],
            "rss_ratio": s["rlvr"]["peak_rss_mib"] / s["trl"]["peak_rss_mib"],
            "tokens_per_s": s["rlvr"]["tokens_per_s"],
            "trl_tokens_per_s": s["trl"]["tokens_per_s"],
            "sec_per_step": s["rlvr"]["sec_per_step"],
            "trl_sec_per_step": s["trl"]["sec_per_step"],
            "generation_s": s["rlvr"]["generation_s"],
            "trl_generation_s": s["trl"]["generation_s"],
            "train_s": s["rlvr"]["train_s"],
            "trl_train_s": s["trl"]["train_s"],
            "peak_rss_mib": s["rlvr"]["peak_rss_mib"],
            "trl_peak_rss_mib": s["trl"]["peak_rss_mib"],
        }
        # The least disturbed run of each (lowest median step) on a shared machine.
        best = {k: min(runs[(k, beta)], key=lambda r: _median(r, "step")) for k in s}
        ratios["speedup_end_to_end_best_run"] = _median(best["trl"], "step") / _median(
            best["rlvr"], "step"
        )
        ratios["speedup_generation_best_run"] = _median(best["trl"], "generation") / _median(
            best["rlvr"], "generation"
        )
        if beta > 0 and s["trl"]["log_probs_s"] > 0 and s["rlvr"]["log_probs_s"] > 0:
            ratios["speedup_log_probs"] = s["trl"]["log_probs_s"] / s["rlvr"]["log_probs_s"]
        print(
            f"  rlvr / TRL: end-to-end {ratios['speedup_end_to_end']:.2f}x, generation "
            f"{ratios['speedup_generation']:.2f}x, train {ratios['speedup_train']:.2f}x, "
            f"RSS ours/TRL {ratios['rss_ratio']:.2f}; least disturbed runs: end-to-end "
            f"{ratios['speedup_end_to_end_best_run']:.2f}x, generation "
            f"{ratios['speedup_generation_best_run']:.2f}x"
        )
        suffix = "" if beta == 0 else f"_beta{beta:g}"
        for k, v in ratios.items():
            result[k + suffix] = round(v, 4)
    result["matmul_peak_gflops"] = round(peak / 1e9, 2)
    result["precision"] = "bf16-autocast" if args.bf16 else "fp32"
    result["rounds"], result["timed_steps_per_run"] = args.rounds, args.steps
    if tmp is not None:
        tmp.cleanup()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
