"""Bounded staleness end to end (`python -m rlvr train` subprocesses, train.max_staleness 1
and 2): no trained sample is beyond the bound, the stale steps' importance weights are not 1,
and a SIGKILL at any step (or in the middle of a checkpoint) then --resume gives the run an
uninterrupted one gives, bit for bit: the batches produced ahead are in the checkpoint."""

import json
import random
import signal
import subprocess

import pytest

from test_resume import STEPS, _args, _resume, _run, _same_run, _wait_until

pytestmark = pytest.mark.slow


def _stale_args(model_dir, run, k):
    return [*_args(model_dir, run), f"--train.max_staleness={k}", "--algo.rollout_correction=token"]


@pytest.fixture(scope="module")
def reference_runs(tiny_model_dir, tmp_path_factory):
    runs = {}
    for k in (1, 2):
        run = tmp_path_factory.mktemp(f"stale{k}") / "run"
        res = _run(_stale_args(tiny_model_dir, run, k))
        assert res.returncode == 0, res.stderr
        runs[k] = run
    return runs


@pytest.mark.parametrize("k", [1, 2])
def test_no_trained_sample_is_beyond_the_bound(reference_runs, k):
    rows = [json.loads(x) for x in (reference_runs[k] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # step t trains on the batch sampled by version max(t - 1 - k, 0): the first k + 1
    # batches come from the initial weights
    assert [r["staleness/max"] for r in rows] == [min(t - 1, k) for t in range(1, STEPS + 1)]
    assert all(r["staleness/mean"] == r["staleness/max"] for r in rows)
    assert rows[0]["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-6)  # on-policy
    assert all(abs(r["rollout/is_weight_mean"] - 1.0) > 1e-5 for r in rows[1:])


@pytest.mark.compares_runs
@pytest.mark.parametrize("k", [1, 2])
def test_sigkill_at_a_random_step_then_resume(reference_runs, tiny_model_dir, tmp_path, k):
    run = tmp_path / "run"
    kill_after = random.Random().randint(1, STEPS - 1)
    proc = subprocess.Popen(
        _stale_args(tiny_model_dir, run, k),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_until((run / "checkpoints" / f"step-{kill_after:06d}").is_dir, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = _resume(run)
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr
    _same_run(reference_runs[k], run)


@pytest.mark.compares_runs
def test_sigkill_in_the_middle_of_a_checkpoint(reference_runs, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    res = _run(_stale_args(tiny_model_dir, run, 1), env={"RLVR_FAULT": "save:3"})
    assert res.returncode == -signal.SIGKILL
    res = _resume(run)
    assert res.returncode == 0, res.stderr
    assert "from step-000002" in res.stderr
    _same_run(reference_runs[1], run)


def test_the_hf_engine_is_corrected_with_the_sampling_weights(tiny_model_dir, tmp_path):
    """hf reports no log-probs: the producer's forward of the weights that sampled is mu, so
    the on-policy first step has weights exactly 1 and the stale ones do not."""
    run = tmp_path / "run"
    res = _run([*_stale_args(tiny_model_dir, run, 1), "--rollout.engine=hf", "--max-steps=3"])
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["staleness/max"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[0]["rollout/is_weight_mean"] == 1.0
    assert all(abs(r["rollout/is_weight_mean"] - 1.0) > 1e-5 for r in rows[1:])
