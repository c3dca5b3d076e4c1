"""The task interface: a seeded problem generator with disjoint splits and an exact verifier.

A task never evaluates model text: verifiers only split strings and compare them with the
canonical answer, so a hostile completion is just a wrong one.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Split = Literal["train", "test"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"


@dataclass(frozen=True)
class Example:
    """One problem: ``question`` is its canonical text (it also decides the split)."""

    question: str
    answer: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


def extract_answer(completion: str) -> str | None:
    """The stripped text inside the one ``<answer>...</answer>`` block, else ``None``.

    Two or more answer blocks count as no answer, so hedging over several guesses earns
    nothing. Text after ``</answer>`` (an end-of-turn token, say) is ignored.
    """
    if completion.count(ANSWER_OPEN) != 1 or completion.count(ANSWER_CLOSE) != 1:
        return None
    start = completion.index(ANSWER_OPEN) + len(ANSWER_OPEN)
    end = completion.index(ANSWER_CLOSE)
    return completion[start:end].strip() if start <= end else None


def format_ok(completion: str) -> bool:
    """R1 format: ``<think>...</think>`` then ``<answer>...</answer>``, whitespace around.

    Each tag appears exactly once. Linear time in the length of ``completion``.
    """
    text = completion.strip()
    tags = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
    if any(text.count(tag) != 1 for tag in tags):
        return False
    if not (text.startswith(THINK_OPEN) and text.endswith(ANSWER_CLOSE)):
        return False
    think_end, answer_start = text.index(THINK_CLOSE), text.index(ANSWER_OPEN)
    return (
        think_end < answer_start and not text[think_end + len(THINK_CLOSE) : answer_start].strip()
    )


class Task(ABC):
    """A built-in verifiable task.

    Subclasses set ``name`` and ``max_new_tokens`` (a completion budget that fits every
    reference completion) and implement ``sample``, ``instruction`` and
    ``reference_completion``. ``tools`` names the tools the task needs (``rlvr.tools``:
    built-in names or "module:function"); a run uses them when ``rollout.tools`` is unset.
    """

    name: str
    system_prompt: str | None = None
    max_new_tokens: int
    test_fraction: float = 0.2
    max_misses: int = 10_000  # draws in a row that give nothing new before giving up
    tools: tuple[str, ...] = ()  # built-in tools the task needs (rlvr.tools names), if any

    @abstractmethod
    def sample(self, rng: random.Random) -> Example:
        """Draw one random problem, whatever its split."""

    @abstractmethod
    def instruction(self, example: Example) -> str:
        """The user message: the question and a short description of the expected format."""

    @abstractmethod
    def reference_completion(self, example: Example) -> str:
        """A correct completion in the expected format (without the end-of-turn token)."""

    def split_of(self, example: Example) -> Split:
        """Train or test, fixed by a hash of the task name and canonical question."""
        digest = hashlib.sha256(f"{self.name}\0{example.question}".encode()).digest()
        return "test" if int.from_bytes(digest[:8], "big") < self.test_fraction * 2**64 else "train"

    def make_examples(self, split: Split, n: int, seed: int) -> list[Example]:
        """``n`` distinct problems of ``split``, the same list for the same arguments."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = random.Random(f"{self.name}:{split}:{seed}")
        seen: set[str] = set()
        out: list[Example] = []
        misses = 0
        while len(out) < n:
            ex = self.sample(rng)
            if ex.question in seen or self.split_of(ex) != split:
                misses += 1
                if misses > self.max_misses:  # the split holds fewer than n problems
                    raise ValueError(
                        f"task {self.name!r}: found only {len(out)} distinct {split} problems "
                        f"of the {n} asked for"
                    )
                continue
            misses = 0
            seen.add(ex.question)
            out.append(ex)
        return out

    def prompt_messages(self, example: Example) -> list[dict[str, str]]:
        """Chat messages for ``tokenizer.apply_chat_template``."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": self.instruction(example)}]

    def verify(self, completion: str, example: Example) -> bool:
        """True when the one answer block holds exactly the canonical answer."""
        return extract_answer(completion) == example.answer

    def score(self, completion: str, example: Example) -> float:
        """The accuracy score in [0, 1] (1: correct); a built-in task's is 1 or 0."""
        return float(self.verify(completion, example))
