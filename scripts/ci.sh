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
#   slow              `pytest -m "slow and not long"`: the learning tests, examples and 2-process
#                     tests (`long` marks the few learning tests run by hand, `pytest -m long`)
#   cpu-capabilities  the numerically sensitive files under other CPUs' kernels, the engines
#                     and the update with the C kernels off, the arithmetic guard
#   venvs             waits for the vLLM and environment venvs, which build in the background
#                     from the start of lint-docs (their downloads and unpacking wait on the
#                     network and the disk; built one after the other they took 6-7 minutes
#                     of the run's wall time)
#   vllm              the tests marked `vllm` in the vLLM venv (vLLM's CPU build)
#   environments      the tests marked `environments` in the verifiers and OpenEnv venvs
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
venvs_pid=""
venvs_log=$(mktemp)
summary() {
  [ -z "$venvs_pid" ] || kill -- -"$venvs_pid" 2>/dev/null || true
  echo "== ci parts (wall time)"
  printf '%s\n' "${lines[@]}"
  rm -f "$venvs_log"
}
trap summary EXIT
wait_for_venvs() {  # the background build's exit status, its log shown either way
  local rc=0
  wait "$venvs_pid" || rc=$?
  venvs_pid=""
  cat "$venvs_log"
  return "$rc"
}

durations=--durations=15
part install bash -c 'pip install torch==2.13.0 && pip install -e ".[dev]"'
# a session of its own, so that a failed part stops the build with everything it started
setsid bash -c 'bash scripts/vllm_env.sh --install-only && bash scripts/environments_env.sh --install-only' \
  >"$venvs_log" 2>&1 &
venvs_pid=$!
part lint-docs bash -c 'ruff check . && ruff format --check . && mkdocs build --strict'
part fast pytest "$durations"
part slow pytest -m "slow and not long" "$durations"
part cpu-capabilities bash scripts/cpu_capabilities.sh
part venvs wait_for_venvs
part vllm bash scripts/vllm_env.sh --tests-only
part environments bash scripts/environments_env.sh --tests-only
