"""Checkpoint integrity on real files: malformed manifests are refused by name with a fallback,
the keep policy never deletes a checkpoint it did not supersede, a full disk (a real tmpfs)
fails a save cleanly."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvr.run.checkpoint import (
    CheckpointError,
    list_checkpoints,
    resume_checkpoint,
    save_checkpoint,
    scan_checkpoints,
    verify_checkpoint,
)


def _save(run, step, model, tokenizer, keep=10, **kw):
    return save_checkpoint(run, step, model, tokenizer, {"x": torch.zeros(3)}, keep=keep, **kw)


@pytest.fixture()
def two_checkpoints(tmp_path, tiny_model, tokenizer):
    run = tmp_path / "run"
    _save(run, 1, tiny_model, tokenizer)
    _save(run, 2, tiny_model, tokenizer)
    return run


def _manifest(run, step):
    return run / "checkpoints" / f"step-{step:06d}" / "manifest.json"


def _good_entry(run):
    files = json.loads(_manifest(run, 2).read_text())["files"]
    return files["trainer_state.pt"]


MALFORMED = {
    "binary_garbage": (lambda run: b"\x00\xff\xfe\x89PNG\x1a" * 40, "not UTF-8"),
    "not_json": (lambda run: b'{"files": {"a": ', "not valid JSON"),
    "files_list": (lambda run: b'{"step": 2, "files": []}', '"files" mapping'),
    "files_empty": (lambda run: b'{"step": 2, "files": {}}', '"files" mapping'),
    "top_level_list": (lambda run: b"[1, 2]", '"files" mapping'),
    "size_string": (
        lambda run: json.dumps(
            {"step": 2, "files": {"trainer_state.pt": {**_good_entry(run), "size": "12"}}}
        ).encode(),
        "entry 'trainer_state.pt' is not",
    ),
    "missing_sha": (
        lambda run: json.dumps(
            {"step": 2, "files": {"trainer_state.pt": {"size": _good_entry(run)["size"]}}}
        ).encode(),
        "entry 'trainer_state.pt' is not",
    ),
    "escaping_path": (
        lambda run: json.dumps(
            {
                "step": 2,
                "files": {"trainer_state.pt": _good_entry(run), "../x": _good_entry(run)},
            }
        ).encode(),
        "'../x', outside the checkpoint directory",
    ),
    "absolute_path": (
        lambda run: json.dumps(
            {"step": 2, "files": {"trainer_state.pt": _good_entry(run), "/etc/passwd": {}}}
        ).encode(),
        "'/etc/passwd', outside the checkpoint directory",
    ),
    "no_trainer_state": (
        lambda run: json.dumps(
            {"step": 2, "files": {"config.json": _good_entry(run)}}  # any listed file
        ).encode(),
        "does not list trainer_state.pt",
    ),
    "wrong_step": (
        lambda run: json.dumps(
            {"step": 7, "files": {"trainer_state.pt": _good_entry(run)}}
        ).encode(),
        "says step 7, the directory is step-000002",
    ),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_manifest_is_refused_by_name_with_fallback(two_checkpoints, kind):
    run = two_checkpoints
    make, reason = MALFORMED[kind]
    _manifest(run, 2).write_bytes(make(run))
    with pytest.raises(CheckpointError, match="step-000002") as e:
        verify_checkpoint(run / "checkpoints" / "step-000002")
    assert reason in str(e.value)
    warned = []
    found, refused = scan_checkpoints(run, warn=warned.append)
    assert found == run / "checkpoints" / "step-000001"
    assert len(refused) == 1 and reason in refused[0] and "step-000002" in warned[0]


def test_symlink_out_of_the_checkpoint_is_refused(two_checkpoints, tmp_path):
    run = two_checkpoints
    ckpt = run / "checkpoints" / "step-000002"
    outside = tmp_path / "outside.pt"
    shutil.copy(ckpt / "trainer_state.pt", outside)
    (ckpt / "trainer_state.pt").unlink()
    (ckpt / "trainer_state.pt").symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        verify_checkpoint(ckpt)


def test_all_checkpoints_corrupt_refuses_to_resume_and_changes_nothing(two_checkpoints):
    run = two_checkpoints
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    _manifest(run, 2).write_bytes(b'{"files": {}}')
    weights = run / "checkpoints" / "step-000001" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError) as e:
        resume_checkpoint(run, save_every=1, warn=lambda _: None)
    message = str(e.value)
    assert "\n" not in message and str(run) in message
    assert "step-000002: manifest.json has no" in message
    assert "step-000001: file model.safetensors has 50 bytes" in message
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_resume_starts_over_only_when_no_checkpoint_can_exist_yet(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert resume_checkpoint(run, save_every=5, warn=print) is None  # nothing logged yet
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(1, 6)))
    assert resume_checkpoint(run, save_every=5, warn=print) is None  # killed saving step 5
    assert resume_checkpoint(run, save_every=0, warn=print) is None  # saves only at the end
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(1, 7)))
    with pytest.raises(CheckpointError, match="reaches step 6 but checkpoints/ holds no"):
        resume_checkpoint(run, save_every=5, warn=print)


def test_keep_policy_never_deletes_what_it_did_not_supersede(tmp_path, tiny_model, tokenizer):
    """Corrupt checkpoints numbered above the ones being written stay, reported; the new good
    ones are kept (keep=2) and only the older good one is deleted."""
    run = tmp_path / "run"
    for step in (5, 6):
        _save(run, step, tiny_model, tokenizer)
    for step in (5, 6):
        _manifest(run, step).write_bytes(b"\xff\x00garbage")
    warned = []
    for step in (1, 2, 3):
        _save(run, step, tiny_model, tokenizer, keep=2, warn=warned.append)
    assert [p.name for p in list_checkpoints(run)] == [
        "step-000002",
        "step-000003",
        "step-000005",
        "step-000006",
    ]
    assert len(warned) == 2 and all("keeping corrupt checkpoint" in w for w in warned)
    assert "step-000005" in warned[1] and "not UTF-8" in warned[1]


def test_stale_staging_is_ignored_and_removed(two_checkpoints, tiny_model, tokenizer):
    run = two_checkpoints
    stale = run / "checkpoints" / ".tmp-step-000003"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    assert [p.name for p in list_checkpoints(run)] == ["step-000001", "step-000002"]
    _save(run, 3, tiny_model, tokenizer)
    assert not list((run / "checkpoints").glob(".tmp-*"))
    verify_checkpoint(run / "checkpoints" / "step-000003")


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if res.returncode:
        pytest.skip(f"mount -t tmpfs is not permitted here: {res.stderr.strip()}")


@pytest.fixture()
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    yield mnt, _mount_tmpfs
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_disk_full_during_a_save_says_so_and_cleans_up(small_disk, tiny_model, tokenizer):
    mnt, mount = small_disk
    probe = mnt.parent / "probe"
    _save(probe, 1, tiny_model, tokenizer)
    one = sum(p.stat().st_size for p in probe.rglob("*") if p.is_file())
    mount(mnt, f"{int(one * 1.5) // 4096 * 4096}")  # room for one checkpoint, not two
    run = mnt / "run"
    _save(run, 1, tiny_model, tokenizer, keep=1)
    with pytest.raises(CheckpointError) as e:
        _save(run, 2, tiny_model, tokenizer, keep=1)
    message = str(e.value)
    assert message.startswith("checkpoint step 2: no space left on device at ")
    assert str(run / "checkpoints") in message and "need ~" in message, message
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000001"]
    verify_checkpoint(run / "checkpoints" / "step-000001")
    assert resume_checkpoint(run, save_every=1, warn=print) == run / "checkpoints" / "step-000001"


def test_save_in_a_subprocess_past_its_file_size_limit_fails_cleanly(tmp_path):
    """RLIMIT_FSIZE (no mount needed): the write fails with EFBIG, the staging directory goes."""
    code = f"""
