"""RL really learns: the built-in tiny model on its task, the default DAPO run, shortened."""

import json

import pytest

from rlvr.cli import main


@pytest.mark.slow
def test_reward_rises_on_the_default_task(tmp_path):
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--max-steps",
            "15",
            "--output-dir",
            str(run),
            "--train.eval_size=128",
            "--no-progress",
        ]
    )
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = sum(r["accuracy"] for r in rows[:5]) / 5
    last = sum(r["accuracy"] for r in rows[-5:]) / 5
    assert last > first + 0.15, (first, last)
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    assert before <= 0.4 and after > before + 0.2, (before, after)
