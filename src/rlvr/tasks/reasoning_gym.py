"""reasoning-gym's procedural tasks as a run's prompts (`data.task=reasoning_gym`).

reasoning-gym (`pip install reasoning-gym`, the `envs` extra) draws its rows offline from a
seed: a question, a reference answer and metadata. A row's reward is the task's own
`score_answer` on the text of the completion's last `<answer>...</answer>` block (reasoning-gym's
`extract_answer`); a completion is correct when it scores 1. The training rows are `size` rows
of each task from `seed`, interleaved task by task; the held-out rows come from another seed,
less any question that is also a training question.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlvr.tasks.base import Example

HELD_OUT_SEED_OFFSET = 1_000_003  # the held-out rows' seed: the training seed plus this


class ReasoningGymUnavailable(ImportError):
    """The `reasoning-gym` package is not installed."""


def _module():
    try:
        import reasoning_gym
    except ImportError:
        raise ReasoningGymUnavailable(
            "data.task=reasoning_gym needs the reasoning-gym package: pip install 'rlvr[envs]'"
        ) from None
    return reasoning_gym


def task_names() -> list[str]:
    """Every dataset name reasoning-gym registers."""
    from reasoning_gym.factory import DATASETS

    _module()
    return sorted(DATASETS)


@dataclass
class ReasoningGymTask:
    """The rows of `tasks` (reasoning-gym dataset names) and their scoring; quacks as a
    built-in `Task` where a run reads one (`prompt_messages`, `verify`, `score`)."""

    tasks: tuple[str, ...]
    system_prompt: str | None  # the text, None for no system message
    name: str = "reasoning_gym"
    tools: tuple[str, ...] = ()
    _datasets: dict[tuple[str, int, int], Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_settings(cls, settings) -> ReasoningGymTask:
        """From `data.reasoning_gym` (`ReasoningGymSettings`); unknown task names refused."""
        from rlvr.config.schema import ConfigError

        rg = _module()
        known = task_names()
        for name in settings.tasks:
            if name not in known:
                from rlvr.config.names import did_you_mean

                raise ConfigError(
                    f"data.reasoning_gym.tasks: {name!r} is not a reasoning-gym task"
                    f"{did_you_mean(name, known)}"
                )
        if not settings.tasks:
            raise ConfigError("data.reasoning_gym.tasks: expected at least one task name")
        system = None
        if settings.system_prompt != "none":
            system = rg.utils.SYSTEM_PROMPTS[settings.system_prompt]
        return cls(tuple(settings.tasks), system)

    def _dataset(self, task: str, size: int, seed: int):
        key = (task, size, seed)
        if key not in self._datasets:
            self._datasets[key] = _module().create_dataset(task, size=size, seed=seed)
        return self._datasets[key]

    def examples(
        self, size: int, seed: int, exclude: frozenset[str] = frozenset()
    ) -> list[Example]:
        """`size` rows of each task from `seed`, interleaved (row 0 of each task, then row 1,
        ...), less those whose question is in `exclude`."""
        per_task = []
        for task in self.tasks:
            ds = self._dataset(task, size, seed)
            rows = []
            for i in range(size):
                entry = ds[i]
                if entry["question"] in exclude:
                    continue
                meta = {"task": task, "size": size, "seed": seed, "entry": entry}
                rows.append(Example(entry["question"], str(entry["answer"]), meta))
            per_task.append(rows)
        longest = max(map(len, per_task), default=0)
        return [rows[i] for i in range(longest) for rows in per_task if i < len(rows)]

    def prompt_messages(self, example: Example) -> list[dict[str, str]]:
        """The system prompt (if any), then the question as the user message."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": example.question}]

    def score(self, completion: str, example: Example) -> float:
        """reasoning-gym's `score_answer` of the last answer block's text (0 without one)."""
        from reasoning_gym.utils import extract_answer

        m = example.meta
        ds = self._dataset(m["task"], m["size"], m["seed"])
        return float(ds.score_answer(extract_answer(completion), m["entry"]))

    def verify(self, completion: str, example: Example) -> bool:
        """Correct: the answer scores 1."""
        return self.score(completion, example) >= 1.0

    def reference_completion(self, example: Example) -> str:
        """The reference answer in an answer block (scores 1)."""
        return f"<answer>{example.answer}</answer>"
