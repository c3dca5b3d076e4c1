"""The rollout server survives what a run survives: SIGKILL of the trainer (the server goes
with it) or of the server (the trainer ends with one line naming it), then --resume, gives the
uninterrupted run through the server (`python -m rlvr train` subprocesses, staleness 1)."""

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_resume import _resume, _run, _same_run, _wait_until
from test_rollout_server import _server_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("server") / "run"
    res = _run(_server_args(tiny_model_dir, run, 1))
    assert res.returncode == 0, res.stderr
    return run


def _server_pid(trainer: int) -> int:
    """The trainer's child running rlvr.rollout.server_main."""
    for task in os.listdir(f"/proc/{trainer}/task"):
        for child in Path(f"/proc/{trainer}/task/{task}/children").read_text().split():
            if b"rlvr.rollout.server_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    raise AssertionError("no server process")


def _gone(pid: int, timeout: float = 30) -> bool:
    start = time.time()
    while time.time() - start < timeout:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True  # a zombie: dead, waiting for its parent
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _killed_at_a_random_step(tiny_model_dir, run, who):
    proc = subprocess.Popen(
        _server_args(tiny_model_dir, run, 1),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    kill_after = random.Random().randint(1, 5)
    _wait_until((run / "checkpoints" / f"step-{kill_after:06d}").is_dir, proc)
    server = _server_pid(proc.pid)
    os.kill(proc.pid if who == "trainer" else server, signal.SIGKILL)
    proc.wait(timeout=120)
    return proc, server


@pytest.mark.compares_runs
def test_sigkill_of_the_trainer_then_resume(reference_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    proc, server = _killed_at_a_random_step(tiny_model_dir, run, "trainer")
    assert proc.returncode == -signal.SIGKILL
    assert _gone(server)  # the server does not outlive its trainer
    res = _resume(run)
    assert res.returncode == 0, res.stderr
    _same_run(reference_run, run)


@pytest.mark.compares_runs
def test_sigkill_of_the_server_then_resume(reference_run, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    proc, _ = _killed_at_a_random_step(tiny_model_dir, run, "server")
    err = proc.stderr.read().strip().splitlines()
    assert proc.returncode == 1, err
    assert err[-1].startswith("error: rollout server (pid ") and "killed by signal 9" in err[-1]
    res = _resume(run)
    assert res.returncode == 0, res.stderr
    _same_run(reference_run, run)
