#!/usr/bin/env bash
# A custom reward file with the CLI, on GSM8K-format data (examples/word_problems.py).
# Run from the repository root; extra arguments are passed on (CI adds --max-steps 2).
set -euo pipefail
rlvr train \
  --data.path=examples/data/word_problems_train.jsonl \
  --data.eval_path=examples/data/word_problems_test.jsonl \
  --data.format=gsm8k \
  "--data.prompt_template={question} Answer in <answer></answer>." \
  --reward.accuracy=examples/custom_reward.py:exact_answer \
  --reward.extra=examples/custom_reward.py:brevity=0.1 \
  --train.max_steps=30 --train.eval_size=64 \
  --output-dir "${RUN_DIR:-runs/custom_reward}" \
  "$@"
