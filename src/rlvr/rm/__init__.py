"""Outcome reward models trained from rule judgments (DeepSeekMath's "Model" reward), and the
iterative loop that refreshes one during RL (docs/iterative_rl.md).

- `records.py`: a rule-labelled response (prompt, response, correct, well-formed, group) and
  its jsonl files;
- `collect.py`: responses sampled from a policy at its temperature, labelled by the rule;
- `model.py`: the reward model, a Hugging Face `AutoModelForSequenceClassification` (a scalar
  head on a causal LM's backbone) that sees the prompt and the response only;
- `verifier.py`: the default architecture (`rm.arch=surprise`): that head plus the backbone's
  own log-probabilities of the response's tokens;
- `loss.py`: pointwise (BCE) and pairwise (Bradley-Terry) losses;
- `fit.py`: the training loop (a pure function of the data, the seed and the step);
- `metrics.py`: accuracy and AUC against the rule's labels;
- `command.py`: `rlvr rm` (run directory, progress, resume, summary.json);
- `iterative.py`: the reward model as the training reward, its agreement with the rule, and
  its refresh with replay inside `rlvr train` (`reward.model_refresh_every`).
"""
