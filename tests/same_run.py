"""One way to compare two runs, or two computations, that do the same math by other arithmetic.

Two runs that sample the same tokens still differ in their last bits when the arithmetic
differs: a generation batch cut into parts, another number of ranks or threads, another CPU
kernel set (`ATEN_CPU_CAPABILITY`, `RLVR_NATIVE=0`, another processor's MKL/oneDNN path) blocks
and sums a matmul in another order. Such a comparison checks

- the discrete outcomes exactly: the step, what was sampled and scored (rewards, accuracy,
  lengths, token counts), which groups were kept, the counts of updates and skips;
- every other float within a tolerance written here with its reason;
- no timings.

Bit-equality stays only where the very same arithmetic runs twice on the same host (a resume
replaying a step, a run repeated as it was): those tests use `==` directly, not this.

`tests/test_same_run.py` checks the helper itself; `scripts/cpu_capabilities.sh` runs every
test that compares two runs under arithmetic that differs from this host's (one thread, AVX2
kernels, rlvr's C kernels off), so a new exact comparison of such floats fails here first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    """|a - b| <= abs + rel * |b|, and why a difference that large is still the same math."""

    rel: float
    abs: float
    why: str


FP32_SUMS = Tolerance(
    rel=1e-4,
    abs=1e-6,
    why="fp32 means and norms over a few thousand terms of size <= ~1, summed in another order: "
    "a few ulps each, so 1e-4 of the value leaves two orders of magnitude of margin",
)
ENGINE_GAP = Tolerance(
    rel=0.0,
    abs=1e-5,
    why="the engine's and the trainer's log-probs of one token differ by rounding alone "
    "(< 1e-5, tests/test_rollout_fast.py): the gap's mean, max and KL, and the importance "
    "weights exp(gap), are that rounding, so another batch shape changes them wholesale",
)
WEIGHTS = Tolerance(
    rel=0.0,
    abs=1e-5,
    why="a few Adam steps at lr <= 1e-3 from gradients that differ in their last bits: "
    "Adam's normalised step moves a weight by ~lr, so an ulp-level gradient change moves it "
    "far less than 1e-5",
)

# Keys (a prefix, or the whole name) whose values are discrete outcomes of a run: counts,
# fractions of counts, rewards of sampled text, the schedule. Compared exactly.
DISCRETE = (
    "step",
    "reward/",
    "rewards/",
    "accuracy",
    "groups/",
    "response/",
    "generated_tokens",
    "responses",
    "loss_tokens",
    "optimizer_steps",
    "nonfinite_updates",
    "update/skipped",
    "bad_step_streak",
    "lr",
    "staleness/",
    "tools/",
    "eval/accuracy",
    "warn/",
    "info/",
)
# Keys of the floats whose tolerance is not FP32_SUMS.
FLOATS = {"rollout/logprob_diff": ENGINE_GAP, "rollout/mismatch_kl": ENGINE_GAP}
TIMINGS = ("time/", "tokens_per_s", "memory/")


def _matches(key: str, pattern: str) -> bool:
    return key == pattern or (pattern.endswith("/") and key.startswith(pattern))


def tolerance(key: str, floats: Mapping[str, Tolerance], default: Tolerance) -> Tolerance | None:
    """None for a discrete key; else the tolerance of the longest pattern matching `key`."""
    if any(_matches(key, p) for p in DISCRETE if p not in floats):
        return None
    best = max((p for p in floats if key.startswith(p)), key=len, default=None)
    return floats[best] if best is not None else default


def _differs(a, b, tol: Tolerance | None) -> bool:
    if tol is None or not isinstance(a, float) or not isinstance(b, (float, int)):
        return a != b and not (_nan(a) and _nan(b))
    if math.isnan(a) or math.isnan(b):
        return not (math.isnan(a) and math.isnan(b))
    return abs(a - b) > tol.abs + tol.rel * abs(b)


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def run_differences(
    a: Sequence[Mapping],
    b: Sequence[Mapping],
    floats: Mapping[str, Tolerance] | None = None,
    default: Tolerance = FP32_SUMS,
    ignore: Sequence[str] = TIMINGS,
    keys: Sequence[str] | None = None,
) -> list[str]:
    """Every difference between two runs' metrics rows beyond what their arithmetic explains:
    rows and keys must match; discrete keys exactly; floats within their tolerance. `keys`
    limits the comparison to those keys, each of which both rows must have."""
    floats = {**FLOATS, **(floats or {})}
    if len(a) != len(b):
        return [f"{len(a)} rows against {len(b)}"]
    out = []
    for i, (ra, rb) in enumerate(zip(a, b)):
        where = f"row {i} (step {ra.get('step', '?')})"
        if keys is not None:
            ra, rb = ({k: r.get(k, "<missing>") for k in keys} for r in (ra, rb))
        keys_a = {k for k in ra if not k.startswith(tuple(ignore))}
        keys_b = {k for k in rb if not k.startswith(tuple(ignore))}
        if keys_a != keys_b:
            out.append(f"{where}: keys differ: {sorted(keys_a ^ keys_b)}")
        for key in sorted(keys_a & keys_b):
            tol = tolerance(key, floats, default)
            if _differs(ra[key], rb[key], tol):
                bound = "exactly (discrete)" if tol is None else f"rel {tol.rel}, abs {tol.abs}"
                out.append(f"{where}: {key} {ra[key]!r} != {rb[key]!r} ({bound})")
    return out


def assert_same_run(
    a, b, floats=None, default: Tolerance = FP32_SUMS, ignore=TIMINGS, keys=None
) -> None:
    """Fail with every difference of `run_differences`, one a line."""
    diffs = run_differences(a, b, floats, default, ignore, keys)
    assert not diffs, "the two runs differ:\n" + "\n".join(diffs)


def assert_same_weights(
    a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], tol: Tolerance = WEIGHTS, where=""
) -> None:
    """Every tensor of `a` found by name in `b`, of the same shape and dtype, within `tol`.
    `b` may hold more: a checkpoint gathered from FSDP2 shards also names a tied head."""
    assert a.keys() <= b.keys(), f"{where}: missing {sorted(set(a) - set(b))}"
    assert a
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=tol.abs, rtol=tol.rel, msg=f"{where} {k}")


# FSDP2 against one process: FSDP2 reduce-scatters the gradients in another order, so an
# element whose gradient is rounding-sized may take Adam's first step (+-lr, sign(g)) the other
# way: a few elements (2 of rlvr-tiny's 801,408 measured) differ by up to 2 lr, the rest within
# WEIGHTS.
FSDP2_FLIPS = 10


def fsdp2_weight_differences(
    a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]
) -> tuple[int, float]:
    """(elements of `a` beyond WEIGHTS.abs from `b`, the largest difference)."""
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    return int((diff > WEIGHTS.abs).sum()), float(diff.max())


def assert_same_fsdp2_weights(a, b, lr: float, where: str = "") -> None:
    """At most FSDP2_FLIPS elements beyond WEIGHTS.abs, none beyond 2 lr (above)."""
    beyond, largest = fsdp2_weight_differences(a, b)
    assert beyond <= FSDP2_FLIPS and largest <= 2 * lr, (where, beyond, largest)
