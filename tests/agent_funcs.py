"""Agent functions the agent tests train with (`env.agent=agent_funcs:NAME`, or handed to
`rlvr.train(agent=...)`): the built-in tasks written as agents, and faulty ones."""

import asyncio
import json
import time

from rlvr.tasks import TASKS
from rlvr.tasks.calc import TOOL_CALL_CLOSE, TOOL_CALL_OPEN


def arithmetic(client, row):
    """One chat completion, scored by the task's verifier: 1 right, -1 wrong (the dapo
    preset's reward.correct_score and reward.wrong_score, what `rlvr train` scores)."""
    reply = client.chat.completions.create(model="policy", messages=row["messages"])
    right = TASKS["arithmetic"].verify(reply.choices[0].message.content, row["example"])
    return 1.0 if right else -1.0


async def arithmetic_async(client, row):
    reply = await client.chat.completions.create(model="policy", messages=row["messages"])
    right = TASKS["arithmetic"].verify(reply.choices[0].message.content, row["example"])
    return 1.0 if right else -1.0


def calc_two_turns(client, row, replies=None):
    """calc as a two-turn agent: the model's first turn; if it holds a tool call, the calc
    tool's result goes back as a tool message and the model answers in a second turn.
    `replies`: a list the two responses are appended to (as a pair)."""
    from rlvr.tools.builtin import calc

    messages = list(row["messages"])
    first = client.chat.completions.create(model="policy", messages=messages, max_tokens=48)
    text = first.choices[0].message.content
    messages.append({"role": "assistant", "content": text})
    result = "error: no tool call"
    if TOOL_CALL_OPEN in text and TOOL_CALL_CLOSE in text:
        call = text.split(TOOL_CALL_OPEN, 1)[1].split(TOOL_CALL_CLOSE, 1)[0]
        try:
            result = calc(str(json.loads(call)["arguments"]["expression"]))
        except (ValueError, KeyError, TypeError) as e:
            result = f"error: {e}"
    messages.append({"role": "tool", "content": result})
    second = client.chat.completions.create(model="policy", messages=messages, max_tokens=48)
    answer = second.choices[0].message.content
    if replies is not None:
        replies.append((first, second))
    return float(TASKS["calc"].verify(answer, row["example"]))


def raises(client, row):
    client.chat.completions.create(model="policy", messages=row["messages"], max_tokens=4)
    raise ValueError("the environment broke")


def hangs(client, row):
    time.sleep(3600)


async def hangs_async(client, row):
    await asyncio.sleep(3600)


def nan(client, row):
    client.chat.completions.create(model="policy", messages=row["messages"], max_tokens=4)
    return float("nan")


def text_reward(client, row):
    client.chat.completions.create(model="policy", messages=row["messages"], max_tokens=4)
    return "1.0"


def no_completion(client, row):
    return 1.0
