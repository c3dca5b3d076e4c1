"""The checks of `scripts/multinode_sim.sh`'s runs, each one line per finding, exit 1 on a miss.

    python scripts/multinode_check.py run RUN STEPS [REF]  # steps 1..STEPS once each, on 2 ranks
    python scripts/multinode_check.py same ONE TWO     # TWO (2 ranks) trains what ONE (1 process) does

`run`: metrics.jsonl holds each step once, in order; every trained step's server log-probs are
the trainer's within fp32 rounding (rank 0 pushed the weights to the server on the other node,
and the server sampled with them); summary.json says 2 ranks. With REF (the undisturbed run of
a run resumed after a fault): every checkpoint's weights are REF's, bit for bit (a resume
replays the same arithmetic on the same host).
`same`: the two runs sampled the same tokens and kept the same groups (exactly), their losses
agree within fp32 sums, and the weights after each step are within the 2-rank FSDP2 tolerance
of tests/same_run.py (the one `tests/test_vllm_server.py` applies to FSDP2 against one process).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
# fp32 server against the fp32 trainer: rounding only (tests/test_vllm_server.py's FP32_MAX)
FP32_MAX = 2e-3
SAME_KEYS = ("groups/kept", "reward/mean", "response/length_mean", "loss")


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def check_run(run: Path, steps: int, ref: Path | None) -> list[str]:
    found = rows(run)
    misses = []
    if [r["step"] for r in found] != list(range(1, steps + 1)):
        misses.append(f"{run}: steps {[r['step'] for r in found]}, expected 1..{steps} once each")
    for r in found:
        diff = r.get("rollout/logprob_diff_max", math.nan)
        if diff > FP32_MAX:
            misses.append(
                f"{run}: step {r['step']}: server log-probs {diff:.2e} from the trainer's"
            )
        trained = (f"loss {r['loss']:+.4f}, server log-probs within {diff:.1e} of the trainer's"
                   if math.isfinite(r.get("loss", math.nan)) else "nothing to train on")  # fmt: skip
        print(
            f"  step {r['step']}: reward {r['reward/mean']:.3f}, {trained}, {r['time/step']:.1f} s"
        )
    world = json.loads((run / "summary.json").read_text()).get("world_size")
    if world != 2:
        misses.append(f"{run}: summary.json world_size {world}, expected 2")
    if ref is not None:
        misses += same_checkpoints(run, ref)
    return misses


def same_checkpoints(run: Path, ref: Path) -> list[str]:
    """Each checkpoint of `run` holds `ref`'s weights at that step, bit for bit."""
    import torch
    from safetensors.torch import load_file

    misses, steps = [], sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    for step in steps:
        a = load_file(str(run / "checkpoints" / step / "model.safetensors"))
        b = load_file(str(ref / "checkpoints" / step / "model.safetensors"))
        if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
            misses.append(f"{run}: {step}'s weights differ from {ref}'s")
    print(f"  checkpoints {', '.join(steps)}: the undisturbed run's weights, bit for bit")
    return misses


def check_same(one: Path, two: Path) -> list[str]:
    import yaml
    from safetensors.torch import load_file

    from same_run import FSDP2_FLIPS, WEIGHTS, fsdp2_weight_differences, run_differences

    misses = run_differences(rows(one), rows(two), keys=SAME_KEYS)
    lr = float(yaml.safe_load((two / "config.yaml").read_text())["optim"]["lr"])
    for r in rows(two):
        name = f"checkpoints/step-{r['step']:06d}/model.safetensors"
        w1, w2 = load_file(str(one / name)), load_file(str(two / name))
        beyond, largest = fsdp2_weight_differences(w1, w2)
        total = sum(t.numel() for t in w1.values())
        print(f"  step {r['step']}: {beyond} of {total:,} weights beyond {WEIGHTS.abs:g} of one "
              f"process's, the largest difference {largest:.1e}")  # fmt: skip
        if beyond > FSDP2_FLIPS or largest > 2 * lr:
            misses.append(f"step {r['step']}: {beyond} beyond {WEIGHTS.abs:g} (at most "
                          f"{FSDP2_FLIPS}), largest {largest:.1e} (at most 2 lr = {2 * lr:g})")  # fmt: skip
    return misses


def main(argv: list[str]) -> int:
    usage = {"run": (3, 4), "same": (3,)}
    if not argv or len(argv) not in usage.get(argv[0], ()):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv[0] == "run":
        misses = check_run(Path(argv[1]), int(argv[2]), Path(argv[3]) if len(argv) == 4 else None)
    else:
        misses = check_same(Path(argv[1]), Path(argv[2]))
    for m in misses:
        print(f"error: {m}", file=sys.stderr)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
