"""The run directory: locked against a second process, uniquely named, and its metrics file
trimmed safely on resume. Real files and real processes."""

import re
import subprocess
import sys
import time

import pytest

from rlvr.config.load import load_config
from rlvr.config.schema import ConfigError
from rlvr.run.rundir import (
    lock_run_dir,
    new_default_run_dir,
    prepare_run_dir,
    truncate_jsonl,
    unlock_run_dir,
)

HOLD = """
import sys, time
from pathlib import Path
from rlvr.run.rundir import lock_run_dir
lock_run_dir(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture()
def held(tmp_path):
    """A run directory locked by another live process."""
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    yield run, proc
    proc.kill()
    proc.wait()


def test_a_second_process_is_refused_naming_the_holder(held):
    run, proc = held
    with pytest.raises(
        ConfigError, match=re.escape(f"{run} is in use by another rlvr run (pid {proc.pid})")
    ):
        lock_run_dir(run)
    cfg = load_config(None, {"train": {"output_dir": str(run)}})
    with pytest.raises(ConfigError, match=f"pid {proc.pid}"):
        prepare_run_dir(cfg, resume=True)
    assert not (run / "config.yaml").exists()  # refused before writing anything


def test_the_lock_dies_with_its_holder(held):
    run, proc = held
    proc.kill()  # SIGKILL: no cleanup runs, the kernel drops the flock
    proc.wait()
    lock_run_dir(run)
    unlock_run_dir(run)


def test_default_run_dirs_are_unique_within_one_second(tmp_path):
    start = time.time()
    made = [new_default_run_dir(tmp_path / "runs") for _ in range(5)]
    assert time.time() - start < 1 or len({p.name[:15] for p in made}) > 1
    assert len(set(made)) == 5 and all(p.is_dir() for p in made)


def test_default_run_dirs_are_unique_across_processes(tmp_path):
    code = (
        "from pathlib import Path; from rlvr.run.rundir import new_default_run_dir; "
        f"print(new_default_run_dir(Path({str(tmp_path / 'runs')!r})))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    names = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert len(set(names)) == 4, names


def test_partial_last_metrics_line_is_dropped_with_a_note(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a"')
    notes = []
    truncate_jsonl(path, 2, warn=notes.append)
    assert path.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'
    assert len(notes) == 1 and "metrics.jsonl:3: dropping an incomplete last line" in notes[0]


def test_damage_in_the_middle_of_metrics_is_an_error_by_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    original = b'{"step": 1}\n\xff\xfe garbage\n{"step": 2}\n'
    path.write_bytes(original)
    with pytest.raises(ConfigError, match=r"metrics\.jsonl:2: not a JSON object"):
        truncate_jsonl(path, 2)
    assert path.read_bytes() == original


def test_opening_a_run_removes_staging_left_by_a_crash(tmp_path, capfd):
    run = tmp_path / "run"
    stale = run / "checkpoints" / ".tmp-step-000004"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"\0" * 1000)  # what a full disk left behind
    good = run / "checkpoints" / "step-000003"
    good.mkdir()
    cfg = load_config(None, {"train": {"output_dir": str(run)}})
    try:
        prepare_run_dir(cfg, resume=True)
    finally:
        unlock_run_dir(run)
    assert not stale.exists() and good.is_dir()
    assert "removed .tmp-step-000004, left by a save that did not finish" in capfd.readouterr().err


def test_a_new_run_on_a_live_directory_is_refused_before_anything_is_built(held):
    from rlvr.run.rundir import check_run_dir

    run, proc = held
    (run / "metrics.jsonl").write_text("")
    lock = (run / "rlvr.lock").read_text()
    with pytest.raises(
        ConfigError, match=re.escape(f"in use by another rlvr run (pid {proc.pid})")
    ):
        check_run_dir(run)
    assert (run / "rlvr.lock").read_text() == lock  # the holder's pid, untouched
