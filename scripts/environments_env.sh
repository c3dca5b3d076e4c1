#!/usr/bin/env bash
# Environments of other frameworks for real, each extra in a venv of its own (they pull many
# packages: anthropic, mcp, gradio, ...), then its tests marked `environments` there:
#   .ci-venv-verifiers  rlvr[verifiers]: tests/test_env_verifiers.py (the built-in arithmetic
#                       task as a verifiers.v1 environment through `rlvr train --env`, resumed
#                       once, its trained ids the ids verifiers sampled)
#   .ci-venv-openenv    rlvr[openenv]: tests/test_env_openenv.py (an OpenEnv environment served
#                       on loopback)
# --slow adds the learning test (100 steps of the default run, held-out accuracy +0.40).
#
#   bash scripts/environments_env.sh [--slow] [--install-only | --tests-only] [VENV_PREFIX]
#                                        (default prefix: .ci-venv)
#
# --install-only builds the venvs and runs nothing; --tests-only runs the tests in venvs built
# before (scripts/ci.sh builds them in the background while the main suites run).
#
# Two venvs because the two cannot share one: verifiers 0.4 pins mcp==2.0.0, and openenv 0.10
# requires fastmcp<4, whose releases require mcp<2 (pip: ResolutionImpossible).
# verifiers' harness programs other than in-process ones (its `null` and `bash` chat loops)
# install their packages with `uv` from the package index on first use; the tests here use an
# in-process harness (examples/verifiers_arithmetic.py) and need no index once the venv exists.
set -euo pipefail
cd "$(dirname "$0")/.."
marks="environments and not slow" install=1 tests=1
while [ $# -gt 0 ]; do
  case $1 in
    --slow) marks="environments" ;;
    --install-only) tests=0 ;;
    --tests-only) install=0 ;;
    -*) echo "environments_env.sh: unknown option $1 (--slow, --install-only, --tests-only)" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
prefix=${1:-.ci-venv}

run_in_venv() {  # extra, test file
  local venv="$prefix-$1" start=$SECONDS
  (
    if [ "$install" = 1 ]; then
      python3 -m venv "$venv"
      . "$venv/bin/activate"
      python -m pip install -q --upgrade pip
      pip install -q torch==2.13.0
      pip install -q -e ".[dev,$1]"
      python -c "import importlib.metadata as m; print('$1', m.version('$1'))"
      echo "ci-step: $1 install $((SECONDS - start)) s"
    fi
    [ "$tests" = 1 ] || exit 0
    . "$venv/bin/activate"
    start=$SECONDS
    trap 'echo "ci-step: $1 tests $((SECONDS - start)) s"' EXIT
    pytest -q -p no:cacheprovider --durations=15 -m "$marks" "$2"
  )
}

run_in_venv verifiers tests/test_env_verifiers.py
run_in_venv openenv tests/test_env_openenv.py
