#!/usr/bin/env bash
# Environments of other frameworks for real: a venv of its own with the `verifiers` and
# `openenv` extras (they pull many packages: anthropic, mcp, gradio, ...), then the tests marked
# `environments` there (tests/test_env_verifiers.py: the built-in arithmetic task as a
# verifiers.v1 environment through `rlvr train --env`, resumed once, its trained ids the ids
# verifiers sampled; tests/test_env_openenv.py: an OpenEnv environment served on loopback);
# --slow adds the learning test (100 steps of the default run, held-out accuracy +0.40).
#
#   bash scripts/environments_env.sh [--slow] [VENV]     (default VENV: .ci-venv-verifiers)
#
# verifiers' harness programs other than in-process ones (its `null` and `bash` chat loops)
# install their packages with `uv` from the package index on first use; the tests here use an
# in-process harness (examples/verifiers_arithmetic.py) and need no index once the venv exists.
set -euo pipefail
cd "$(dirname "$0")/.."
marks="environments and not slow"
if [ "${1:-}" = "--slow" ]; then marks="environments"; shift; fi
venv=${1:-.ci-venv-verifiers}
python3 -m venv "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
pip install -q torch==2.13.0
pip install -q -e ".[dev,verifiers,openenv]"
python -c "import importlib.metadata as m; print('verifiers', m.version('verifiers'), 'openenv', m.version('openenv'))"
pytest -q -p no:cacheprovider -m "$marks" tests/test_env_verifiers.py tests/test_env_openenv.py
