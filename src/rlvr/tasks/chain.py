"""``chain``: a sum of several one-digit terms, worked out step by step before the answer.

Prompt: ``Compute 7+5-3+8 step by step. Think in <think></think>, answer in <answer></answer>.``
Completion: ``<think>7+5=12\\n12-3=9\\n9+8=17</think><answer>17</answer>``.

Each step of the chain adds one line, so longer problems need longer completions and a
modest ``max_new_tokens`` cuts some of them off: format rewards, overlong filtering and the
soft overlong punishment all have work to do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlvr.tasks.base import Example, Task


@dataclass(frozen=True)
class ChainTask(Task):
    """``t0 ± t1 ± ... ± tk`` with ``k + 1`` in ``[min_terms, max_terms]`` and ``ti`` in 1..9."""

    name: str = "chain"
    min_terms: int = 3
    max_terms: int = 6
    max_new_tokens: int = 64

    def sample(self, rng: random.Random) -> Example:
        terms = [rng.randint(1, 9) for _ in range(rng.randint(self.min_terms, self.max_terms))]
        ops = [rng.choice("+-") for _ in terms[1:]]
        question = str(terms[0]) + "".join(f"{op}{t}" for op, t in zip(ops, terms[1:]))
        partials = [terms[0]]
        for op, t in zip(ops, terms[1:]):
            partials.append(partials[-1] + t if op == "+" else partials[-1] - t)
        meta = {"terms": tuple(terms), "ops": tuple(ops), "partials": tuple(partials)}
        return Example(question, str(partials[-1]), meta)

    def instruction(self, example: Example) -> str:
        return (
            f"Compute {example.question} step by step. "
            "Think in <think></think>, answer in <answer></answer>."
        )

    def reference_completion(self, example: Example) -> str:
        m = example.meta
        return chain_completion(m["terms"], m["ops"], m["partials"])


def chain_completion(terms, ops, partials) -> str:
    """The think-then-answer text for a chain with the given running sums."""
    steps = [f"{p}{op}{t}={q}" for p, op, t, q in zip(partials, ops, terms[1:], partials[1:])]
    return "<think>" + "\n".join(steps) + f"</think><answer>{partials[-1]}</answer>"
