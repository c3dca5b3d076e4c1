"""Keep freed memory in the process for reuse (glibc malloc), for CPU training.

A training step allocates and frees the same large activation and gradient buffers every
step. glibc serves each allocation over its mmap threshold with a fresh `mmap` and returns it
on free, and trims the heap top back to the system, so the next step touches new pages again:
page faults on every large tensor, which are costly (more so in sandboxed kernels such as
gVisor). PyTorch's CPU performance guide recommends jemalloc or tcmalloc for this; those are
not on PyPI, so `keep_freed_memory` sets glibc's own knobs instead (`mallopt`): allocations up
to 32 MiB come from the heap, freed memory is kept up to 1 GiB above the heap top, and the heap
grows 256 MiB at a time (address space only; pages count once touched). Measured on the bench
model (`bench/vs_trl.py` settings, beta 0.04, 4 alternating pairs): faster in every pair, the
update by 2.5-6%, the step by 1-7%.

Under gradient checkpointing the user has put memory before speed, and keeping freed memory
costs a lot of it: the layers' recomputed activations and temporaries (4-20 MB each on the
probed shapes) are served from the heap between the tensors checkpointing keeps, and the
freed holes stay resident. There `return_freed_memory` sets a fixed mmap threshold of 128 KiB
instead (glibc's default value, but fixed: glibc otherwise raises it to the size of the largest
freed block, up to 32 MiB), so every tensor buffer is its own mapping and goes back to the
system when freed. Measured (peak RSS of two `rlvr train` steps, 8 x 512 forced tokens, fp32):
a 24-layer Qwen2 256 wide 2,016 -> 921 MiB; the whole Qwen2-0.5B shape with its vocabulary
11,968 -> 8,539 MiB.

It changes process-wide allocator settings, so it runs when training starts, not at import;
set `RLVR_MALLOC=0` to leave the allocator alone. Any `MALLOC_*` environment variable means
the user tuned glibc already: left alone too. Not glibc (musl, macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h
SETTINGS = ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 256 << 20))
MEMORY_FIRST = ((M_MMAP_THRESHOLD, 128 << 10), (M_TRIM_THRESHOLD, 128 << 10))
_status: list[str] = []


def keep_freed_memory() -> str:
    """Apply the speed settings; returns "on" or "off: <why>" (see `_once`)."""
    return _once(SETTINGS, "on")


def return_freed_memory() -> str:
    """Apply the memory-first settings (gradient checkpointing); returns "on: freed memory
    returned (gradient checkpointing)" or "off: <why>" (see `_once`)."""
    return _once(MEMORY_FIRST, "on: freed memory returned (gradient checkpointing)")


def _once(settings, on: str) -> str:
    """The first call of a process applies its settings; every call returns (and the process
    remembers) that first call's status."""
    if not _status:
        _status.append(_apply(settings, on))
    return _status[0]


def _apply(settings, on: str) -> str:
    if os.environ.get("RLVR_MALLOC", "1") == "0":
        return "off: RLVR_MALLOC=0"
    tuned = sorted(k for k in os.environ if k.startswith("MALLOC_"))
    if tuned:
        return f"off: the environment sets {', '.join(tuned)}"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "off: not glibc"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    for param, value in settings:
        if mallopt(param, value) != 1:  # mallopt returns 1 on success
            return f"off: mallopt({param}, {value}) failed"
    return on
