"""``calc``: a product and a sum that the model hands, one operation at a time, to a ``calc`` tool.

Prompt: ``Compute 347*28+519. Use the calc tool. Answer in <answer></answer>.``
Reference conversation (``reference_messages``), in the Hermes / Qwen2.5 tool-call format:

    assistant  <tool_call>{"name": "calc", "arguments": {"expression": "347*28"}}</tool_call>
    tool       9716
    assistant  <tool_call>{"name": "calc", "arguments": {"expression": "9716+519"}}</tool_call>
    tool       10235
    assistant  <answer>10235</answer>

Every question is ``a*b+c`` or ``a*b-c`` with a three-digit ``a``, a two-digit ``b`` and a
three-digit ``c``: a product a small model cannot form in its head, and a second operation
on the tool's first result, so the model must read a tool result and use it in its own next
call. ``a*b >= 1000 > c``, so answers are never negative. Only the final answer is verified.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from rlvr.tasks.base import Example, Task

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def tool_call_text(expression: str, name: str = "calc") -> str:
    """One tool call as the assistant writes it: ``<tool_call>{json}</tool_call>``."""
    call = json.dumps({"name": name, "arguments": {"expression": expression}})
    return f"{TOOL_CALL_OPEN}{call}{TOOL_CALL_CLOSE}"


def chatml_tool_turn(result: str) -> str:
    """The context between an assistant turn that ends in a tool call and the next assistant
    generation, as the built-in ChatML template renders a ``tool`` message."""
    return (
        f"<|im_end|>\n<|im_start|>tool\n{TOOL_RESPONSE_OPEN}{result}{TOOL_RESPONSE_CLOSE}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


@dataclass(frozen=True)
class CalcTask(Task):
    """``a*b op c`` with ``a`` and ``c`` in ``[100, 999]``, ``b`` in ``[10, 99]``, ``op`` in ``+-``.

    ``max_new_tokens`` is the row's total budget (the model's turns and the tool turns): the
    reference conversation takes 175-181 tokens of the built-in tokenizer with the final
    end-of-turn token.
    """

    name: str = "calc"
    max_new_tokens: int = 224
    tools: tuple[str, ...] = ("calc",)

    def sample(self, rng: random.Random) -> Example:
        a, b, c = rng.randint(100, 999), rng.randint(10, 99), rng.randint(100, 999)
        op = rng.choice("+-")
        value = a * b + c if op == "+" else a * b - c
        return Example(f"{a}*{b}{op}{c}", str(value), {"a": a, "b": b, "c": c, "op": op})

    def instruction(self, example: Example) -> str:
        return f"Compute {example.question}. Use the calc tool. Answer in <answer></answer>."

    def reference_messages(self, example: Example) -> list[dict[str, str]]:
        """The assistant and tool turns that follow the prompt, two tool calls then the answer."""
        m = example.meta
        product = m["a"] * m["b"]
        return [
            {"role": "assistant", "content": tool_call_text(f"{m['a']}*{m['b']}")},
            {"role": "tool", "content": str(product)},
            {"role": "assistant", "content": tool_call_text(f"{product}{m['op']}{m['c']}")},
            {"role": "tool", "content": example.answer},
            {"role": "assistant", "content": f"<answer>{example.answer}</answer>"},
        ]

    def reference_completion(self, example: Example) -> str:
        """The whole row after the prompt as a tool-calling rollout holds it with the built-in
        ChatML template: assistant turns with the tool turns between them as context."""
        parts = []
        for message in self.reference_messages(example):
            if message["role"] == "tool":
                parts.append(chatml_tool_turn(message["content"]))
            else:
                parts.append(message["content"])
        return "".join(parts)
