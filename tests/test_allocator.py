"""`rlvr.cpu.allocator`: glibc's malloc keeps freed memory when training starts, unless told not to.
Each case runs in a fresh interpreter: the settings are process-wide and applied once."""

import ctypes.util
import os
import subprocess
import sys

import pytest

CODE = "from rlvr.cpu.allocator import keep_freed_memory; print(keep_freed_memory())"


def _status(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "RLVR_MALLOC"))}
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, env={**clean, **env}
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


@pytest.mark.skipif(
    sys.platform != "linux" or "libc.so" not in (ctypes.util.find_library("c") or ""),
    reason="glibc only",
)
def test_on_by_default_with_glibc():
    assert _status() == "on"


def test_off_when_asked_or_when_the_user_tuned_malloc():
    assert _status(RLVR_MALLOC="0") == "off: RLVR_MALLOC=0"
    assert _status(MALLOC_ARENA_MAX="2") == "off: the environment sets MALLOC_ARENA_MAX"
