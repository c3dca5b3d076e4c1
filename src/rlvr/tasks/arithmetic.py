"""``arithmetic``: add or subtract two numbers column by column, then answer.

Prompt: ``Compute 47+85. Answer in <answer></answer>.``
Completion: ``<think>7+5=12\\n4+8+1=13</think><answer>132</answer>`` (23 tokens with the
end-of-turn token for two-digit numbers).

The short ``<think>`` section is the school method, units column first: each line is a
one-digit fact, with ``+1`` for a carry; subtraction borrows ten (``15-7=8\\n7-4=3`` for
``85-47``). It keeps every step a lookup a small model can learn in minutes; without it, a
few-hundred-thousand-parameter model must produce the leading digit of the sum in a single
forward pass, which it does not learn in a few minutes of CPU training. Subtraction keeps
``a >= b``, so answers are never negative. Only the answer is verified.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlvr.tasks.base import Example, Task


@dataclass(frozen=True)
class ArithmeticTask(Task):
    """``a op b`` with ``a, b`` uniform in ``[low, high]``, ``op`` in ``ops``, ``a >= b`` for ``-``."""

    name: str = "arithmetic"
    low: int = 10
    high: int = 99
    ops: str = "+-"
    max_new_tokens: int = 24

    def sample(self, rng: random.Random) -> Example:
        a, b = rng.randint(self.low, self.high), rng.randint(self.low, self.high)
        op = rng.choice(self.ops)
        if op == "-" and a < b:
            a, b = b, a
        value = a + b if op == "+" else a - b
        return Example(f"{a}{op}{b}", str(value), {"a": a, "b": b, "op": op})

    def instruction(self, example: Example) -> str:
        return f"Compute {example.question}. Answer in <answer></answer>."

    def reference_completion(self, example: Example) -> str:
        m = example.meta
        steps = column_steps(m["a"], m["b"], m["op"])
        return "<think>" + "\n".join(steps) + f"</think><answer>{example.answer}</answer>"


def column_steps(a: int, b: int, op: str) -> list[str]:
    """School-method lines, units column first: ``7+5=12``, ``4+8+1=13``; ``15-7=8``, ``7-4=3``."""
    steps, carry = [], 0
    while a or b:
        da, db = a % 10, b % 10
        if op == "+":
            steps.append(f"{da}+{db}{'+1' if carry else ''}={da + db + carry}")
            carry = int(da + db + carry >= 10)
        else:
            top = da - carry
            carry = int(top < db)
            top += 10 * carry
            steps.append(f"{top}-{db}={top - db}")
        a, b = a // 10, b // 10
    return steps
