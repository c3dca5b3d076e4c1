"""`rlvr.cpu.native`: the C decode-attention kernel's build, cache, fallback and guards
(its numbers are checked against torch in tests/test_prefix_attention.py)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from rlvr.cpu import native

HAVE_CC = bool(shutil.which("cc") or shutil.which("gcc"))
# Tests of the kernels and their build skip where they are off by choice or for want of a compiler.
BUILDS = pytest.mark.skipif(
    not HAVE_CC or os.environ.get("RLVR_NATIVE") == "0",
    reason="C kernels off: no C compiler, or RLVR_NATIVE=0",
)


def _status(tmp_path, **env) -> dict:
    """native.status() and a short greedy generation's tokens, in a fresh process."""
    code = """
import json, torch
from rlvr.models import build_tiny_model, build_tokenizer
from rlvr.cpu import native
from rlvr.rollout import FastEngine, SamplingParams
tok = build_tokenizer()
model = build_tiny_model(tok, seed=0)
engine = FastEngine(model, pad_id=tok.pad_token_id, eos_ids=[tok.eos_token_id])
prompts = [tok("12+7=")["input_ids"], tok("3*4=")["input_ids"]]
out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6, greedy=True))
print(json.dumps({"status": native.status(), "tokens": out.completion_ids.tolist()}))
"""
    full_env = {**os.environ, "RLVR_CACHE_DIR": str(tmp_path / "cache"), **env}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@BUILDS
def test_builds_once_into_the_cache_and_matches_the_torch_path(tmp_path):
    on = _status(tmp_path)
    assert on["status"] == "on"
    built = list((tmp_path / "cache" / "kernels").glob("rlvr_kernels-*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    assert _status(tmp_path)["status"] == "on"  # second process: loaded, not rebuilt
    assert built[0].stat().st_mtime_ns == mtime
    assert not [p for p in built[0].parent.iterdir() if p.is_dir()], "a build dir was left"
    off = _status(tmp_path, RLVR_NATIVE="0")
    assert off["status"] == "off: RLVR_NATIVE=0"
    assert on["tokens"] == off["tokens"]  # greedy: same tokens with or without the kernel


@pytest.mark.skipif(os.environ.get("RLVR_NATIVE") == "0", reason="C kernels off: RLVR_NATIVE=0")
def test_a_broken_compiler_falls_back_with_the_reason(tmp_path):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'fake cc 1.0'\necho 'no such thing' >&2\nexit 1\n")
    fake.chmod(0o755)
    res = _status(tmp_path, CC=str(fake))
    assert res["status"].startswith("off: ") and "no such thing" in res["status"]
    assert len(res["tokens"]) == 6  # generation still ran, on the torch path


def _tensors(n=4, Hq=4, Hkv=2, U=2, P=3, t=2, D=8):
    return dict(
        q=torch.randn(n, Hq, D),
        k_prompt=torch.randn(U, Hkv, P, D),
        v_prompt=torch.randn(U, Hkv, P, D),
        bias=torch.zeros(n, P),
        group=torch.tensor([0, 0, 1, 1]),
        k_own=torch.randn(n, Hkv, t, D),
        v_own=torch.randn(n, Hkv, t, D),
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda a: a.update(q=a["q"].double()),
        lambda a: a.update(k_prompt=a["k_prompt"].transpose(2, 3).contiguous().transpose(2, 3)),
        lambda a: a.update(k_own=a["k_own"].transpose(2, 3).contiguous().transpose(2, 3)),
        lambda a: a.update(v_own=a["v_own"][:, :, :1]),
        lambda a: a.update(bias=a["bias"][:, :2]),
        lambda a: a.update(group=a["group"].int()),
        lambda a: a.update(group=a["group"][:3]),
        lambda a: a.update(q=torch.randn(4, 3, 8)),  # 3 query heads on 2 KV heads
        lambda a: a.update(k_prompt=torch.randn(2, 2, 3, 4), v_prompt=torch.randn(2, 2, 3, 4)),
    ],
    ids=[
        "fp64-query",
        "prompt-not-contiguous",
        "own-keys-transposed",
        "v-own-shorter",
        "bias-short",
        "group-int32",
        "group-short",
        "heads-not-divisible",
        "head-dim-differs",
    ],
)
def test_fits_refuses_what_the_kernel_would_misread(change):
    args = _tensors()
    assert native.fits(**args)
    change(args)
    assert not native.fits(**args)


@BUILDS
def test_rms_norm_matches_the_llama_norm_and_a_loop():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(24, eps=1e-6)
    with torch.no_grad():
        norm.weight.add_(torch.randn(24))
    x = torch.randn(5, 3, 24) * 4
    with torch.no_grad():
        got = native.rms_norm(x, norm.weight, 1e-6)
        torch.testing.assert_close(got, norm(x), atol=1e-6, rtol=1e-6)
        for row in x.reshape(-1, 24):  # the formula, one row at a time
            want = norm.weight * row / torch.sqrt((row * row).sum() / 24 + 1e-6)
            torch.testing.assert_close(got.reshape(-1, 24)[0], want, atol=1e-6, rtol=1e-6)
            got = got.reshape(-1, 24)[1:]
    assert native.rms_norm(x.double(), norm.weight, 1e-6) is None
    assert native.rms_norm(x.transpose(0, 1), norm.weight, 1e-6) is None
    assert native.rms_norm(x, norm.weight[:12], 1e-6) is None


@BUILDS
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampler_draws_the_softmax_and_reports_its_log_probs(temperature):
    """40,000 draws per case: each token's frequency within 4.5 standard errors of its
    softmax probability; suppressed ids never drawn; log-probs are the unsuppressed
    log-softmax at the drawn token."""
    torch.manual_seed(0)
    base = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0, -50.0]])
    logits = base.repeat_interleave(20_000, dim=0).contiguous()
    suppress = torch.tensor([5])
    tokens, log_probs = native.sample(logits, temperature, suppress)
    full = torch.log_softmax(base / temperature, dim=-1)
    allowed = torch.softmax((base / temperature).index_fill(-1, suppress, float("-inf")), -1)
    for row in range(2):
        drawn = tokens[row * 20_000 : (row + 1) * 20_000]
        freq = torch.bincount(drawn, minlength=6).double() / 20_000
        p = allowed[row].double()
        se = (p * (1 - p) / 20_000).sqrt()
        assert ((freq - p).abs() <= 4.5 * se + 1e-12).all(), (row, freq, p)
        assert freq[5] == 0
    torch.testing.assert_close(
        log_probs, full.repeat_interleave(20_000, 0).gather(1, tokens[:, None]).squeeze(1)
    )


