"""Training conversations for ``build_tiny_model.py``: reference targets, targets with plausible
slips, and their tokenisation with the loss mask (the model's turns only, never a tool's).

A target is a list of chat messages after the prompt: one assistant message for the
single-turn tasks, assistant and tool turns for ``calc``. Noisy targets keep the right answer
the most likely output while making sampled answers often wrong: every slip is one of many
small, different mistakes, so no single wrong answer dominates.
"""

from __future__ import annotations

import random

from rlvr.tasks import Example, Task
from rlvr.tasks.calc import tool_call_text
from rlvr.tasks.chain import chain_completion

P_SLIP = {"arithmetic": 0.3, "chain": 0.2}  # per line of the <think> section
P_CORRECT = 0.35  # sort, by default (a phase may set its own)
# calc: one of these mistakes, or none with probability 1 - sum
CALC_SLIPS = {
    "skip_tools": 0.15,  # no tool call, a guessed answer
    "one_call": 0.15,  # the product by the tool, the second operation "in the head", a slip
    "operand": 0.1,  # a digit of a, b or c copied wrong into a call
    "copy_result": 0.05,  # a digit of the tool's product copied wrong into the second call
    "copy_answer": 0.05,  # a digit of the tool's final result copied wrong into the answer
}


def assistant(content: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": content}]


def reference_target(task: Task, ex: Example) -> list[dict[str, str]]:
    if hasattr(task, "reference_messages"):
        return task.reference_messages(ex)
    return assistant(task.reference_completion(ex))


def noisy_target(
    task: Task, ex: Example, rng: random.Random, sort_p_correct: float = P_CORRECT
) -> list[dict[str, str]]:
    """A target with plausible slips (see the module docstring), per task.

    ``arithmetic`` and ``chain``: each line of the ``<think>`` section is off by 1 or 2 with
    probability ``P_SLIP[task]`` and every later line and the answer follow from what was written,
    as a person's slip would propagate. ``sort``: with probability ``1 - sort_p_correct`` two
    neighbouring different digits of the answer are swapped. ``calc``: ``calc_target``.
    """
    m = ex.meta
    if task.name == "arithmetic":
        return assistant(slipped_arithmetic(m["a"], m["b"], m["op"], rng))
    if task.name == "chain":
        partials = [m["terms"][0]]
        for op, t in zip(m["ops"], m["terms"][1:]):
            value = partials[-1] + t if op == "+" else partials[-1] - t
            if rng.random() < P_SLIP["chain"]:
                value += rng.choice((-2, -1, 1, 2))
            partials.append(value)
        return assistant(chain_completion(m["terms"], m["ops"], partials))
    if task.name == "sort":
        s = list(ex.answer)
        swaps = [i for i in range(len(s) - 1) if s[i] != s[i + 1]]
        if rng.random() < sort_p_correct or not swaps:
            return reference_target(task, ex)
        i = rng.choice(swaps)
        s[i], s[i + 1] = s[i + 1], s[i]
        return assistant(f"<answer>{''.join(s)}</answer>")
    if task.name == "calc":
        return calc_target(m["a"], m["b"], m["c"], m["op"], rng)
    raise ValueError(f"no noise model for task {task.name!r}")


def slipped_arithmetic(a: int, b: int, op: str, rng: random.Random) -> str:
    """Column arithmetic as in ``ArithmeticTask``, each column result off by 1-2 with
    probability ``P_SLIP["arithmetic"]``."""
    lines, digits, carry = [], [], 0
    while a or b:
        da, db = a % 10, b % 10
        if op == "+":
            value, hi = da + db + carry, 19
            line = f"{da}+{db}{'+1' if carry else ''}"
        else:
            top = da - carry + 10 * int(da - carry < db)
            value, hi, line = top - db, 9, f"{top}-{db}"
        if rng.random() < P_SLIP["arithmetic"]:
            value = rng.choice(
                [v for v in (value - 2, value - 1, value + 1, value + 2) if 0 <= v <= hi]
            )
        lines.append(f"{line}={value}")
        carry = int(value >= 10) if op == "+" else int(da - carry < db)
        digits.append(value % 10)
        a, b = a // 10, b // 10
    answer = int(str(carry) * (op == "+") + "".join(map(str, reversed(digits))))
    return "<think>" + "\n".join(lines) + f"</think><answer>{answer}</answer>"


def slip_digit(n: int, rng: random.Random) -> int:
    """``n`` with one digit replaced by another (the leading digit never by 0)."""
    s = list(str(n))
    i = rng.randrange(len(s))
    s[i] = rng.choice([d for d in "0123456789" if d != s[i] and (i or d != "0")])
    return int("".join(s))


def apply_op(x: int, op: str, y: int) -> int:
    return x * y if op == "*" else x + y if op == "+" else x - y


def calc_target(a: int, b: int, c: int, op: str, rng: random.Random) -> list[dict[str, str]]:
    """The calc conversation with at most one mistake (``CALC_SLIPS``); the tool's replies are
    always what the tool computes from the expression written, as in a real rollout."""
    r = rng.random()
    kind = None
    for name, p in CALC_SLIPS.items():
        if r < p:
            kind = name
            break
        r -= p
    answer = apply_op(a * b, op, c)
    if kind == "skip_tools":
        return assistant(f"<answer>{slip_digit(answer, rng)}</answer>")
    if kind == "operand":
        which = rng.randrange(3)
        a, b, c = (slip_digit(v, rng) if i == which else v for i, v in enumerate((a, b, c)))
    product = a * b
    turns = [*assistant(tool_call_text(f"{a}*{b}")), {"role": "tool", "content": str(product)}]
    if kind == "one_call":
        guess = slip_digit(apply_op(product, op, c), rng)
        return [*turns, *assistant(f"<answer>{guess}</answer>")]
    written = slip_digit(product, rng) if kind == "copy_result" else product
    result = apply_op(written, op, c)
    turns += [
        *assistant(tool_call_text(f"{written}{op}{c}")),
        {"role": "tool", "content": str(result)},
    ]
    final = slip_digit(result, rng) if kind == "copy_answer" else result
    return [*turns, *assistant(f"<answer>{final}</answer>")]


def encode(tokenizer, task: Task, ex: Example, target: list[dict[str, str]]):
    """Token ids of prompt + target and the positions in the loss: the assistant turns' text
    and the final end-of-turn token; the prompt and every tool turn (with the template's text
    around it, exactly what a tool-calling rollout appends as context) are masked out."""
    messages = task.prompt_messages(ex)

    def render(msgs, gen):
        return tokenizer.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False)

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    out = ids(render(messages, True))
    in_loss = [False] * len(out)
    done: list[dict[str, str]] = []
    for i, msg in enumerate(target):
        if msg["role"] == "assistant":
            piece = ids(msg["content"]) + ([tokenizer.eos_token_id] if i == len(target) - 1 else [])
            out += piece
            in_loss += [True] * len(piece)
        else:  # a tool turn: the template's suffix after the assistant's call, as context
            before = render([*messages, *done[:-1]], True) + done[-1]["content"]
            after = render([*messages, *done, msg], True)
            assert after.startswith(before), (before, after)
            piece = ids(after[len(before) :])
            out += piece
            in_loss += [False] * len(piece)
        done.append(msg)
    return out, in_loss
