"""A run directory is its owner's only: under the usual umask 022, a real training run (CLI
and Python API, checkpoints and TensorBoard included) and a real `rlvr rm` run leave no
directory and no file with a group or other permission bit. The control: a file written the
ordinary way under the same umask is readable by everyone."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import rlvr
from conftest import small_run_args
from rlvr.cli.main import main
from rlvr.run.rundir import new_default_run_dir


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _open_to_others(root: Path) -> list[str]:
    """Every path under `root` (itself included) with a group or other bit, and its mode."""
    paths = [root, *root.rglob("*")]
    return [f"{p} {stat.filemode(p.lstat().st_mode)}" for p in paths if p.lstat().st_mode & 0o077]


def test_the_control_an_ordinary_file_is_readable_by_all(tmp_path, umask_022):
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "plain").mkdir()
    assert _open_to_others(tmp_path / "plain.txt") and _open_to_others(tmp_path / "plain")


def test_a_training_run_writes_for_its_owner_only(tiny_model_dir, tmp_path, umask_022):
    run = tmp_path / "new" / "run"
    assert main(small_run_args(tiny_model_dir, run, steps=1)) == 0
    names = {p.relative_to(run).as_posix() for p in run.rglob("*")}
    expected = {"config.yaml", "rlvr.lock", "metrics.jsonl", "samples.jsonl", "summary.json",
                "checkpoints/step-000001/model.safetensors", "checkpoints/step-000001/trainer_state.pt",
                "checkpoints/step-000001/tokenizer.json", "checkpoints/step-000001/manifest.json"}  # fmt: skip
    assert expected <= names, expected - names
    assert any(n.startswith("tensorboard/events.out.tfevents") for n in names), names
    assert _open_to_others(tmp_path / "new") == []  # the parent it made, too


def test_an_api_run_into_an_existing_directory(tmp_path, umask_022):
    """The directory existed (0755, the user's): it keeps its mode, and what the run writes
    into it, the in-memory dataset included, is the owner's only."""
    run = tmp_path / "mine"
    run.mkdir(mode=0o755)
    rows = [{"prompt": f"Compute {a}+1. Answer in <answer></answer>.", "answer": a + 1} for a in range(8)]  # fmt: skip
    config = {"train.max_steps": 1, "rollout.prompts_per_step": 2, "rollout.group_size": 2,
              "rollout.max_new_tokens": 8, "algo.overlong_cache": 4, "train.eval_size": 2,
              "train.threads": 1}  # fmt: skip
    rlvr.train(model="rlvr-tiny", reward_funcs=["format"], train_dataset=rows, config=config,
               output_dir=run, show_progress=False)  # fmt: skip
    assert (run / "data" / "train.jsonl").is_file()
    assert stat.S_IMODE(run.stat().st_mode) == 0o755
    assert [p for p in _open_to_others(run) if not p.startswith(f"{run} ")] == []


def test_a_default_run_directory_is_made_for_its_owner(tmp_path, umask_022):
    made = new_default_run_dir(tmp_path / "runs")
    assert made.parent == tmp_path / "runs" and _open_to_others(tmp_path / "runs") == []


def test_a_reward_model_run_writes_for_its_owner_only(tiny_model_dir, tmp_path, umask_022):
    run = tmp_path / "rm"
    small = ["--rm.train_prompts=4", "--rm.eval_prompts=4", "--rm.samples_per_prompt=2",
             "--rm.batch_groups=4", "--rm.epochs=1", "--rollout.max_new_tokens=10",
             "--train.threads=1", "--no-progress"]  # fmt: skip
    assert main(["rm", f"--model.name_or_path={tiny_model_dir}", "--output-dir", str(run), *small]) == 0  # fmt: skip
    assert (run / "model" / "model.safetensors").is_file() and (
        run / "data" / "train.jsonl"
    ).is_file()
    assert _open_to_others(run) == []
