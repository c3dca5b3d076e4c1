"""bench/soak.py's machinery on a stand-in trainer (a few seconds, no model): the samples see
its child, descriptors and /dev/shm file, the steps it logs, and what it leaves behind; the
verdicts catch a growing count or memory and ignore the wrap-up after the last step."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import soak  # noqa: E402

# logs steps 1..5 while a child sleeps and a /dev/shm file is mapped; leaves a temp dir, and
# with "orphan" a process of its session that outlives it
TRAINER = textwrap.dedent("""
    import json, mmap, os, subprocess, sys, tempfile, time
    run, shm, orphan = sys.argv[1], sys.argv[2], sys.argv[3] == "orphan"
    os.makedirs(run)
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fd = os.open(shm, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    view = mmap.mmap(fd, 4096)
    tempfile.mkdtemp(prefix="left-")
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        for step in range(1, 6):
            time.sleep(0.3)
            f.write(json.dumps({"step": step}) + "\\n")
            f.flush()
    os.unlink(shm)
    if not orphan:
        kid.kill()
        kid.wait()
""")


def _args(tmp_path: Path, **kw) -> argparse.Namespace:
    a = soak._args(["--work", str(tmp_path), "--interval", "0.1"])
    return argparse.Namespace(**{**vars(a), **kw})


def _run(tmp_path: Path, mode: str) -> dict:
    (tmp_path / "trainer.py").write_text(TRAINER)
    shm = f"/dev/shm/rlvr-soak-test-{os.getpid()}"
    cmd = [sys.executable, str(tmp_path / "trainer.py"), str(tmp_path / "run"), shm, mode]
    return soak.run_one("fake", cmd, tmp_path / "run", _args(tmp_path))


def test_samples_see_the_tree_and_the_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(soak, "SETTLE_S", 0.5)
    result = _run(tmp_path, "clean")
    assert result["exit_code"] == 0
    samples = result["samples"]
    assert max(s["step"] for s in samples) >= 4
    assert max(s["children"] for s in samples) == 1
    assert max(s["shm_files"] for s in samples) == 1
    assert all(s["fds"] >= 3 and s["threads"] >= 1 and s["rss_mib"] > 0 for s in samples)
    left = result["left"]
    assert left["processes"] == [] and left["shm_files"] == [] and left["cgroups"] == []
    assert [n[:5] for n in left["temp"]] == ["left-"]  # its own TMPDIR
    assert (tmp_path / "fake.samples.jsonl").read_text().count("\n") == len(samples)


def test_a_process_that_outlives_the_trainer_is_left_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(soak, "SETTLE_S", 0.5)
    left = _run(tmp_path, "orphan")["left"]
    try:
        assert len(left["processes"]) == 1
    finally:
        for pid in left["processes"]:
            os.kill(pid, signal.SIGKILL)


def _series(n: int, **grow) -> list[dict]:
    """A sample a step, flat but for the keys in `grow` (added per step)."""
    base = dict(rss_mib=500.0, trainer_rss_mib=400.0, fds=6, threads=7, children=1,
                shm_files=0, cgroups=0)  # fmt: skip
    return [{"step": i, **{k: v + grow.get(k, 0) * i for k, v in base.items()}}
            for i in range(n + 1)]  # fmt: skip


@pytest.mark.parametrize(
    "grow,failing",
    [({}, set()), ({"fds": 0.05}, {"fds"}), ({"rss_mib": 1.0}, {"rss_mib"})],
)
def test_verdicts_catch_growth(tmp_path, grow, failing):
    rows = soak.verdicts(_series(100, **grow), 100, _args(tmp_path))
    assert {r["resource"] for r in rows if r["ok"] is False} == failing
    assert all(r["ok"] is not None for r in rows)


def test_the_wrap_up_after_the_last_step_is_not_judged(tmp_path):
    samples = _series(100)
    samples.append({**samples[-1], "fds": 7})  # the final evaluation's file
    rows = {r["resource"]: r for r in soak.verdicts(samples, 100, _args(tmp_path))}
    assert rows["fds"]["ok"] and rows["fds"]["max"] == 7


def test_steps_reads_only_whole_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    steps = soak.Steps(path)
    assert steps.read() == 0
    path.write_text('{"step": 1}\n{"step": 2}\n{"st')
    assert steps.read() == 2
    with open(path, "a") as f:
        f.write('ep": 3}\n')
    assert steps.read() == 3


@pytest.mark.parametrize("grow,code", [({}, 0), ({"threads": 0.05}, 1)])
def test_report_only_judges_the_samples_again(tmp_path, grow, code):
    left = dict(processes=[], shm_files=[], shm_others=[], cgroups=[], temp=[], temp_caches=[])
    run = dict(name="grpo", command=[], steps=100, exit_code=0, wall_s=1.0, left=left,
               samples=_series(100, **grow))  # fmt: skip
    out, results = tmp_path / "soak.json", tmp_path / "results.json"
    out.write_text(json.dumps({"machine": "m", "argv": [], "runs": [run]}))
    argv = ["--report-only", "--work", str(tmp_path), "--out", str(out), "--results", str(results)]
    assert soak.main(argv) == code
    (brief,) = json.loads(results.read_text())["runs"]
    assert brief["samples"] == 101 and len(brief["trace"]) <= 60
    assert [r["ok"] for r in brief["verdicts"] if r["resource"] == "threads"] == [code == 0]
