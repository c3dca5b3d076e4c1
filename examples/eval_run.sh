#!/usr/bin/env bash
# Evaluate a finished run: its newest good checkpoint, on the run's own held-out data and
# rewards; avg@4, pass@4 and greedy accuracy printed, every answer written to a jsonl file.
# --trust-run-code: the run is your own, so the reward files its config.yaml names may be
# imported (without it, rlvr eval imports only code named again on its command line).
#   bash examples/eval_run.sh runs/custom_reward [more rlvr eval arguments]
set -euo pipefail
run_dir="${1:?usage: eval_run.sh RUN_DIR [rlvr eval arguments]}"
shift
rlvr eval --model "$run_dir" --trust-run-code --k 4 --num-prompts 64 --output "$run_dir/eval_samples.jsonl" "$@"
