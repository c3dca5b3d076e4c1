"""Scoring a generation batch in parts while the next part is generated (`reward.overlap`):
the parts cover the batch in order, and a run that overlaps draws, scores and trains what the
same run without overlap does: the same samples, rewards and kept groups exactly, the floats to
fp32 rounding (its engine computes log-probs over a batch cut into parts, the plain run's over
the whole batch, and a matmul of another shape rounds differently on some CPUs)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from rlvr.cli.main import main
from rlvr.config.load import apply_changes
from rlvr.config.schema import Config
from rlvr.rewards.scoring import Scorer
from rlvr.training.overlap import PARTS, overlap_parts, part_bounds
from same_run import assert_same_run


@given(st.integers(0, 200), st.integers(1, 12))
def test_part_bounds_match_a_plain_split(n, parts):
    bounds = part_bounds(n, parts)
    # a plain loop: hand out the prompts one by one to the parts in turn, count, then cut
    k = max(1, min(parts, n))
    sizes = [0] * k
    for i in range(n):
        sizes[i % k] += 1
    expected, lo = [], 0
    for size in sizes:
        expected.append((lo, lo + size))
        lo += size
    assert bounds == expected
    assert all(hi > lo for lo, hi in bounds) or n == 0


def _reward(**values) -> Config:
    return apply_changes(Config(), {"reward": values}, "test")


def test_the_gate_overlaps_only_where_a_reward_runs_programs():
    cfg = Config()
    assert (
        overlap_parts(cfg.reward.overlap, Scorer.build(cfg, task=object())) == 1
    )  # "auto", a verifier
    code = _reward(accuracy="code")
    assert overlap_parts(code.reward.overlap, Scorer.build(code, task=None)) == PARTS
    forced = _reward(overlap="on")
    assert overlap_parts(forced.reward.overlap, Scorer.build(forced, task=object())) == PARTS
    off = _reward(accuracy="code", overlap="off")
    assert overlap_parts(off.reward.overlap, Scorer.build(off, task=None)) == 1


def _run(tmp_path, overlap: str) -> list[dict]:
    """A short run's metrics rows."""
    run = tmp_path / overlap
    argv = ["train", "--max-steps", "2", "--output-dir", str(run), "--no-progress"]
    argv += ["--rollout.seed_per_prompt=true", f"--reward.overlap={overlap}"]
    argv += ["--train.eval_size=8"]
    assert main(argv) == 0
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_an_overlapping_run_trains_what_a_plain_one_does(tmp_path):
    plain, overlapped = _run(tmp_path, "off"), _run(tmp_path, "on")
    assert len(plain) == 2
    assert_same_run(plain, overlapped)  # discrete outcomes exactly, floats to fp32 rounding
    assert any(0 < r["accuracy"] < 1 for r in plain)  # rewards that differ across responses
    for row in plain:
        assert row["time/scoring_wait"] == row["time/scoring"]  # nothing overlaps
    for row in overlapped:  # blocked at most for the scoring left, plus a thread switch
        assert 0 <= row["time/scoring_wait"] <= row["time/scoring"] + 0.05
