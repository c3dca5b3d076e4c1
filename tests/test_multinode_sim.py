"""scripts/multinode_sim.sh: the scale-out guide's commands across network namespaces.

Everywhere: the guide's Slurm script starts exactly the guide's own commands (no root, no
vLLM: stand-ins for srun, scontrol, python, torchrun), and a changed guide is caught. As a user
other than root, the script refuses in one line before it makes anything. As root with `ip
netns`: `--net-only` (the nodes, their links and names, a link down and up, plain processes)
leaves no namespace, /etc/netns entry or process behind. As root in the vLLM venv (`vllm`,
`slow`): the whole simulation exits 0 and leaves nothing behind.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "multinode_sim.sh"
NAMESPACES = ("trainer0", "trainer1", "infer0", "switch0")
NOBODY = 65534


def _guide_module():
    spec = importlib.util.spec_from_file_location("multinode_guide", ROOT / "scripts" / "multinode_guide.py")  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _netns_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True)
    return probe.returncode == 0


def _ours_left() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = {line.split()[0] for line in listed.splitlines() if line.strip()}
    return sorted(names & set(NAMESPACES)) + [
        f"/etc/netns/{n}" for n in NAMESPACES if Path("/etc/netns", n).exists()
    ]


as_root = pytest.mark.skipif(not _netns_usable(), reason="needs root and iproute2's ip netns")


def test_the_slurm_script_starts_the_guides_commands(tmp_path, capsys):
    guide = _guide_module()
    guide.commands(tmp_path, guide.GUIDE.read_text())
    guide.slurm(tmp_path)
    out = capsys.readouterr().out
    assert "slurm: the job's 3 commands on infer0, trainer0, trainer1 are the guide's" in out
    assert "--rdzv-endpoint trainer0:29500" in (tmp_path / "trainer.sh").read_text().replace("$HEAD", "trainer0")  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        ('"${train[0]}:29500"', '"${train[1]}:29500"', "other commands than the guide's"),
        ("--seed 0 \\\n", "--seed 1 \\\n", "other commands than the guide's"),  # server block only
        ("CONFIG.yaml --train", "CONFIG_FILE --train", "no 'CONFIG.yaml' to substitute"),
    ],
)
def test_a_changed_guide_is_caught(tmp_path, old, new, names):
    guide = _guide_module()
    text = guide.GUIDE.read_text()
    assert old in text
    changed = text.replace(old, new, 1)
    with pytest.raises(guide.GuideChanged, match=names):
        guide.commands(tmp_path, changed)
        guide.slurm(tmp_path)


def test_a_user_other_than_root_gets_one_line():
    """Run as uid 65534 where the tests run as root; as this user otherwise."""
    drop = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}
    done = subprocess.run(["bash", str(SCRIPT), "--net-only"], capture_output=True, text=True,
                          timeout=30, cwd="/", **drop)  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "multinode_sim.sh: needs root to create network namespaces (sudo bash scripts/multinode_sim.sh)"
    ]


@as_root
def test_the_network_alone_comes_and_goes():
    assert not _ours_left(), "namespaces of another run"
    done = subprocess.run(["nice", "-n", "10", "bash", str(SCRIPT), "--net-only"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "trainer0 and trainer1 reach infer0:8000 by name; beyond 10.213.0.0/24: Network is unreachable" in done.stdout  # fmt: skip
    assert "infer0's link down: trainer0 -> infer0:8000: timed out" in done.stdout
    assert not _ours_left()


@as_root
def test_a_name_taken_is_refused_and_left_alone():
    subprocess.run(["ip", "netns", "add", "infer0"], check=True)
    try:
        done = subprocess.run(["bash", str(SCRIPT), "--net-only"], capture_output=True, text=True,
                              timeout=30)  # fmt: skip
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            "multinode_sim.sh: a network namespace infer0 exists already, not this script's "
            "(ip netns del infer0)"
        ]
        assert "infer0" in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "del", "infer0"], check=True)


@pytest.mark.vllm
@pytest.mark.slow
@as_root
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm: scripts/vllm_env.sh")  # fmt: skip
def test_the_guides_commands_run_across_namespaces():
    """The whole simulation in this venv (sys.prefix): about 5 minutes on the 2-core machine."""
    done = subprocess.run(["bash", str(SCRIPT), sys.prefix], capture_output=True, text=True,
                          timeout=3000)  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])
    assert "multinode_sim: ok" in done.stdout
    assert not _ours_left()
