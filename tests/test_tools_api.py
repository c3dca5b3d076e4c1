"""`rlvr.train(..., tools=[fn])`: a plain function becomes a tool of the run, its calls
happen in the rollouts, and the step logs the tool metrics."""

import json
import operator
import re

import torch
import yaml

import rlvr
from rlvr.models import build_tokenizer
from rlvr.tools import Toolbox
from tool_script import scripted_model

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def calc(expression: str) -> str:
    """Compute one operation on two integers.

    Args:
        expression: one operation such as 347*28
    """
    a, op, b = re.fullmatch(r"\s*(\d+)\s*([-+*])\s*(\d+)\s*", expression).groups()
    return str(OPS[op](int(a), int(b)))


def answered(completions, answer, **kwargs):
    return [float(f"<answer>{a}</answer>" in c) for c, a in zip(completions, answer)]


def test_train_with_a_tool_function(tmp_path):
    tok = build_tokenizer()
    threads = torch.get_num_threads()
    model = scripted_model(tok, Toolbox([calc], tok))
    rows = [
        {"prompt": "Compute 12*34+5.", "answer": "413"},
        {"prompt": "Compute 2+3.", "answer": "5"},
    ]
    try:
        torch.set_num_threads(1)
        result = rlvr.train(
            model,
            reward_funcs=[answered],
            train_dataset=rows,
            config={
                "rollout.prompts_per_step": 2,
                "rollout.group_size": 4,
                "rollout.max_new_tokens": 180,
                "rollout.temperature": 0.5,
                "algo.dynamic_sampling": False,
                "train.max_steps": 1,
                "train.eval_size": 0,
                "train.log_samples": 8,
            },
            tokenizer=tok,
            tools=[calc],
            output_dir=tmp_path / "run",
            show_progress=False,
        )
    finally:
        torch.set_num_threads(threads)
    step = result.metrics[0]
    assert step["tools/calls_per_sample"] > 0.5
    assert step["tools/turns_per_sample"] == 1 + step["tools/calls_per_sample"]
    stored = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert [t.rsplit(":", 1)[-1] for t in stored["rollout"]["tools"]] == ["calc"]
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert any("<tool_response>408</tool_response>" in s["completion"] for s in samples)
