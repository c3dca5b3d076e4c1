"""``sort``: write the digits of a string in ascending order.

Prompt: ``Sort the digits 52918 ascending. Answer in <answer></answer>.``
Completion: ``<answer>12589</answer>``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlvr.tasks.base import Example, Task


@dataclass(frozen=True)
class SortTask(Task):
    """A random string of ``min_digits`` to ``max_digits`` digits (repeats allowed)."""

    name: str = "sort"
    min_digits: int = 4
    max_digits: int = 7
    max_new_tokens: int = 16

    def sample(self, rng: random.Random) -> Example:
        n = rng.randint(self.min_digits, self.max_digits)
        digits = "".join(rng.choice("0123456789") for _ in range(n))
        return Example(digits, "".join(sorted(digits)))

    def instruction(self, example: Example) -> str:
        return f"Sort the digits {example.question} ascending. Answer in <answer></answer>."

    def reference_completion(self, example: Example) -> str:
        return f"<answer>{example.answer}</answer>"
