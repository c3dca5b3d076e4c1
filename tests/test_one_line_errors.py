"""Inputs that once raised a traceback, or were accepted silently, each end in one named line:
damaged data files, a bad prompt template, an absurd learning rate, a damaged run directory
(random bytes as config.yaml, a trainer state without its optimizer, a duplicated step in
metrics.jsonl), a read-only output directory, and a disk that fills under TensorBoard."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from rlvr.cli.main import main
from rlvr.cli.plot import PlotError, load_run
from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.data.dataset import load_prompt_dataset
from rlvr.data.errors import DatasetError
from rlvr.run.manifest import write_manifest
from rlvr.run.metrics import RunLogger
from rlvr.run.rundir import truncate_jsonl


def _one_line(capsys, argv, rc=2) -> str:
    capsys.readouterr()
    assert main(argv) == rc
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


DATA = {
    "deep.jsonl": ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + ', "answer": "1"}\n', "deep.jsonl:1: JSON nested too deeply"),
    "nan.jsonl": ('{"prompt": "q", "answer": "1"}\n{"prompt": "q", "answer": NaN}\n', "nan.jsonl:2: NaN is not a JSON value"),
    "inf.json": ('[{"prompt": "q", "answer": Infinity}]', "inf.json:1: Infinity is not a JSON value"),
    "garbage.parquet": (bytes(range(256)) * 8, "garbage.parquet: not a readable parquet file"),
    "dir.jsonl": (None, "dir.jsonl: is a directory, not a .jsonl file"),
    "empty_dir": (None, "empty_dir: cannot be read as a dataset"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DATA))
def test_a_damaged_data_file_is_one_line(tmp_path, name):
    content, expected = DATA[name]
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    with pytest.raises(DatasetError) as e:
        load_prompt_dataset(path)
    assert expected in str(e.value) and len(str(e.value)) < 400


def test_a_damaged_data_file_through_the_cli(tmp_path, capsys):
    path = tmp_path / "nan.jsonl"
    path.write_text(DATA["nan.jsonl"][0])
    error = _one_line(capsys, ["train", f"--data.path={path}", "--output-dir", str(tmp_path / "r"), "--no-progress"])  # fmt: skip
    assert "nan.jsonl:2: NaN is not a JSON value" in error


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"data": {"prompt_template": "Solve: {q}"}}, "data.prompt_template: got 'Solve: {q}'"),
        ({"optim": {"lr": "1e30"}}, "optim.lr: got 1e+30, expected <= 1.0"),
        ({"critic": {"lr": "2"}}, "critic.lr: got 2.0, expected <= 1.0"),
    ],
)
def test_config_values_that_were_accepted_are_refused(changes, expected):
    with pytest.raises(ConfigError) as e:
        load_config(None, changes)
    assert expected in str(e.value)


def _copy(small_run, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    return run


def test_random_bytes_as_a_runs_config(small_run, tmp_path, capsys):
    run = _copy(small_run, tmp_path)
    (run / "config.yaml").write_bytes(bytes(range(255, 127, -1)) * 4)
    error = _one_line(capsys, ["train", "--resume", str(run), "--no-progress"])
    assert "config.yaml: not UTF-8 text (byte 0" in error


def test_a_trainer_state_without_its_optimizer(small_run, tmp_path, capsys):
    run = _copy(small_run, tmp_path)
    ckpt = run / "checkpoints" / "step-000002"
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    del state["optimizer"]
    torch.save(state, ckpt / "trainer_state.pt")
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt, 2)
    error = _one_line(capsys, ["train", "--resume", str(run), "--trust-run-code", "--no-progress"])
    assert "trainer_state.pt: the trainer state has no 'optimizer'" in error


def test_a_duplicated_step_in_metrics(small_run, tmp_path, capsys):
    run = _copy(small_run, tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text(lines[0] + lines[0] + lines[1])
    with pytest.raises(ConfigError, match=r"metrics\.jsonl:2: step 1 after step 1 on line 1"):
        truncate_jsonl(run / "metrics.jsonl", 2, one_per_step=True)
    truncate_jsonl(run / "samples.jsonl", 2)  # many lines a step there: accepted
    with pytest.raises(PlotError, match="line 2: step 1 after step 1"):
        load_run(run)
    error = _one_line(capsys, ["train", "--resume", str(run), "--trust-run-code", "--no-progress"])
    assert "metrics.jsonl:2: step 1 after step 1 on line 1" in error


def _tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)  # fmt: skip
    if res.returncode:
        pytest.skip(f"mount -t tmpfs is not permitted here: {res.stderr.strip()}")


@pytest.fixture()
def mount_point(tmp_path):
    mnt = tmp_path / "mnt"
    yield mnt
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_read_only_output_directory(mount_point, capsys):
    """Read-only even for root (a read-only mount)."""
    _tmpfs(mount_point, "ro,size=1m")
    error = _one_line(capsys, ["train", "--output-dir", str(mount_point / "run"), "--max-steps", "1", "--no-progress"])  # fmt: skip
    assert f"{mount_point / 'run'}: Read-only file system" in error


def test_a_disk_filled_under_tensorboard(mount_point, capfd):
    """Another process fills the disk mid-run: TensorBoard stops with one warning (no
    traceback from its writer thread), and the next metrics.jsonl write raises an OSError
    naming the file, which the CLI prints as one line."""
    _tmpfs(mount_point, "size=64k")
    logger = RunLogger(mount_point, total_steps=10, show_progress=False)
    logger.log(1, {"loss": 1.0})
    with open(mount_point / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
        while True:
            f.write(b"x" * 4096)
    with pytest.raises(OSError) as e:
        for step in range(2, 200):
            logger.log(step, {"loss": 1.0, "a": 2.0})
    assert e.value.filename == str(mount_point / "metrics.jsonl")
    (mount_point / "filler").unlink()  # the other process frees the space again
    logger.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err
    assert err.count("warning: TensorBoard logging stopped") == 1
