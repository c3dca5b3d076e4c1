#!/usr/bin/env bash
# The project's whole test command, part by part, each part timed. `.ci/run` runs exactly this
# in a fresh venv, and the README's "run the tests" command is this script.
#
#   bash scripts/ci.sh
#
# Each part prints `ci-part: NAME SECONDS s` when it ends, and the script prints every part's
# line again at the end, also when a part fails; `python scripts/ci_budget.py LOG` reads those
# lines and prints each part against its budget. Every pytest run lists its 15 slowest tests
# (`--durations=15`). The parts:
#   install           torch (the CPU build on local disk) and rlvr with its dev extra
#   lint-docs         ruff, the formatter's check, the documentation site (mkdocs --strict)
#   fast              `pytest`: the fast suite
#   slow              `pytest -m slow`: the learning tests, examples and 2-process tests
#   native-off        the engines, the update and the CPU gate again with the C kernels off
#   cpu-capabilities  the numerically sensitive files under other CPUs' kernels
#   vllm              a venv with vLLM's CPU build and the tests marked `vllm` in it
#   environments      a venv for each of the verifiers and OpenEnv extras and their tests
set -euo pipefail
cd "$(dirname "$0")/.."

lines=()
part() {  # NAME COMMAND...: run COMMAND, print and keep its wall time
  local name=$1 start=$SECONDS rc=0
  shift
  echo "== ci part $name: $*"
  "$@" || rc=$?
  local failed=""
  [ "$rc" = 0 ] || failed=" (exit $rc)"
  lines+=("ci-part: $name $((SECONDS - start)) s$failed")
  echo "${lines[-1]}"
  return "$rc"
}
summary() {
  echo "== ci parts (wall time)"
  printf '%s\n' "${lines[@]}"
}
trap summary EXIT

durations=--durations=15
part install bash -c 'pip install torch==2.13.0 && pip install -e ".[dev]"'
part lint-docs bash -c 'ruff check . && ruff format --check . && mkdocs build --strict'
part fast pytest "$durations"
part slow pytest -m slow "$durations"
part native-off env RLVR_NATIVE=0 pytest -m "not slow" -q "$durations" \
  tests/test_rollout_fast.py tests/test_rollout_vllm.py tests/test_lean.py \
  tests/test_prefix_attention.py tests/test_native.py tests/test_update.py \
  tests/test_share_prompt.py tests/test_train_e2e.py tests/test_cpu_gate.py
part cpu-capabilities bash scripts/cpu_capabilities.sh
part vllm bash scripts/vllm_env.sh
part environments bash scripts/environments_env.sh
