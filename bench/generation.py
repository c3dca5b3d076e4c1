"""Rollout throughput: the `hf` engine (`model.generate`) against the `fast` engine.

    python bench/generation.py                 # both models, 16 prompts x G=8, 64 tokens forced
    python bench/generation.py --model vs_trl --repeats 3
    python bench/generation.py --eos-frac 0.05 --variants fast,fast-noretire   # retirement

Runs alternate (A B A B ...) so that drift in the machine's load hits every engine alike;
each engine is warmed up once first. Lengths are forced to the cap by default: the EOS id
is outside the vocabulary, so it can never be sampled. With `--eos-frac F`, a fraction F of
the vocabulary counts as EOS instead, so rows finish at different steps (what retiring
finished rows is for). Completion tokens/s counts generated tokens, EOS included.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from rlvr.models import build_tiny_model, build_tokenizer
from rlvr.rollout import FastEngine, HFEngine, SamplingParams

MODELS = {
    # The built-in rlvr-tiny shape (build_tiny_model defaults).
    "tiny": dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384),
    # The shape of bench/vs_trl.py's comparison model (hidden 256, 4 layers, 4 heads,
    # intermediate 1024), built as a Llama like the tiny one.
    "vs_trl": dict(
        hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=4, intermediate_size=1024
    ),
}

VARIANTS = {
    "hf": lambda m, pad, eos: HFEngine(m, pad_id=pad, eos_ids=eos),
    "fast": lambda m, pad, eos: FastEngine(m, pad_id=pad, eos_ids=eos),
    "fast-noretire": lambda m, pad, eos: FastEngine(
        m, pad_id=pad, eos_ids=eos, retire_fraction=None
    ),
    "fast-retire-each": lambda m, pad, eos: FastEngine(
        m, pad_id=pad, eos_ids=eos, retire_fraction=0.0
    ),
    "fast-noprefix": lambda m, pad, eos: FastEngine(
        m, pad_id=pad, eos_ids=eos, prefix_attention=False
    ),
    "fast-unpacked": lambda m, pad, eos: FastEngine(m, pad_id=pad, eos_ids=eos, pack_weights=False),
    "fast-dynamic": lambda m, pad, eos: FastEngine(m, pad_id=pad, eos_ids=eos, cache="dynamic"),
}


def make_prompts(tok, n: int, seed: int = 0) -> list[list[int]]:
    """Chat-formatted arithmetic questions of varied length (so prompts are left-padded)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        terms = [str(rng.randint(1, 10 ** rng.randint(1, 4))) for _ in range(rng.randint(2, 5))]
        question = f"What is {' + '.join(terms)}? Think, then answer."
        text = tok.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tok.encode(text))
    return prompts


def run_once(engine, prompts, params) -> tuple[float, int]:
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    return time.perf_counter() - start, int(out.lengths.sum())


def bench_model(name: str, args) -> dict[str, float]:
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0, max_position_embeddings=512, **MODELS[name]).eval()
    vocab = model.config.vocab_size
    if args.eos_frac > 0:
        k = max(1, round(args.eos_frac * vocab))
        eos_ids = random.Random(1).sample(range(vocab), k)
    else:
        eos_ids = [vocab + 1000]  # never sampled: every row runs to max_new_tokens
    prompts = make_prompts(tok, args.prompts)
    params = SamplingParams(
        n=args.group, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0
    )
    names = args.variants.split(",")
    engines = {v: VARIANTS[v](model, tok.pad_token_id, eos_ids) for v in names}
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"\n== {name}: {n_params / 1e6:.2f}M params, {len(prompts)} prompts x G={args.group}, "
        f"max_new_tokens={args.max_new_tokens}, eos_frac={args.eos_frac}, "
        f"prompt lengths {min(map(len, prompts))}..{max(map(len, prompts))}"
    )
    for v in names:  # warm-up (first-call allocations, lazy imports)
        run_once(engines[v], prompts[:2], SamplingParams(n=2, max_new_tokens=4))
    rates: dict[str, list[float]] = {v: [] for v in names}
    for r in range(args.repeats):
        for v in names:
            secs, tokens = run_once(engines[v], prompts, params)
            rates[v].append(tokens / secs)
            print(
                f"  run {r} {v:>16}: {tokens:6d} tokens in {secs:6.2f} s = {tokens / secs:8.0f} tok/s"
            )
    # On a shared machine the best run is the least disturbed one; the median shows the spread.
    medians = {v: statistics.median(x) for v, x in rates.items()}
    best = {v: max(x) for v, x in rates.items()}
    for v in names:
        print(f"  {v:>16}: median {medians[v]:8.0f} tok/s, best {best[v]:8.0f} tok/s")
    base = names[0]
    for v in names[1:]:
        print(
            f"  ratio {v} / {base}: median {medians[v] / medians[base]:.2f}x, "
            f"best {best[v] / best[base]:.2f}x"
        )
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, "both"], default="both")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="A B rounds per engine")
    parser.add_argument("--variants", default="hf,fast", help=f"comma list of {list(VARIANTS)}")
    parser.add_argument("--eos-frac", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in MODELS if args.model == "both" else [args.model]:
        bench_model(name, args)


if __name__ == "__main__":
    main()
