"""Dynamic sampling's refills on the built-in model and task: adaptive refills (the default)
draw only about what is missing, full ones a whole batch each (verl's recipe); both fill every
step with the same number of groups."""

import json

from rlvr.cli.main import main


def _run(tmp_path, refill: str) -> list[dict]:
    run = tmp_path / refill
    rc = main(
        [
            "train",
            "--max-steps",
            "8",
            "--output-dir",
            str(run),
            "--train.eval_size=0",
            "--no-progress",
            f"--algo.refill={refill}",
        ]
    )
    assert rc == 0
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_adaptive_refills_generate_less_for_the_same_batches(tmp_path):
    # 8 steps: the default run's first refill is at step 6 (a step's 16 groups all mixed before)
    adaptive, full = _run(tmp_path, "adaptive"), _run(tmp_path, "full")
    for rows in (adaptive, full):
        assert [r["groups/kept"] for r in rows] == [16] * 8
        assert all(r["groups/incomplete"] == 0 for r in rows)
    assert any(r["groups/gen_batches"] > 1 for r in adaptive), "no refill: nothing tested"
    for r in full:  # whole batches: 16 prompts each
        assert r["groups/generated"] == 16 * r["groups/gen_batches"]
    for r in adaptive:  # a whole first batch, then smaller refills
        assert 16 < r["groups/generated"] < 16 * r["groups/gen_batches"] or (
            r["groups/gen_batches"] == 1 and r["groups/generated"] == 16
        )
    assert sum(r["groups/generated"] for r in adaptive) < sum(r["groups/generated"] for r in full)


def test_a_rank_with_an_empty_share_generates_and_scores_nothing(tmp_path):
    """A refill of fewer prompts than ranks leaves some rank an empty share: its engine,
    decoding, scorer and tally must take an empty batch (the built-in model and task)."""
    from rich.console import Console

    from rlvr.config.load import load_config
    from rlvr.rollout import SamplingParams, decode_completions
    from rlvr.training.collect import Tally
    from rlvr.training.trainer import setup

    cfg = load_config(None, {"train": {"output_dir": str(tmp_path / "run"), "eval_size": 0}})
    run, _ = setup(cfg, None, Console(quiet=True))
    params = SamplingParams(n=cfg.rollout.group_size, max_new_tokens=8, temperature=1.0, seed=0)
    rollout = run.engine.generate([], params)
    assert rollout.completion_ids.shape[0] == 0
    completions = decode_completions(run.tokenizer, rollout)
    scores = run.scorer([], completions, rollout)
    assert scores.total.numel() == 0 and scores.correct.numel() == 0
    tally = Tally()
    tally.add(rollout, scores, completions, cfg.rollout.group_size)
    assert tally.sums["n"] == 0
