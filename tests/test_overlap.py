"""Scoring a generation batch in parts while the next part is generated (`reward.overlap`):
the parts cover the batch in order, and a run that overlaps draws, scores and trains exactly
what the same run without overlap does."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from rlvr.cli import main
from rlvr.config import Config, apply_changes
from rlvr.rewards.scoring import Scorer
from rlvr.train.overlap import PARTS, overlap_parts, part_bounds


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
    assert overlap_parts(cfg, Scorer.build(cfg, task=object())) == 1  # "auto", a verifier
    code = _reward(accuracy="code")
    assert overlap_parts(code, Scorer.build(code, task=None)) == PARTS
    forced = _reward(overlap="on")
    assert overlap_parts(forced, Scorer.build(forced, task=object())) == PARTS
    off = _reward(accuracy="code", overlap="off")
    assert overlap_parts(off, Scorer.build(off, task=None)) == 1


def _run(tmp_path, overlap: str) -> tuple[list[dict], list[dict]]:
    """A short run's metrics without and with its timings."""
    run = tmp_path / overlap
    argv = ["train", "--max-steps", "2", "--output-dir", str(run), "--no-progress"]
    argv += ["--rollout.seed_per_prompt=true", f"--reward.overlap={overlap}"]
    argv += ["--train.eval_size=8"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    timing = ("time/", "tokens_per_s")  # seconds, and rates per second
    return [{k: v for k, v in r.items() if not k.startswith(timing)} for r in rows], rows


def test_an_overlapping_run_trains_exactly_what_a_plain_one_does(tmp_path):
    (plain, plain_rows), (overlapped, overlapped_rows) = _run(tmp_path, "off"), _run(tmp_path, "on")
    assert len(plain) == 2 and plain == overlapped
    assert any(0 < r["accuracy"] < 1 for r in plain)  # rewards that differ across responses
    for row in plain_rows:
        assert row["time/scoring_wait"] == row["time/scoring"]  # nothing overlaps
    for row in overlapped_rows:  # blocked at most for the scoring left, plus a thread switch
        assert 0 <= row["time/scoring_wait"] <= row["time/scoring"] + 0.05
