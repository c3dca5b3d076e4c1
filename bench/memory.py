"""Peak memory of rlvr's training steps: measured probes, the memory model fitted to them, and
the longest response a Qwen2-0.5B-shaped model can train on in a given RAM.

    python bench/memory.py --lengths        # peak RSS vs response length, gradient checkpointing off/on
    python bench/memory.py --probes         # the model's probes (896 wide, 2 and 4 layers)
    python bench/memory.py --vocab-probes   # the same layer with Qwen's 151,936-token vocabulary
    python bench/memory.py --full-probes    # all 24 layers with that vocabulary (8-13 GiB, 15-30 min each)
    python bench/memory.py --fit            # fit rlvr.run.memory's constants to the probes
    python bench/memory.py --limits 24      # longest response in 24 GiB, 0.5B shape

Every probe is one child process running `rlvr.training.trainer.train` for two steps (the second
holds AdamW's moments): random-init Qwen2 on rlvr's character vocabulary, the arithmetic task,
one prompt x G=8, every response forced to the probe's length (`rollout.min_new_tokens`),
beta 0, fp32, 1 thread; peak RSS is the child's `ru_maxrss`. Results are appended to
`--results` (default bench/results/memory.jsonl); a rerun skips probes already there. Keep
every probe well under the machine's free RAM: the probes here stay under ~4 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _shared import build_qwen2, load_char_tokenizer, peak_rss_mib  # noqa: E402

from rlvr.run import memory  # noqa: E402

GROUP = 8
# Qwen2-0.5B's layer: hidden 896, 14 heads of 64, 2 key/value heads, intermediate 4864, 24 layers.
QWEN05 = dict(
    hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864
)
QWEN05_LAYERS = 24
QWEN05_VOCAB = 151936  # its own vocabulary (tied embedding), for the limits with real logits
GRID30M = dict(hidden_size=512, num_hidden_layers=7, num_attention_heads=8, intermediate_size=2048)

# (name, model shape, response length, gradient checkpointing, lora)
LENGTHS = [
    (f"30M-T{t}-{'gc' if gc else 'nogc'}", GRID30M, t, gc, False)
    for gc in (False, True)
    for t in (64, 256, 1024)
]
PROBES = [
    ("q05-L2-T256", {**QWEN05, "num_hidden_layers": 2}, 256, False, False),
    ("q05-L2-T1024", {**QWEN05, "num_hidden_layers": 2}, 1024, False, False),
    ("q05-L4-T512", {**QWEN05, "num_hidden_layers": 4}, 512, False, False),
    ("q05-L4-T512-gc", {**QWEN05, "num_hidden_layers": 4}, 512, True, False),
    ("q05-L4-T512-lora", {**QWEN05, "num_hidden_layers": 4}, 512, False, True),
]
# Qwen2-0.5B's layer with its own 151,936-token vocabulary (tied), scored in chunks: the check
# of the chunked logits' count (not fitted to)
VOCAB_PROBES = [
    ("q05v-L2-T256", {**QWEN05, "num_hidden_layers": 2, "vocab_size": QWEN05_VOCAB, "tie_word_embeddings": True}, 256, False, False),
    ("q05v-L2-T256-gc", {**QWEN05, "num_hidden_layers": 2, "vocab_size": QWEN05_VOCAB, "tie_word_embeddings": True}, 256, True, False),
]  # fmt: skip
# The whole Qwen2-0.5B shape (24 layers, its vocabulary, 494M parameters) at lengths this
# machine holds: the model's count at full depth, which the 24 GiB limits extrapolate in length
QWEN05_FULL = {**QWEN05, "num_hidden_layers": QWEN05_LAYERS, "vocab_size": QWEN05_VOCAB, "tie_word_embeddings": True}  # fmt: skip
FULL_PROBES = [
    ("q05full-T256", QWEN05_FULL, 256, False, False),
    ("q05full-T512-gc", QWEN05_FULL, 512, True, False),
    ("q05full-T1024-gc", QWEN05_FULL, 1024, True, False),
]  # fmt: skip


def child(args) -> None:
    import torch

    import rlvr.training.setup as rs
    import rlvr.training.trainer as rt
    from rlvr.config.load import load_config

    spec = json.loads(args.child)
    model = {"name_or_path": spec["model_dir"], "dtype": "float32", "device": "cpu"}
    if spec["lora"]:
        model.update(lora_rank=16, lora_alpha=32)
    overrides = {
        "model": model,
        "data": {"task": "arithmetic", "train_size": 64},
        "rollout": {
            "prompts_per_step": 1,
            "group_size": GROUP,
            "max_new_tokens": spec["length"],
            "min_new_tokens": spec["length"],
        },
        "algo": {"kl_coef": 0.0, "dynamic_sampling": False, "mu": 1, "mini_batches": 1},
        "optim": {"micro_batch_sequences": GROUP, "gradient_checkpointing": spec["gc"]},
        "train": {
            "max_steps": 2,
            "output_dir": spec["out_dir"],
            "eval_size": 0,
            "eval_every": 0,
            "save_every": 0,
            "log_samples": 0,
            "threads": 1,
        },
    }
    cfg = load_config(None, overrides, preset="grpo")
    rs.load_tokenizer = load_char_tokenizer  # see _shared.load_char_tokenizer
    seen = {}
    guard_for_run = memory.MemoryGuard.for_run

    def for_run(*a, **k):  # the trainer's own guard: record what it predicts for this run
        g = guard_for_run(*a, **k)
        seen["shape"], seen["work"] = g.shape.__dict__, g.work.__dict__
        return g

    memory.MemoryGuard.for_run = staticmethod(for_run)
    torch.set_num_threads(1)
    rt.train(cfg, show_progress=False)
    Path(spec["result"]).write_text(json.dumps({"peak_rss_mib": peak_rss_mib(), **seen}))


def run_probe(name: str, shape: dict, length: int, gc: bool, lora: bool, work: Path) -> dict:
    mdir = work / "models" / json.dumps(shape, sort_keys=True).replace('"', "")[:120]
    if not (mdir / "config.json").exists():
        build_qwen2(mdir, seed=0, max_position_embeddings=2048, **shape)
    spec = dict(
        model_dir=str(mdir),
        length=length,
        gc=gc,
        lora=lora,
        out_dir=str(work / "runs" / name),
        result=str(work / f"{name}.json"),
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["RLVR_MEMORY_GUARD"] = "0"  # measure, don't stop
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"probe {name} failed (exit {proc.returncode})")
    got = json.loads(Path(spec["result"]).read_text())
    return {"probe": name, "length": length, "gc": gc, "lora": lora, **got}


def _parts(rec: dict, **constants) -> dict[str, float]:
    """rlvr.run.memory.predict for a probe's recorded shape and work, with `constants` set."""
    saved = {k: getattr(memory, k) for k in constants}
    for k, v in constants.items():
        setattr(memory, k, v)
    try:
        return memory.predict(memory.Shape(**rec["shape"]), memory.Work(**rec["work"]))
    finally:
        for k, v in saved.items():
            setattr(memory, k, v)


