#!/usr/bin/env bash
# The numerically sensitive tests under other CPU kernels than this machine's own.
#
#   bash scripts/cpu_capabilities.sh [CAPABILITY ...]     (default: default avx2)
#
# PyTorch picks its CPU kernels by the processor (`torch.backends.cpu.get_cpu_capability()`:
# AVX512, AVX2 or DEFAULT); `ATEN_CPU_CAPABILITY` forces a lower one. Each kernel set rounds
# matmuls and reductions in its own order, so a test that leans on one machine's rounding (a
# seed that happens to sample a case, bit-equality of two different computations) passes on
# the machine it was written on and fails on the next. Running these files under each
# capability, with rlvr's C kernels on and then off (`RLVR_NATIVE=0`), makes such a test fail
# here first. The main `pytest` run covers the machine's own capability.
# Exit status: non-zero when any run fails.
set -euo pipefail
cd "$(dirname "$0")/.."

caps=("$@")
[ ${#caps[@]} -gt 0 ] || caps=(default avx2)

files=(
  tests/test_tools_rollout.py
  tests/test_tools_loss.py
  tests/test_rollout_fast.py
  tests/test_rollout_streams.py
  tests/test_prefix_attention.py
  tests/test_lean.py
  tests/test_update.py
  tests/test_share_prompt.py
  tests/test_precision.py
  tests/test_critic.py
  tests/test_reference_sync.py
  tests/test_golden.py
  tests/test_token_scores.py
  tests/algos
)

for cap in "${caps[@]}"; do
  for native in 1 0; do
    echo "== ATEN_CPU_CAPABILITY=$cap RLVR_NATIVE=$native"
    ATEN_CPU_CAPABILITY="$cap" RLVR_NATIVE="$native" pytest -m "not slow" -q \
      "${files[@]}"
  done
done
