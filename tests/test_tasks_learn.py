"""RL really learns every built-in task: `rlvr train --data.task=T` with the built-in model and
the task's own defaults, shortened, lifts held-out accuracy by at least 30 points (the full
default runs measure +40 or more; README, "The built-in model and tasks")."""

import json

import pytest

from rlvr.cli import main
from rlvr.tasks import TASKS

# Steps per task: half to two thirds of each default run (TINY_TASK_DEFAULTS), a few minutes here.
STEPS = {"arithmetic": 40, "chain": 120, "sort": 30, "calc": 40}


def test_every_built_in_task_has_a_learning_test():
    assert set(STEPS) == set(TASKS)


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(STEPS))
def test_default_run_lifts_held_out_accuracy(task, tmp_path):
    run = tmp_path / task
    argv = ["train", f"--data.task={task}", "--max-steps", str(STEPS[task])]
    argv += ["--output-dir", str(run), "--train.eval_size=128", "--no-progress"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = sum(r["accuracy"] for r in rows[:5]) / 5
    last = sum(r["accuracy"] for r in rows[-5:]) / 5
    assert last > first + 0.15, (task, first, last)
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    assert before <= 0.45 and after >= before + 0.30, (task, before, after)
