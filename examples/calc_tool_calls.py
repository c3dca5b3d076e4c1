"""The `calc` task as a standard OpenAI function-calling loop, trained on the built-in model.

    python examples/calc_tool_calls.py          # the calc task's 150 steps
    python examples/calc_tool_calls.py 2        # a smoke run of 2 steps
    rlvr train --data.task=calc --agent examples/calc_tool_calls.py:calc_agent

The agent sends the calc tool's schema as `tools`, reads the model's calls from
`message.tool_calls`, runs them and sends each result back as a `tool` message, until the model
answers without a call; the reward is the task's verifier on that answer. The run's endpoint
renders the tools with the model's chat template, parses its calls with its response template
and trains on exactly the ids it sampled (docs/environments.md, "Tool calls").
"""

import json
import sys

from transformers.utils import get_json_schema

import rlvr
from rlvr.tasks import TASKS
from rlvr.tools import calc

CALC = get_json_schema(calc)  # {"type": "function", "function": {"name": "calc", ...}}
MAX_TURNS = 4  # model turns: up to three calls, then the answer
MAX_TOKENS = 64  # a turn's budget: a call takes 57-61 tokens, an answer 8-10


def run_call(call) -> str:
    """One tool call's result; anything wrong is the model's to read, as `error: ...`."""
    if call.function.name != "calc":
        return f"error: no tool named {call.function.name!r}"
    try:
        return calc(**json.loads(call.function.arguments))
    except Exception as e:
        return f"error: {type(e).__name__}: {e}"


def calc_agent(client, row):
    messages = list(row["messages"])
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(
            model="policy", messages=messages, tools=[CALC], max_tokens=MAX_TOKENS
        )
        message = reply.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_call(call)})
    right = TASKS["calc"].verify(message.content or "", row["example"])
    return 1.0 if right else -1.0  # the dapo preset's reward.correct_score / wrong_score


if __name__ == "__main__":
    config = {"data.task": "calc"}
    if len(sys.argv) > 1:
        config["train.max_steps"] = int(sys.argv[1])
    result = rlvr.train("rlvr-tiny", agent=calc_agent, config=config)
    before = result.summary["eval_before"]["accuracy"]
    after = result.summary["eval_after"]["accuracy"]
    print(f"run directory: {result.run_dir}")
    print(f"held-out accuracy: {before:.3f} -> {after:.3f} in {len(result.metrics)} steps")
