"""`rlvr.cpu.allocator`: glibc's malloc keeps freed memory when training starts, unless told not to.
Each case runs in a fresh interpreter: the settings are process-wide and applied once."""

import ctypes.util
import os
import subprocess
import sys

import pytest

GLIBC_ONLY = pytest.mark.skipif(
    sys.platform != "linux" or "libc.so" not in (ctypes.util.find_library("c") or ""),
    reason="glibc only",
)
CODE = "from rlvr.cpu import allocator; print(allocator.{fn}())"


def _run(code: str, **env) -> str:
    """`code`'s stdout in a fresh interpreter, without the environment's malloc settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "RLVR_MALLOC"))}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def _status(fn: str = "keep_freed_memory", **env) -> str:
    return _run(CODE.format(fn=fn), **env)


@GLIBC_ONLY
def test_on_by_default_with_glibc():
    assert _status() == "on"


def test_off_when_asked_or_when_the_user_tuned_malloc():
    assert _status(RLVR_MALLOC="0") == "off: RLVR_MALLOC=0"
    assert _status(MALLOC_ARENA_MAX="2") == "off: the environment sets MALLOC_ARENA_MAX"


FRAGMENT = """
import torch
from rlvr.cpu import allocator
print(allocator.{fn}())
def rss():
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) / 1024
base = rss()
kept, freed = [], []
for i in range(64):  # a kept 4 MB tensor between 16 MB temporaries, as a checkpointed forward
    kept.append(torch.ones(1 << 20))
    freed.append(torch.ones(4 << 20))
del freed
print(rss() - base)
"""


@GLIBC_ONLY
def test_memory_first_returns_freed_tensors_to_the_system():
    """Under gradient checkpointing (`return_freed_memory`) the freed temporaries between kept
    tensors leave the resident set; with the speed settings they stay (1 GiB of them here)."""
    grown = {fn: float(_run(FRAGMENT.format(fn=fn)).split()[-1]) for fn in
             ("keep_freed_memory", "return_freed_memory")}  # fmt: skip
    # kept: 64 x 4 MiB = 256 MiB; freed: 64 x 16 MiB = 1 GiB
    assert grown["return_freed_memory"] < 400 < 900 < grown["keep_freed_memory"], grown
    assert _status("return_freed_memory") == "on: freed memory returned (gradient checkpointing)"
