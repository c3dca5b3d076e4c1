"""Non-finite state is refused before it is trained on or saved: NaN moments in a resumed
optimiser state stop the resume by name, and weights or state holding NaN/inf are never
written as a checkpoint, so the keep policy never deletes the last finite checkpoint for a
broken newer one."""

import json
import shutil

import pytest
import torch

from rlvr.cli.main import main
from rlvr.run.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_trainer_state,
    save_checkpoint,
)
from rlvr.run.manifest import verify_checkpoint, write_manifest


def _names(run):
    return [p.name for p in list_checkpoints(run)]


def test_nan_weights_are_never_saved_and_the_finite_checkpoint_stays(
    tmp_path, tiny_model, tokenizer
):
    run = tmp_path / "run"
    save_checkpoint(run, 1, tiny_model, tokenizer, {"x": torch.zeros(2)}, keep=1)
    name, weight = next(iter(tiny_model.named_parameters()))
    with torch.no_grad():
        weight[0, 0] = float("nan")
    with pytest.raises(
        CheckpointError, match=rf"checkpoint step 2: weights\.{name} holds NaN/inf; not saved"
    ):
        save_checkpoint(run, 2, tiny_model, tokenizer, {"x": torch.zeros(2)}, keep=1)
    assert _names(run) == ["step-000001"]  # keep=1: a saved step 2 would have deleted it
    assert not list((run / "checkpoints").glob(".tmp-*"))
    verify_checkpoint(run / "checkpoints" / "step-000001")


def test_inf_in_a_trainer_state_is_never_saved(tmp_path, tiny_model, tokenizer):
    state = {"optimizer": {"state": {0: {"exp_avg_sq": torch.tensor([1.0, float("inf")])}}}}
    with pytest.raises(
        CheckpointError, match=r"trainer state\.optimizer\.state\.0\.exp_avg_sq holds"
    ):
        save_checkpoint(tmp_path / "run", 1, tiny_model, tokenizer, state, keep=2)
    assert _names(tmp_path / "run") == []


def test_nan_moments_in_a_resumed_state_are_refused(small_run, tmp_path, capsys):
    """The newest checkpoint's Adam moments set to NaN (manifest rewritten to match): the
    resume stops with one line naming the tensor, before any step; nothing on disk changes."""
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    ckpt = run / "checkpoints" / "step-000002"
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    first = next(iter(state["optimizer"]["state"]))
    state["optimizer"]["state"][first]["exp_avg"].fill_(float("nan"))
    torch.save(state, ckpt / "trainer_state.pt")
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt, 2)
    metrics = (run / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError, match=rf"optimizer\.state\.{first}\.exp_avg holds NaN/inf"):
        load_trainer_state(ckpt)
    capsys.readouterr()
    assert (
        main(
            ["train", "--resume", str(run), "--trust-run-code", "--max-steps", "4", "--no-progress"]
        )
        == 2
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "refusing to train on it (move step-000002 aside" in err[0]
    assert _names(run) == ["step-000001", "step-000002"]
    assert (run / "metrics.jsonl").read_text() == metrics
    assert [json.loads(x)["step"] for x in metrics.splitlines()] == [1, 2]
