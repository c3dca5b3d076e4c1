"""A reward that hangs, in a real `rlvr train`: reward.timeout_s ends the step with the
reward's name and no committed update, and SIGTERM during the hang still ends the run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two tiny training runs, about 25 s each

HANG = """
import pathlib, time
def hang(completions, **kwargs):
    pathlib.Path(__file__).with_suffix(".called").touch()
    time.sleep(3600)
"""


def _train(model_dir, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    reward = tmp_path / "hang_reward.py"
    reward.write_text(HANG)
    run = tmp_path / "run"
    args = [sys.executable, "-m", "rlvr", "train", "--preset", "grpo",
            f"--model.name_or_path={model_dir}", f"--reward.extra={reward}:hang=1",
            "--rollout.prompts_per_step=2", "--rollout.group_size=2",
            "--rollout.max_new_tokens=4", "--train.eval_size=2", "--data.train_size=16",
            "--train.threads=1", "--save-every", "1", "--max-steps", "3",
            "--output-dir", str(run), "--no-progress", *extra]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, run, reward.with_suffix(".called")


def _steps(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def test_a_hanging_reward_ends_the_step_by_name_with_no_update(tiny_model_dir, tmp_path):
    proc, run, _ = _train(tiny_model_dir, tmp_path, "--reward.timeout_s=2")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "reward 'hang'" in err and "reward.timeout_s=2 s" in err, err[-2000:]
    assert _steps(run) == 0  # no step was committed
    assert (
        not list((run / "checkpoints").glob("step-*")) if (run / "checkpoints").exists() else True
    )


def test_sigterm_during_a_hanging_reward_ends_the_run(tiny_model_dir, tmp_path):
    proc, run, called = _train(tiny_model_dir, tmp_path, "--reward.timeout_s=4",
                               "--reward.on_error=zero")  # fmt: skip
    deadline = time.monotonic() + 240
    while not called.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert time.monotonic() - t0 < 60
    assert _steps(run) == 1 and "rlvr train --resume" in err  # the step finished, then saved
