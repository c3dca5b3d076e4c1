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
    # the run's reward file named again: resume imports only code named on the command line
    again = f"--reward.extra={USER_REWARD}"
    return _run([sys.executable, "-m", "rlvr", "train", "--resume", str(run), again, "--no-progress", *extra])  # fmt: skip


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


@pytest.mark.compares_runs
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


@pytest.mark.compares_runs
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


@pytest.mark.parametrize("damage", ["garbage_manifest", "empty_files_manifest"])
def test_malformed_newest_manifest_falls_back(reference_run, tiny_model_dir, tmp_path, damage):
    run = tmp_path / "run"
    res = _run(_args(tiny_model_dir, run, steps=3))
    assert res.returncode == 0, res.stderr
    manifest = run / "checkpoints" / "step-000003" / "manifest.json"
    manifest.write_bytes(
        b"\x89\xff\x00binary" if damage == "garbage_manifest" else b'{"files": {}}'
    )
    res = _resume(run, f"--max-steps={STEPS}")
    assert res.returncode == 0, res.stderr
    assert "refusing checkpoint" in res.stderr and "manifest.json" in res.stderr
    assert "from step-000002" in res.stderr
    _same_run(reference_run, run)


def test_all_checkpoints_corrupt_refuses_to_resume(tiny_model_dir, tmp_path):
    """Never starts over silently, never deletes: one error line naming the run and each
    checkpoint's reason, exit 2, every file as it was."""
    run = tmp_path / "run"
    res = _run(_args(tiny_model_dir, run, steps=3))
    assert res.returncode == 0, res.stderr
    (run / "checkpoints" / "step-000003" / "manifest.json").write_bytes(b"\xff\xfe")
    weights = run / "checkpoints" / "step-000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    before = _files(run)
    res = _resume(run, f"--max-steps={STEPS}")
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    assert f"--resume {run}: no checkpoint verifies" in errors[0]
    assert "step-000003: manifest.json is not UTF-8 text" in errors[0]
    assert "step-000002: file model.safetensors has 100 bytes" in errors[0]
    assert "starting the run over" not in res.stderr
    assert _files(run) == before


def _files(run):
    """Every file of a run and its bytes (the lock file holds the last holder's pid)."""
    return {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "rlvr.lock"}


def test_partial_last_metrics_line_does_not_block_resume(reference_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    res = _run(_args(tiny_model_dir, run, steps=3))
    assert res.returncode == 0, res.stderr
    with open(run / "metrics.jsonl", "ab") as f:  # a crash in the middle of writing step 4
        f.write(b'{"step": 4, "loss": 0.12')
    res = _resume(run, f"--max-steps={STEPS}")
    assert res.returncode == 0, res.stderr
    assert "metrics.jsonl:4: dropping an incomplete last line" in res.stderr
    _same_run(reference_run, run)


def test_a_live_run_directory_is_locked(tiny_model_dir, tmp_path):
    """`--resume` of a live run (one long enough to outlast the checks) and a second run on
    its directory are refused naming the holder's pid; two runs started together on one new
    directory: exactly one runs."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        _args(tiny_model_dir, run, steps=100_000), stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_lines(run / "metrics.jsonl", 1, proc)
        for res in (_resume(run), _run(_args(tiny_model_dir, run))):
            assert res.returncode == 2, res.stderr
            assert f"{run} is in use by another rlvr run (pid {proc.pid})" in res.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert proc.returncode == 0
    twin = tmp_path / "twin"
    both = [
        subprocess.Popen(_args(tiny_model_dir, twin, steps=2), stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    errs = [p.communicate(timeout=300)[1] for p in both]
    codes = sorted(p.returncode for p in both)
    assert codes == [0, 2], errs
    loser = errs[[p.returncode for p in both].index(2)]
    assert "is in use by another rlvr run" in loser or "already holds a run" in loser
    assert len((twin / "metrics.jsonl").read_text().splitlines()) == 2


def test_disk_full_during_a_save_then_resume(reference_run, tiny_model_dir, tmp_path):
    """A real 900 kB tmpfs holds two of the tiny run's ~310 kB checkpoints and its logs but
    not a third: the save of step 3 fails naming the cause, leaves no staging directory, and
    after the disk grows the run resumes from step 2 and ends as the uninterrupted one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=900k", "tmpfs", str(disk)], capture_output=True
    )
    if mount.returncode:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mount.stderr.decode().strip()}")
    try:
        run = disk / "run"
        res = _run(_args(tiny_model_dir, run))
        assert res.returncode == 2, res.stderr
        assert f"error: checkpoint step 3: no space left on device at {run / 'checkpoints'}" in (
            res.stderr
        )
        assert "need ~" in res.stderr
        names = sorted(p.name for p in (run / "checkpoints").iterdir())
        assert names == ["step-000001", "step-000002"]
        subprocess.run(["mount", "-o", "remount,size=20m", str(disk)], check=True)
        res = _resume(run)
        assert res.returncode == 0, res.stderr
        assert "from step-000002" in res.stderr
        _same_run(reference_run, run)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
