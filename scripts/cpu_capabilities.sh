#!/usr/bin/env bash
# The numerically sensitive tests under other CPU kernels than this machine's own, and the
# torch fallbacks of rlvr's C kernels.
#
#   bash scripts/cpu_capabilities.sh [CAPABILITY:NATIVE ...]   (default: default:1 avx2:0)
#
# PyTorch picks its CPU kernels by the processor (`torch.backends.cpu.get_cpu_capability()`:
# AVX512, AVX2 or DEFAULT); `ATEN_CPU_CAPABILITY` forces a lower one. Each kernel set rounds
# matmuls and reductions in its own order, so a test that leans on one machine's rounding (a
# seed that happens to sample a case, bit-equality of two different computations) passes on
# the machine it was written on and fails on the next. Running these files under other
# capabilities makes such a test fail here first. The main `pytest` run covers the machine's
# own capability with rlvr's C kernels on; the default run here adds the DEFAULT kernels with
# the C kernels on, then AVX2 with them off (`RLVR_NATIVE=0`), which also runs the engines, the
# update and the CPU backend's gate on the torch fallbacks (the kernels' own tests skip with
# that reason; `native_off` below). Two runs instead of every capability with the C kernels on
# and off: each of the three arithmetic changes is taken once, for half the minutes.
#
# Then the arithmetic guard: every fast test that compares two runs or two computations of the
# same math (marked `compares_runs`; a test comparing through tests/same_run.py is marked by
# tests/conftest.py) runs once more under one condition that changes the arithmetic and not
# the math: AVX2 kernels, one thread and rlvr's C kernels off together. Such a test compares
# the discrete outcomes exactly and floats within a stated tolerance, or bit for bit only where
# both sides run the very same arithmetic (a resume replaying its steps); one that leans on
# this machine's rounding fails here.
# Exit status: non-zero when any run fails.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(default:1 avx2:0)

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

# with the C kernels off, also the files whose torch fallbacks stand in for the kernels
native_off=(
  tests/test_rollout_vllm.py
  tests/test_native.py
  tests/test_train_e2e.py
  tests/test_cpu_gate.py
)

for run in "${runs[@]}"; do
  cap=${run%%:*} native=${run#*:}
  [ "$native" != "$run" ] || native=1
  extra=()
  [ "$native" = 1 ] || extra=("${native_off[@]}")
  echo "== ATEN_CPU_CAPABILITY=$cap RLVR_NATIVE=$native"
  ATEN_CPU_CAPABILITY="$cap" RLVR_NATIVE="$native" pytest -m "not slow" -q --durations=15 \
    "${files[@]}" "${extra[@]}"
done

echo "== arithmetic guard: ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 RLVR_NATIVE=0"
ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 RLVR_NATIVE=0 pytest -q --durations=15 -m "compares_runs and not slow"
