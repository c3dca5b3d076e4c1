"""Small C kernels for CPU decoding and training, compiled on first use with the system C
compiler.

A decoding step of a small model on CPU is dominated by per-op overhead, not arithmetic: the
shared-prefix attention (`rlvr.cpu.prefix_attention`) is ~20 torch ops per layer per
step. `kernels/prefix_decode.c` does it in one pass (measured ~3x faster on bench/vs_trl.py's model,
2 threads); `kernels/attention.c` is the training forwards' masked attention
(`rlvr.cpu.attention`), `kernels/linear.c` the decoding step's matmuls (`rlvr.cpu.packed`),
and the rest are RMSNorm, SiLU-gate, RoPE and sampling passes. They are
plain C with OpenMP, built the first time one is needed into one library in a cache
directory (`$RLVR_CACHE_DIR`, else `~/.cache/rlvr`) keyed by the sources, the compiler and the
CPU, and loaded with `ctypes`: no build step at install, no torch headers (a torch C++
extension takes ~1 minute to compile; this takes under a second).

Where there is no compiler, the build fails, or `RLVR_NATIVE=0` is set, `available()` is
False, `function()` returns None and callers keep their torch code, which is also what the
kernels are tested against. `status()` says which, and why. Nothing is built before the first
call of one of these, and only code behind the backend's gate (`rlvr.cpu.enabled`) calls them.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

_KERNELS = Path(__file__).with_name("kernels")
_SOURCES = [_KERNELS / f for f in ("prefix_decode.c", "attention.c", "linear.c")]  # one library
_HEADERS = [_KERNELS / "common.h"]
# -ffp-contract=fast: a * b + c as one fused multiply-add (ISO C mode would forbid it; measured
# ~15% off the training attention). Not -ffast-math: see kernels/prefix_decode.c.
_FLAGS = ["-O3", "-march=native", "-fno-trapping-math", "-ffp-contract=fast", "-fopenmp"]
_FLAGS += ["-shared", "-fPIC", "-std=c11"]
_state: dict = {}
_I64, _PTR, _F32, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
# Every exported kernel (`rlvr_<name>` in kernels/*.c) and its C argument types.
_SIGNATURES = {
    "prefix_decode_attention": [
        *(_PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _PTR),
        *(_PTR, _PTR, _I64, _I64, _I64, _F32, _PTR, _PTR, _I32),
    ],
    "rope_cache_attention": [
        *(_PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR),
        *(_PTR, _PTR, _PTR, _I64, _I64, _I64, _F32, _PTR, _PTR, _I32),
    ],
    "sample": [_PTR, _I64, _I64, _F32, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I32],
    # RMSNorm (also the lean decoder's) and, for rlvr.cpu.fused, the SiLU gate, with backward
    "rms_norm_fwd": [_PTR, _PTR, _I64, _I64, _F32, _PTR, _PTR, _I32],
    "rms_norm_bwd": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _I32],
    "silu_mul_fwd": [_PTR, _PTR, _I64, _PTR, _I32],
    "silu_mul_bwd": [_PTR, _PTR, _PTR, _I64, _PTR, _PTR, _I32],
    "rope_fwd": [_PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR, _I32],
    "rope_bwd": [_PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR, _I32],
    # training attention (rlvr.cpu.attention); they return 0, or -1 when out of memory
    "attention_fwd": [_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I32, _F32, _PTR, _PTR, _I32],
    "attention_bwd": [
        *(_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I32, _F32),
        *(_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I32),
    ],
    "attention_scratch_bytes": [_I64, _I64],
    # decoding-step linears on weights packed in panels (rlvr.cpu.packed)
    "pack_panels": [_PTR, _I64, _I64, _PTR, _I32],
    "linear": [_PTR, _I64, _I64, _PTR, _I64, _PTR, _I32, _PTR, _PTR, _I32],
    "panel_width": [],
}
_RETURNS = {  # the rest return nothing
    "attention_fwd": _I32,
    "attention_bwd": _I32,
    "attention_scratch_bytes": _I64,
    "panel_width": _I32,
}


def _cpu_key() -> str:
    """The CPU's model and feature flags: a binary built with -march=native must not be
    reused on a different CPU (a shared home directory across machines)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def _cache_dirs() -> list[Path]:
    """Where a built library may live: `$RLVR_CACHE_DIR` if set, else `~/.cache/rlvr`, then
    a per-user temporary directory for machines whose home is read-only (containers, CI)."""
    if os.environ.get("RLVR_CACHE_DIR"):
        return [Path(os.environ["RLVR_CACHE_DIR"]) / "kernels"]
    dirs = [Path.home() / ".cache" / "rlvr" / "kernels"]
    tmp = Path(tempfile.gettempdir()) / f"rlvr-{os.getuid()}"
    with contextlib.suppress(OSError):
        tmp.mkdir(mode=0o700, exist_ok=True)
        st = tmp.stat()
        # a shared /tmp: only a directory that is ours and closed to others (a library
        # planted there by someone else would run as us)
        if st.st_uid == os.getuid() and not st.st_mode & 0o022:
            dirs.append(tmp / "kernels")
    return dirs