import resource, signal, sys, torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from conftest import *  # noqa
from rlvr.models import build_tiny_model, build_tokenizer
from rlvr.run.checkpoint import save_checkpoint, CheckpointError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
tok = build_tokenizer()
model = build_tiny_model(tok, seed=0, hidden_size=32, num_layers=2, num_heads=2,
    num_kv_heads=1, intermediate_size=64, max_position_embeddings=128)
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
try:
    save_checkpoint(__import__("pathlib").Path({str(tmp_path / "run")!r}), 1, model, tok,
                    {{}}, keep=2)
except CheckpointError as e:
    print("ERR", e)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ERR checkpoint step 1: writing" in res.stdout, res.stdout + res.stderr
    assert not list((tmp_path / "run" / "checkpoints").iterdir())


def test_resaving_a_corrupt_step_replaces_it_and_says_so(two_checkpoints, tiny_model, tokenizer):
    run = two_checkpoints
    weights = run / "checkpoints" / "step-000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:10])
    warned = []
    _save(run, 2, tiny_model, tokenizer, warn=warned.append)
    assert len(warned) == 1 and "replacing corrupt checkpoint" in warned[0]
    assert "step-000002 (file model.safetensors has 10 bytes" in warned[0]
    verify_checkpoint(run / "checkpoints" / "step-000002")
