"""The `calc` task as a standard OpenAI function-calling loop, trained on the built-in model.

    python examples/calc_tool_calls.py          # the calc task's 150 steps
    python examples/calc_tool_calls.py 2        # a smoke run of 2 steps
    rlvr train --data.task=calc --agent examples/calc_tool_calls.py:calc_agent
    rlvr eval --model runs/<run> --task calc --k 1   # held-out accuracy, the tool in the loop

The agent sends the calc tool's schema as `tools`, reads the model's calls from
`message.tool_calls`, runs them and sends each result back as a `tool` message, until the model
answers without a call; the reward is the task's verifier on that answer. The run's endpoint
renders the tools with the model's chat template, parses its calls with its response template
and trains on exactly the ids it sampled (docs/environments.md, "Tool calls").
"""

import json

from transformers.utils import get_json_schema

from rlvr.tasks import TASKS
from rlvr.tools import calc

CALC = get_json_schema(calc)  # {"type": "function", "function": {"name": "calc", ...}}
MAX_TURNS = 4  # model turns: up to three calls, then the answer
MAX_TOKENS = 64  # a turn's budget: a call takes 57-60 tokens, an answer and its EOS 7-8
BUDGET = 224  # no call after the conversation passes this many tokens (the task's row budget)


def run_call(call) -> str:
    """One tool call's result; anything wrong is the model's to read, as `error: ...`."""
    if call.function.name != "calc":
        return f"error: no tool named {call.function.name!r}"
    try:
        return calc(**json.loads(call.function.arguments))
    except Exception as e:
        return f"error: {type(e).__name__}: {e}"


def calc_agent(client, row):
    messages, start = list(row["messages"]), None
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(
            model="policy", messages=messages, tools=[CALC], max_tokens=MAX_TOKENS
        )
        start = start or reply.usage.prompt_tokens
        message = reply.choices[0].message
        messages.append(message)
        if not message.tool_calls or reply.usage.total_tokens - start >= BUDGET:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_call(call)})
    right = TASKS["calc"].verify(message.content or "", row["example"])
    return 1.0 if right else -1.0  # the dapo preset's reward.correct_score / wrong_score


if __name__ == "__main__":
    import sys

    import rlvr

    # train.eval_size=0: under an agent the run's engine runs no tools, so its own held-out
    # evaluation of calc would sample without the tool; `rlvr eval` runs the task's tool
    config = {"data.task": "calc", "train.eval_size": 0}
    if len(sys.argv) > 1:
        config["train.max_steps"] = int(sys.argv[1])
    result = rlvr.train("rlvr-tiny", agent=calc_agent, config=config)
    print(f"run directory: {result.run_dir} ({len(result.metrics)} steps)")
    print(f"held-out accuracy: rlvr eval --model {result.run_dir} --task calc --k 1")
