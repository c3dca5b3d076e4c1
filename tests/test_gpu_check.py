"""scripts/gpu_check.sh: valid bash, every check runs whatever the others did, one result line
each; its Python entry (scripts/gpu_check.py) on the CPU for the hf and fast engines."""

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _entry():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_a_failing_check_does_not_stop_the_others(tmp_path):
    """An interpreter standing in for python: `engine hf` dies without a result line, every
    other check prints its line. All checks still run; the exit status counts the failure."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = "-" ]; then cat > /dev/null; echo "env: fake"; exit 0; fi\n'
        'if [ "$1" = "-m" ]; then echo "1 passed"; exit 0; fi\n'
        'if [ "$2 $3" = "engine hf" ]; then echo "Traceback: boom" >&2; exit 3; fi\n'
        'echo "RESULT $3: PASS stand-in"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PYTHON": str(fake)}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--steps", "1"], capture_output=True, text=True, env=env, timeout=60
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert lines[0] == "env: fake"
    assert lines[1].startswith("hf: FAIL exit 3 without a result")
    for name in ("fast", "vllm", "vllm", "fp32", "bf16", "lora", "nccl2", "vllm"):
        assert any(line.startswith(f"{name}: PASS") for line in lines), name
    assert any(line.startswith("pytest: PASS") for line in lines)
    assert lines[-1].startswith("failed checks: 1")


def test_engine_check_on_the_cpu():
    entry = _entry()
    ok, text = entry.check_engine("fast", "cpu", quick=True)
    assert ok, text
    assert "max |logp - trainer's|" in text
    ok, text = entry.check_engine("vllm", "cpu", quick=True)
    if importlib.util.find_spec("vllm") is None:
        assert (ok, text) == (True, "not installed")


def test_entry_prints_vllm_not_installed(capsys):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    assert _entry().main(["engine", "vllm", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip() == "RESULT vllm: not installed"


@pytest.mark.slow
def test_cpu_dry_run(tmp_path):
    """The real script on the CPU: hf and fast through the same entry (about 65 s here)."""
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--cpu-dry-run"], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "\nhf: PASS" in out and "\nfast: PASS max |logp - trainer's|" in out
