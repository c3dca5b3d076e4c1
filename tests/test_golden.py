"""The golden baseline (tests/golden): the policy loss, one update and a 2-step run of every
preset (and GSPO, RLOO with dual clip, the log-ratio clamp), prompt sharing off and on, 1 and
2 ranks, recomputed and compared with what tests/golden/make.py stored.

Where torch's version, its CPU capability (`torch.backends.cpu.get_cpu_capability()`) and
the C kernels' availability are those recorded in golden.json, the same ops run the same
kernels, so the comparison is bit for bit: every float ==, the weights' sha256 equal. On
another CPU the vectorised kernels round differently, so the loss and update levels are
compared within fp32 tolerance (rel 1e-4, abs 1e-5 on sums of at most a few thousand fp32
values of size <= 1), and the run level is skipped: a different rounding can flip a sampled
token, after which the rollouts, and so the runs, legitimately differ.
"""

import json
import math
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "golden"))
import golden_cases as cases

GOLDEN = json.loads((cases.HERE / "golden.json").read_text())
EXACT = GOLDEN["environment"] == cases.environment()
REL, ABS = 1e-4, 1e-5


def _same(a, b, where=""):
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), where
        for k in a:
            _same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    elif EXACT or not isinstance(a, float):
        assert a == b, f"{where}: {a!r} != {b!r}"
    else:
        assert b == pytest.approx(a, rel=REL, abs=ABS), where


def _same_weights(want, got, where):
    if EXACT:
        assert got["sha256"] == want["sha256"], where
    _same(want["per_tensor"], got["per_tensor"], where)


@pytest.mark.compares_runs
def test_loss_level():
    got = cases.loss_cases()
    assert sorted(got) == sorted(GOLDEN["loss"])
    for key, want in GOLDEN["loss"].items():
        _same(want, got[key], key)


@pytest.fixture(scope="module")
def model():
    return cases._model()


@pytest.mark.compares_runs
@pytest.mark.parametrize("key", sorted(GOLDEN["update"]))
def test_update_level(model, key):
    name, share, stale = key.split("/")
    preset, algo = {v[0]: v[1:] for v in cases.VARIANTS}[name]
    got = cases._update_case(*model, preset, algo, share == "share=1", stale == "stale=1")
    want = GOLDEN["update"][key]
    _same(want["metrics"], got["metrics"], key)
    _same_weights(want["weights"], got["weights"], key)


@pytest.fixture(scope="module")
def model_dir():
    with tempfile.TemporaryDirectory() as tmp:
        yield cases.tiny_model_dir(Path(tmp))


def _check_run(want, got, key):
    _same(want["metrics"], got["metrics"], key)
    _same_weights(want["weights"], got["weights"], key)


@pytest.mark.compares_runs
@pytest.mark.slow
@pytest.mark.skipif(not EXACT, reason="another CPU/torch: sampled tokens may differ")
@pytest.mark.parametrize("key", sorted(GOLDEN.get("run", {})))
def test_run_level(model_dir, key):
    preset, share = key.split("/")
    got = cases.run_case(model_dir, preset, share == "share=1")
    _check_run(GOLDEN["run"][key], got, key)


@pytest.mark.slow
@pytest.mark.skipif(not EXACT, reason="another CPU/torch: sampled tokens may differ")
def test_two_rank_run_level(model_dir):
    got = cases.run_case(model_dir, "dapo", False, nproc=2)
    _check_run(GOLDEN["run2"]["dapo/share=0"], got, "run2")
