#!/usr/bin/env bash
# GPU check for the rollout engines: 20 DAPO steps of the built-in model on one GPU with each
# engine (hf, fast, vllm), printing completion tokens/s. Needs: a CUDA GPU, torch with CUDA,
# `pip install -e ".[dev,vllm]"`. Nothing is downloaded (the model ships with the package).
#   bash scripts/gpu_check.sh [STEPS]
set -euo pipefail
steps=${1:-20}
out=$(mktemp -d)
python -m pytest -q tests/test_rollout_vllm.py tests/test_rollout_fast.py
for engine in hf fast vllm; do
  rlvr train --model.device=cuda --rollout.engine=$engine --max-steps "$steps" \
    --rollout.prompts_per_step=32 --rollout.group_size=8 --train.eval_size=64 \
    --output-dir "$out/$engine" --no-progress > "$out/$engine.log" 2>&1 \
    || { echo "$engine: FAILED (log: $out/$engine.log)"; tail -20 "$out/$engine.log"; continue; }
  python - "$out/$engine" "$engine" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")][2:]  # skip warm-up
tok = sum(r["generated_tokens"] for r in rows)
gen = sum(r["time/generation"] for r in rows)
step = sum(r["time/step"] for r in rows)
s = json.load(open(f"{sys.argv[1]}/summary.json"))
print(f"{sys.argv[2]:5s} generation {tok / gen:9.0f} tok/s   end-to-end {tok / step:9.0f} tok/s   "
      f"held-out acc {s['eval_before']['accuracy']:.3f} -> {s['eval_after']['accuracy']:.3f}")
PY
done