@BUILDS
def test_sampler_follows_the_global_seed_and_declines_what_it_does_not_do():
    logits = torch.randn(8, 50)
    torch.manual_seed(3)
    a = native.sample(logits, 1.0, None)
    torch.manual_seed(3)
    b = native.sample(logits, 1.0, None)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert native.sample(logits.double(), 1.0, None) is None
    assert native.sample(logits.t(), 1.0, None) is None
    assert native.sample(logits, 1.0, torch.arange(50)) is None  # nothing left: torch raises


@BUILDS
def test_an_unwritable_home_falls_back_to_a_private_temporary_directory(tmp_path):
    home = tmp_path / "home-is-a-file"
    home.write_text("")  # ~/.cache cannot be created under it
    env = {k: v for k, v in os.environ.items() if k != "RLVR_CACHE_DIR"}
    env |= {"HOME": str(home), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    code = "from rlvr.cpu import native; print(native.status())"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "on"
    private = tmp_path / "tmp" / f"rlvr-{os.getuid()}"
    assert oct(private.stat().st_mode & 0o777) == oct(0o700)
    assert list((private / "kernels").glob("rlvr_kernels-*.so"))


@BUILDS
def test_a_shared_temporary_directory_open_to_others_is_not_used(tmp_path):
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    planted = tmp_path / "tmp" / f"rlvr-{os.getuid()}"
    planted.mkdir(parents=True)
    planted.chmod(0o777)  # anyone could have put a library here
    env = {k: v for k, v in os.environ.items() if k != "RLVR_CACHE_DIR"}
    env |= {"HOME": str(home), "TMPDIR": str(tmp_path / "tmp")}
    code = "from rlvr.cpu import native; print(native.status())"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("off: no writable cache directory"), proc.stdout
    assert not list(planted.rglob("*.so"))