def _compile(cc: str) -> Path:
    """Build (or find built) the shared library; atomic: a crash never leaves a partial .so."""
    source = b"".join(f.read_bytes() for f in _SOURCES + _HEADERS)
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    key = hashlib.sha256(
        source + version.stdout.encode() + " ".join(_FLAGS).encode() + _cpu_key().encode()
    ).hexdigest()[:16]
    name = f"rlvr_kernels-{key}.so"
    for d in _cache_dirs():
        if (d / name).exists():
            return d / name
    errors = []
    for d in _cache_dirs():
        try:
            return _build(cc, d / name)
        except OSError as e:  # not writable: try the next place
            errors.append(f"{d}: {e}")
    raise OSError("no writable cache directory for the native kernels: " + "; ".join(errors))


def _build(cc: str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        proc = subprocess.run(
            [cc, *_FLAGS, *map(str, _SOURCES), "-o", str(built), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            names = ", ".join(f.name for f in _SOURCES)
            raise RuntimeError(f"{cc} failed on {names}: {proc.stderr.strip()[-2000:]}")
        os.replace(built, out)
    return out


def _load():
    if os.environ.get("RLVR_NATIVE", "1") == "0":
        return False, "off: RLVR_NATIVE=0"
    if platform.system() != "Linux":  # OpenMP flags and /proc: what is built and tested here
        return False, f"off: not built on {platform.system()}"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return False, "off: no C compiler (cc, gcc or $CC) found"
    try:
        lib = ctypes.CDLL(str(_compile(cc)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return False, f"off: {e}"
    for name, argtypes in _SIGNATURES.items():
        f = getattr(lib, f"rlvr_{name}")
        f.argtypes, f.restype = argtypes, _RETURNS.get(name)
        _state[name] = f
    return True, "on"


def available() -> bool:
    """Whether the kernels are built and on (builds them on the first call; see `status`)."""
    if "built" not in _state:
        _state["built"], _state["status"] = _load()
    return _state["built"]


def function(name: str):
    """A compiled kernel by name (`_SIGNATURES`), or None where the kernels are off."""
    return _state.get(name) if available() else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """`weight * x / sqrt(mean(x^2, -1) + eps)` over the last dim of an fp32 CPU tensor, or
    None where the kernel is off or the tensors are not contiguous fp32 of matching width."""
    rms = function("rms_norm_fwd")
    d = x.shape[-1]
    if (
        rms is None
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or x.device.type != "cpu"
        or weight.shape != (d,)
        or not x.is_contiguous()
        or not weight.is_contiguous()
    ):
        return None
    n = x.numel() // d
    out, inv_rms = torch.empty_like(x), torch.empty(n, dtype=torch.float32)
    # one thread: a decoding step's few rows are not worth a parallel region
    rms(x.data_ptr(), weight.data_ptr(), n, d, eps, out.data_ptr(), inv_rms.data_ptr(), 1)
    return out


def sample(
    logits: torch.Tensor, temperature: float, suppress: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Tokens drawn from softmax(logits / temperature) of (n, V) fp32 CPU logits, `suppress`
    ids excluded from the draw, and their log-probs under the unsuppressed softmax; one
    `torch.rand` uniform per row (the global generator, so seeds and resume work as for
    `torch.multinomial`, though the draws differ from its). None where the kernel is off or
    the logits are not contiguous fp32 on the CPU."""
    fn = function("sample")
    if fn is None or logits.dtype != torch.float32 or logits.device.type != "cpu":
        return None
    if logits.dim() != 2 or not logits.is_contiguous():
        return None
    n, V = logits.shape
    if suppress is None:
        suppress = torch.empty(0, dtype=torch.int64)
    suppress = suppress.to(torch.int64).contiguous()
    if suppress.numel() >= V:  # possibly nothing left to draw: torch's path raises for it
        return None
    u = torch.rand(n)
    tokens = torch.empty(n, dtype=torch.int64)
    log_probs = torch.empty(n, dtype=torch.float32)
    threads = torch.get_num_threads()
    scratch = torch.empty(threads * V, dtype=torch.float32)
    fn(
        logits.data_ptr(),
        n,
        V,
        1.0 / temperature,
        u.data_ptr(),
        suppress.data_ptr(),
        suppress.numel(),
        tokens.data_ptr(),
        log_probs.data_ptr(),
        scratch.data_ptr(),
        threads,
    )
    return tokens, log_probs


def rope_cache_attention(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: tuple[int, int, int],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    t: int,
    k_prompt: torch.Tensor,
    v_prompt: torch.Tensor,
    bias: torch.Tensor,
    group: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """A decoding step's attention from the q/k/v matmul's output: RoPE on q and k, the new
    key and value written to slot `t - 1` of the rows' own cache buffers, then the prefix
    attention. qkv (n, (Hq + 2 Hkv) D); cos, sin (n, D); heads (Hq, Hkv, D); k/v_cache
    (n, Hkv, T, D) contiguous, T >= t. Returns (n, Hq * D). Check `fits_rope` first."""
    Hq, _, D = heads
    out = torch.empty(qkv.shape[0], Hq * D, dtype=torch.float32)
    rest, _scratch = _attention_args(
        heads, k_prompt, v_prompt, bias, group, k_cache, v_cache, t, scale, out, extra_scratch=D
    )
    function("rope_cache_attention")(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), *rest)
    return out


def _attention_args(
    heads, k_prompt, v_prompt, bias, group, k_own, v_own, t, scale, out, extra_scratch=0
) -> tuple[tuple, torch.Tensor]:
    """The argument tail both attention kernels share, after their own inputs: sizes, the
    prompt side, the rows' own keys/values (t of them; row and head strides), the scale, the
    output, per-thread scratch of P + t + `extra_scratch` floats, the thread count. Also
    returns the scratch tensor: the caller holds it until the kernel returns (the tail has
    only its address)."""
    Hq, Hkv, D = heads
    n, P = bias.shape
    threads = torch.get_num_threads()
    scratch = torch.empty(threads * (P + t + extra_scratch), dtype=torch.float32)
    args = (
        *(n, Hq, Hkv, D, k_prompt.data_ptr(), v_prompt.data_ptr(), P),
        *(bias.data_ptr(), group.data_ptr(), k_own.data_ptr(), v_own.data_ptr(), t),
        *(k_own.stride(0), k_own.stride(1), scale, out.data_ptr(), scratch.data_ptr()),
        threads,
    )
    return args, scratch


def fp32_cpu(*tensors: torch.Tensor) -> bool:
    """Every tensor fp32 on the CPU (what the kernels read)."""
    return all(x.dtype == torch.float32 and x.device.type == "cpu" for x in tensors)


def _prompt_fits(k_prompt, v_prompt, bias, group, n: int, Hkv: int, D: int) -> bool:
    """The prompt side both attention kernels read: k/v_prompt (U, Hkv, P, D) and bias (n, P)
    contiguous fp32 on the CPU, group (n,) contiguous int64."""
    if k_prompt.dim() != 4:
        return False
    U, _, P, _ = k_prompt.shape
    return (
        k_prompt.shape == v_prompt.shape == (U, Hkv, P, D)
        and bias.shape == (n, P)
        and group.shape == (n,)
        and group.dtype == torch.int64
        and fp32_cpu(k_prompt, v_prompt, bias)
        and all(x.is_contiguous() for x in (k_prompt, v_prompt, bias, group))
    )


def fits_rope(qkv, cos, sin, heads, k_cache, v_cache, t, k_prompt, v_prompt, bias, group):
    """Whether `rope_cache_attention` may run on these (it trusts shapes and layouts)."""
    Hq, Hkv, D = heads
    n = qkv.shape[0]
    if D % 2 or Hq % Hkv or k_cache.dim() != 4:
        return False
    tensors = (qkv, cos, sin, k_cache, v_cache)
    return (
        fp32_cpu(*tensors)
        and all(x.is_contiguous() for x in tensors)
        and qkv.shape == (n, (Hq + 2 * Hkv) * D)
        and cos.shape == sin.shape == (n, D)
        and k_cache.shape == v_cache.shape
        and k_cache.shape[0] == n
        and k_cache.shape[1] == Hkv
        and k_cache.shape[3] == D
        and 1 <= t <= k_cache.shape[2]
        and _prompt_fits(k_prompt, v_prompt, bias, group, n, Hkv, D)
    )


def status() -> str:
    """ "on", or "off: <why>"."""
    available()
    return _state["status"]


def prefix_decode_attention(
    q: torch.Tensor,
    k_prompt: torch.Tensor,
    v_prompt: torch.Tensor,
    bias: torch.Tensor,
    group: torch.Tensor,
    k_own: torch.Tensor,
    v_own: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The kernel on torch tensors. q (n, Hq, D); k/v_prompt (U, Hkv, P, D) contiguous; bias
    (n, P) contiguous fp32; group (n,) int64; k/v_own (n, Hkv, t, D) with unit stride over
    D and stride D over t (a slice of a preallocated buffer is fine). Returns (n, Hq, D)."""
    _, Hq, D = q.shape
    heads = (Hq, k_prompt.shape[1], D)
    q = q.contiguous()
    out = torch.empty_like(q)
    t = k_own.shape[2]
    rest, _scratch = _attention_args(
        heads, k_prompt, v_prompt, bias, group, k_own, v_own, t, scale, out
    )
    function("prefix_decode_attention")(q.data_ptr(), *rest)
    return out


def fits(q, k_prompt, v_prompt, bias, group, k_own, v_own) -> bool:
    """Whether these tensors have the shapes, dtypes, devices and layouts the kernel reads
    (it trusts them: a mismatch would read out of bounds). `group` entries must be < U, which
    `PrefixLayout` guarantees."""
    if q.dim() != 3 or k_prompt.dim() != 4 or k_own.dim() != 4:
        return False
    n, Hq, D = q.shape
    Hkv, t = k_prompt.shape[1], k_own.shape[2]
    return (
        Hq % Hkv == 0
        and k_own.shape == v_own.shape == (n, Hkv, t, D)
        and all(x.stride(3) == 1 and x.stride(2) == D for x in (k_own, v_own))
        and k_own.stride() == v_own.stride()
        and fp32_cpu(q, k_own, v_own)
        and _prompt_fits(k_prompt, v_prompt, bias, group, n, Hkv, D)
    )
