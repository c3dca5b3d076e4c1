"""Crash, resume, and get the same run: SIGKILL at a random step and mid-checkpoint, SIGTERM,
and a corrupt newest checkpoint. The runs are real subprocesses of `python -m rlvr train`."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

USER_REWARD = f"{Path(__file__).parent / 'e2e_rewards.py'}:digit_share=1.0"
STEPS = 6


def _args(model_dir, run, steps=STEPS):
    return [
        sys.executable,
        "-m",
        "rlvr",
        "train",
        "--preset",
        "grpo",
        f"--model.name_or_path={model_dir}",
        f"--reward.extra={USER_REWARD}",
        "--rollout.prompts_per_step=4",
        "--rollout.group_size=4",
        "--rollout.max_new_tokens=10",
        "--train.eval_size=8",
        "--data.train_size=64",
        "--optim.lr=1e-3",
        "--train.threads=1",
        "--save-every",
        "1",
        "--max-steps",
        str(steps),
        "--output-dir",
        str(run),
        "--no-progress",
    ]


def _run(args, env=None, **kw):
    return subprocess.run(
        args, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}, **kw
    )


def _resume(run, *extra):
    return _run(
        [sys.executable, "-m", "rlvr", "train", "--resume", str(run), "--no-progress", *extra]
    )


def _math(run):
    """metrics.jsonl without the wall-clock fields, which differ run to run by nature."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and k != "tokens_per_s"}
        for r in rows
    ]


def _final_weights(run):
    ckpts = sorted((run / "checkpoints").glob("step-*"))
    return load_file(str(ckpts[-1] / "model.safetensors"))


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("ref") / "run"
    res = _run(_args(tiny_model_dir, run))
    assert res.returncode == 0, res.stderr
    return run


def _wait_until(ready, proc: subprocess.Popen, timeout=120):
    start = time.time()
    while time.time() - start < timeout:
        if ready():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()}")
        time.sleep(0.01)
    raise AssertionError("timed out waiting for the run")


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen):
    _wait_until(lambda: path.exists() and len(path.read_text().splitlines()) >= n, proc)


def _same_run(a, b):
    assert _math(a) == _math(b)  # bit for bit: floats compared exactly
    wa, wb = _final_weights(a), _final_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert (wa[k] == wb[k]).all(), k
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    assert sa["eval_before"] == sb["eval_before"] and sa["eval_after"] == sb["eval_after"]


def test_sigkill_at_a_random_step_then_resume(reference_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    kill_after = random.Random().randint(1, STEPS - 1)
    proc = subprocess.Popen(
        _args(tiny_model_dir, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # the metrics line of a step is written before its checkpoint: wait for the renamed
    # (complete) checkpoint directory, else a kill at step 1 legitimately starts over
    ckpt = run / "checkpoints" / f"step-{kill_after:06d}"
    _wait_until(ckpt.is_dir, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = _resume(run)
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr
    _same_run(reference_run, run)


def test_sigkill_in_the_middle_of_a_checkpoint(reference_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    # killed while writing the 3rd checkpoint: the model is on disk, the manifest is not
    res = _run(_args(tiny_model_dir, run), env={"RLVR_FAULT": "save:3"})
    assert res.returncode == -signal.SIGKILL
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == [".tmp-step-000003", "step-000001", "step-000002"]
    res = _resume(run)
    assert res.returncode == 0, res.stderr
    assert "from step-000002" in res.stderr
    assert not list((run / "checkpoints").glob(".tmp-*"))
    _same_run(reference_run, run)


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "delete_manifest"])
def test_damaged_newest_checkpoint_is_refused_by_name(
    reference_run, tiny_model_dir, tmp_path, damage
):
    run = tmp_path / "run"
    res = _run(_args(tiny_model_dir, run, steps=3))
    assert res.returncode == 0, res.stderr
    newest = run / "checkpoints" / "step-000003"
    weights = newest / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "corrupt":
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    else:
        (newest / "manifest.json").unlink()
    res = _resume(run, f"--max-steps={STEPS}")
    assert res.returncode == 0, res.stderr
    assert "refusing checkpoint" in res.stderr and "step-000003" in res.stderr
    assert "from step-000002" in res.stderr
    _same_run(reference_run, run)


def test_sigterm_saves_and_exits_zero(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        _args(tiny_model_dir, run, steps=200),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_lines(run / "metrics.jsonl", 1, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "rlvr train --resume" in err
    steps = len((run / "metrics.jsonl").read_text().splitlines())
    assert (run / "checkpoints" / f"step-{steps:06d}" / "manifest.json").is_file()


def test_resume_refuses_changes_to_the_math(reference_run, tmp_path):
    res = _resume(reference_run, "--algo.clip_high=0.3")
    assert res.returncode == 2
    assert "cannot change algo.clip_high" in res.stderr


def test_killed_before_the_first_checkpoint_starts_over(reference_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    res = _run(_args(tiny_model_dir, run), env={"RLVR_FAULT": "save:1"})  # dies saving step 1
    assert res.returncode == -signal.SIGKILL
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
    res = _resume(run)
    assert res.returncode == 0, res.stderr
    assert "starting the run over from step 0" in res.stderr
    _same_run(reference_run, run)