def fit(plain: list[dict], checkpointed: list[dict], lora: list[dict]) -> dict[str, float]:
    """RUNTIME and ACTIVATION by least squares over probes without gradient checkpointing
    (peak - state - KV cache = RUNTIME + ACTIVATION x activations, the parts counted with every
    constant at 1), then GC_LAYERS, the one unknown left, from the checkpointed probes. STATE
    stays 1 (weights, gradients and both AdamW moments all live): the probes cannot separate it
    from the activations (both grow with the layers), and a free fit lands on 0.2, which
    would promise room that a second micro-batch (gradients held through its forward) needs."""
    import torch

    unit = dict(RUNTIME=0.0, STATE=1.0, ACTIVATION=1.0, GC_LAYERS=1.0, LORA_ACTIVATION=1.0)
    rows, y = [], []
    for r in plain:  # what ACTIVATION multiplies, and the rest (chunked logits are counted)
        fixed = _parts(r, **{**unit, "ACTIVATION": 0.0})["total"]
        rows.append([1.0, _parts(r, **unit)["total"] - fixed])
        y.append(r["peak_rss_mib"] * 2**20 - fixed)
    X, Y = torch.tensor(rows, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    runtime, act = torch.linalg.lstsq(X, Y.unsqueeze(1)).solution.squeeze(1).tolist()
    got = dict(RUNTIME=runtime, STATE=1.0, ACTIVATION=act, LORA_ACTIVATION=1.0)
    gcs = []
    for r in checkpointed:  # activations are linear in GC_LAYERS: solve from two evaluations
        a0 = _parts(r, **got, GC_LAYERS=0.0)
        a1 = _parts(r, **got, GC_LAYERS=1.0)
        gcs.append((r["peak_rss_mib"] * 2**20 - a0["total"]) / (a1["total"] - a0["total"]))
    got["GC_LAYERS"] = sum(gcs) / len(gcs) if gcs else 1.0
    loras = []
    for r in lora:  # the same for LORA_ACTIVATION, on the LoRA probes
        a0 = _parts(r, **{**got, "LORA_ACTIVATION": 0.0})
        a1 = _parts(r, **{**got, "LORA_ACTIVATION": 1.0})
        loras.append((r["peak_rss_mib"] * 2**20 - a0["total"]) / (a1["total"] - a0["total"]))
    got["LORA_ACTIVATION"] = sum(loras) / len(loras) if loras else 1.0
    return got


def longest(limit_gib: float, lora: bool, gc: bool, vocab: int) -> int:
    """The longest response (tokens) whose predicted peak fits in `limit_gib`, 0.5B shape."""
    per_layer = 896 * 896 * 2 + 896 * 128 * 2 + 3 * 896 * 4864 + 896 + 2 * 128 + 2 * 896
    params = QWEN05_LAYERS * per_layer + vocab * 896 * (1 if vocab > 1000 else 2) + 896
    # rank 16 A and B on rlvr's default targets: q, k, v, o, gate, up, down
    lora_params = QWEN05_LAYERS * 16 * (2 * (896 + 896) + 2 * (896 + 128) + 3 * (896 + 4864))
    shape = memory.Shape(
        QWEN05_LAYERS, 896, 4864, 128, vocab, params + lora * lora_params,
        lora_params if lora else params,
    )  # fmt: skip
    lo, hi = 0, 1 << 20
    while lo < hi:
        mid = (lo + hi + 1) // 2
        work = memory.Work(GROUP, GROUP, 47, mid, 0 if gc else 1, gc, False)
        if memory.predict(shape, work)["total"] <= limit_gib * memory.GIB:
            lo = mid
        else:
            hi = mid - 1
    return lo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", action="store_true", help="30M model, 64/256/1024, gc off/on")
    p.add_argument("--probes", action="store_true", help="the memory model's probes")
    p.add_argument("--vocab-probes", action="store_true", help="0.5B layer, 151,936 vocab")
    p.add_argument(
        "--full-probes", action="store_true", help="all 24 layers of 0.5B, 8-13 GiB each"
    )
    p.add_argument("--fit", action="store_true", help="fit the model's constants to the probes")
    p.add_argument("--limits", type=float, default=None, help="GiB: longest response, 0.5B")
    p.add_argument("--results", default=str(HERE / "results" / "memory.jsonl"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    path = Path(args.results)
    done = {}
    if path.exists():
        done = {r["probe"]: r for r in map(json.loads, path.read_text().splitlines())}
    todo = (LENGTHS if args.lengths else []) + (PROBES if args.probes else [])
    todo += VOCAB_PROBES if args.vocab_probes else []
    todo += FULL_PROBES if args.full_probes else []
    with tempfile.TemporaryDirectory(prefix="memory_") as tmp:
        for name, shape, length, gc, lora in todo:
            if name in done:
                continue
            rec = run_probe(name, shape, length, gc, lora, Path(tmp))
            pred = memory.predict(memory.Shape(**rec["shape"]), memory.Work(**rec["work"]))
            rec["predicted_mib"] = pred["total"] / 2**20
            done[name] = rec
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            print(
                f"{name}: peak RSS {rec['peak_rss_mib']:.0f} MiB, model predicts "
                f"{rec['predicted_mib']:.0f} MiB",
                flush=True,
            )
    if args.fit:
        plain = [done[n] for n, _, _, gc, lora in PROBES if n in done and not gc and not lora]
        gc = [done[n] for n, _, _, gc, _ in PROBES if n in done and gc]
        lora = [done[n] for n, _, _, _, lora in PROBES if n in done and lora]
        got = fit(plain, gc, lora)
        print(
            f"fit to {len(plain)} probes without and {len(gc)} with checkpointing: RUNTIME "
            f"{got['RUNTIME'] / memory.GIB:.3f} GiB, STATE {got['STATE']:.3f}, ACTIVATION "
            f"{got['ACTIVATION']:.3f}, GC_LAYERS {got['GC_LAYERS']:.2f}, LORA_ACTIVATION "
            f"{got['LORA_ACTIVATION']:.2f}"
        )
        for k, v in got.items():
            setattr(memory, k, v)  # for --limits below
        for r in [done[n] for n, *_ in PROBES + LENGTHS + VOCAB_PROBES + FULL_PROBES if n in done]:
            pred = _parts(r, **got)["total"] / 2**20
            print(
                f"  {r['probe']}: measured {r['peak_rss_mib']:.0f} MiB, model {pred:.0f} MiB "
                f"({pred / r['peak_rss_mib'] - 1:+.0%})"
            )
    if args.limits:
        for vocab in (108, QWEN05_VOCAB):
            for lora in (False, True):
                for gc in (False, True):
                    t = longest(args.limits, lora, gc, vocab)
                    print(
                        f"0.5B shape, vocab {vocab}, {'LoRA r16' if lora else 'full'}, "
                        f"gradient checkpointing {'on' if gc else 'off'}: longest response "
                        f"in {args.limits:g} GiB ~ {t} tokens (1 prompt x G={GROUP})"
                    )


if __name__ == "__main__":
    main()
