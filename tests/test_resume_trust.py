"""A resumed run's math comes from the record its checkpoint holds of the config it was
trained with, not from config.yaml alone; and a run directory's config imports code (rewards,
tools by "module:function" or "file.py:function") only when the user names it again or
passes --trust-run-code. The real `rlvr train --resume` / `rlvr eval` commands, in process."""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rlvr.cli.main import main
from rlvr.run.manifest import verify_checkpoint, write_manifest

REWARD = f"{Path(__file__).parent / 'e2e_rewards.py'}:digit_share"


@dataclass
class Result:
    returncode: int
    stderr: str


@pytest.fixture()
def _cli(capsys):
    def run(*args) -> Result:
        capsys.readouterr()
        rc = main([*map(str, args), *(["--no-progress"] if args[0] == "train" else [])])
        return Result(rc, capsys.readouterr().err)

    return run


def _copy(small_run, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    return run


def _one_error(res) -> str:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    return errors[0]


def _steps(run) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_hand_edited_config_is_refused_by_key(small_run, tmp_path, _cli):
    run = _copy(small_run, tmp_path)
    cfg = run / "config.yaml"
    assert "  clip_high: 0.2\n" in cfg.read_text()
    cfg.write_text(cfg.read_text().replace("  clip_high: 0.2\n", "  clip_high: 5.0\n"))
    error = _one_error(_cli("train", "--resume", run, "--trust-run-code", "--max-steps", 3))
    assert "config.yaml differs from what step-000002 was trained with in algo.clip_high" in error
    assert "(0.2 -> 5.0)" in error
    assert _steps(run) == [1, 2]


def test_an_emptied_config_is_refused(small_run, tmp_path, _cli):
    run = _copy(small_run, tmp_path)
    (run / "config.yaml").write_text("")
    error = _one_error(_cli("train", "--resume", run, "--max-steps", 3))
    assert "config.yaml differs from what step-000002 was trained with in preset" in error
    assert len(error) < 1200  # at most 8 keys named, each value cut to 60 characters


def test_a_checkpoint_without_its_config_record_is_refused(small_run, tmp_path, _cli):
    run = _copy(small_run, tmp_path)
    ckpt = run / "checkpoints" / "step-000002"
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    del state["config"]
    torch.save(state, ckpt / "trainer_state.pt")
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt, 2)
    verify_checkpoint(ckpt)
    error = _one_error(_cli("train", "--resume", run, "--trust-run-code", "--max-steps", 3))
    assert "step-000002 holds no record of the config it was trained with" in error


def test_run_code_is_imported_only_when_named_or_trusted(small_run, tmp_path, _cli):
    """config.yaml pointed at a file whose import would create a marker: refused naming it,
    never imported. The run's own reward named again, or --trust-run-code: it resumes and
    says which code it imports."""
    run = _copy(small_run, tmp_path)
    marker = tmp_path / "imported"
    planted = tmp_path / "planted.py"
    planted.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef digit_share(c, **k):\n    return [0.0] * len(c)\n")  # fmt: skip
    cfg = run / "config.yaml"
    original = cfg.read_text()
    assert REWARD in original
    cfg.write_text(original.replace(REWARD, f"{planted}:digit_share"))
    error = _one_error(_cli("train", "--resume", run, "--max-steps", 3))
    assert f"its config.yaml names code to import: {planted}:digit_share" in error
    assert "--trust-run-code" in error
    error = _one_error(_cli("train", "--resume", run, f"--reward.extra={REWARD}=1.0"))
    assert "reward.extra is ('" in error and "on the command line but ('" in error
    error = _one_error(_cli("eval", "--model", run, "--k", 1, "--num-prompts", 2))
    assert f"--model {run}: its config.yaml names code to import: {planted}" in error
    assert not marker.exists()
    cfg.write_text(original)
    error = _one_error(_cli("train", "--resume", run, f"--reward.extra={REWARD}=2.0"))
    assert (
        "a run's rewards, tools and objective cannot change on resume" in error
    )  # not silently dropped
    res = _cli("train", "--resume", run, f"--reward.extra={REWARD}=1.0", "--max-steps", 3)
    assert res.returncode == 0, res.stderr
    assert f"importing {REWARD} (named on the command line)" in res.stderr
    res = _cli("train", "--resume", run, "--trust-run-code", "--max-steps", 4)
    assert res.returncode == 0, res.stderr
    assert f"(--trust-run-code): {REWARD}" in res.stderr
    assert _steps(run) == [1, 2, 3, 4]
