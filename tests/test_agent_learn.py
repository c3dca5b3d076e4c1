"""The built-in `arithmetic` task written as an agent function (tests/agent_funcs.py: one chat
completion through the run's endpoint, scored by the task's verifier) trains the built-in model
as `rlvr train` does: held-out accuracy up by at least 0.40 in the default run's 100 steps.
The comparison with `rlvr train` over seeds 0-2 (mean accuracy after within 0.05) is
bench/agent_vs_train.py's, measured in docs/environments.md."""

import json
from pathlib import Path

import pytest

pytest.importorskip("openai")

from rlvr.cli.main import main

AGENT = f"{Path(__file__).parent / 'agent_funcs.py'}:arithmetic"


@pytest.mark.slow
def test_arithmetic_agent_lifts_held_out_accuracy(tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--agent", AGENT, "--max-steps", "100", "--train.eval_size=128"]
    assert main([*argv, "--output-dir", str(run), "--no-progress"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["eval_before"]["accuracy"], summary["eval_after"]["accuracy"]
    assert after >= before + 0.40, (before, after)
