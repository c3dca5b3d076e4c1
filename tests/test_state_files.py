"""A trainer state cannot run code: `load_trainer_state` reads tensors and plain values only,
so a `trainer_state.pt` planted in a run directory someone hands you (its manifest rewritten
to match, as whoever wrote the file can) is refused by name instead of executed on --resume."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rlvr.cli.main import main
from rlvr.run.checkpoint import CheckpointError, load_trainer_state, save_checkpoint
from rlvr.run.manifest import verify_checkpoint, write_manifest


def rewrite_manifest(ckpt: Path, step: int) -> None:
    """What whoever changed a checkpoint's files can do: a manifest that matches them."""
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt, step)
    verify_checkpoint(ckpt)


class Plant:
    """Unpickling this object opens (creates) `path`: what a crafted `__reduce__` does."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _planted(run: Path, step: int, model, tokenizer, marker: Path) -> Path:
    state = {"optimizer": {}, "scheduler": {}, "eval_before": {}, "payload": Plant(marker)}
    return save_checkpoint(run, step, model, tokenizer, state, keep=5)


def test_a_planted_object_is_refused_and_never_runs(tmp_path, tiny_model, tokenizer):
    marker = tmp_path / "ran"
    ckpt = _planted(tmp_path / "run", 1, tiny_model, tokenizer, marker)
    verify_checkpoint(ckpt)  # the manifest matches: it does not stop this
    with pytest.raises(CheckpointError, match=r"refused: it holds an object of io\.open"):
        load_trainer_state(ckpt)
    assert not marker.exists()
    # control: the unrestricted unpickler runs the planted call
    torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert marker.exists()


def test_the_states_a_run_writes_load(tmp_path, tiny_model, tokenizer):
    """A real optimiser's state, the RNG states (numpy's as a tensor), nested plain values;
    and a state that stored numpy's key as an ndarray still loads."""
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3)
    tiny_model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    state = {"optimizer": opt.state_dict(), "eval_before": {"accuracy": 0.5}, "n": (1, [2.0])}
    ckpt = save_checkpoint(tmp_path / "run", 3, tiny_model, tokenizer, state, keep=5)
    got = load_trainer_state(ckpt, required=("step", "optimizer", "rng"))
    assert got["step"] == 3 and got["n"] == (1, [2.0])
    assert isinstance(got["rng"]["numpy"][1], torch.Tensor)
    old = {**got, "rng": {**got["rng"], "numpy": np.random.get_state()}}
    torch.save(old, ckpt / "trainer_state.pt")
    rewrite_manifest(ckpt, 3)
    assert isinstance(load_trainer_state(ckpt)["rng"]["numpy"][1], np.ndarray)


def test_a_state_without_its_optimizer_is_named(tmp_path, tiny_model, tokenizer):
    ckpt = save_checkpoint(tmp_path / "run", 1, tiny_model, tokenizer, {"x": 1}, keep=5)
    with pytest.raises(
        CheckpointError, match=r"trainer_state\.pt: the trainer state has no 'optimizer'"
    ):
        load_trainer_state(ckpt, required=("step", "optimizer"))
    (ckpt / "trainer_state.pt").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match="unreadable trainer state"):
        load_trainer_state(ckpt)


def test_resume_of_a_planted_run_is_one_line_and_runs_nothing(small_run, tmp_path, capsys):
    """`rlvr train --resume` (in process) of a run directory whose newest state was replaced (manifest
    rewritten): exit 2, one error line, the planted call never made."""
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    marker = tmp_path / "ran"
    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)  # the run's own file
    torch.save({**state, "payload": Plant(marker)}, ckpt / "trainer_state.pt")
    rewrite_manifest(ckpt, state["step"])
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--trust-run-code", "--no-progress"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "refused: it holds an object of io.open" in errors[0], err
    assert not marker.exists()
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
