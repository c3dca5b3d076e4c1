"""Prompts for a run, from a built-in task, reasoning-gym's tasks or a dataset file, rendered and tokenized once.

Either source yields `Prompt`s with the chat-rendered text, its token ids, the reference
answer and the raw example; the accuracy reward sees the same answer string either way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rlvr.config.schema import Config, ConfigError
from rlvr.data.token_bound import chars_per_token, min_tokens

EVAL_SEED = 1234  # the held-out set is the same for every run of a task, whatever train.seed


@dataclass(frozen=True)
class Prompt:
    text: str
    ids: list[int]
    answer: str | None  # None in a prompt-only dataset
    example: Any
    columns: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PromptSource:
    """Training prompts, held-out prompts, and the task (None for a dataset file)."""

    train: list[Prompt]
    eval: list[Prompt]
    task: Any | None
    name: str
    dropped: dict[str, int] = field(default_factory=dict)  # prompts over the context, by task

    @property
    def has_answer(self) -> bool:
        """False for a prompt-only dataset: its rewards receive no `answer`."""
        return any(p.answer is not None for p in self.train)


def render_messages(messages: list[dict], tokenizer) -> tuple[str, list[int]]:
    """Chat template when the tokenizer has one (it holds the special tokens itself, so none
    are added again); otherwise the plain contents with the tokenizer's own special tokens."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]
    text = "\n".join(m["content"] for m in messages) + "\n"
    return text, tokenizer(text)["input_ids"]


def _from_task(cfg: Config, tokenizer) -> PromptSource:
    from rlvr.tasks import TASKS

    task = TASKS[cfg.data.task]

    def build(split: str, n: int, seed: int) -> list[Prompt]:
        out = []
        try:
            examples = task.make_examples(split, n, seed)
        except ValueError as e:
            key = "data.train_size" if split == "train" else "train.eval_size"
            raise ConfigError(f"{key}: {e}") from None
        for ex in examples:
            messages = task.prompt_messages(ex)
            if cfg.data.system_prompt:
                messages = [{"role": "system", "content": cfg.data.system_prompt}, *messages]
            text, ids = render_messages(messages, tokenizer)
            out.append(Prompt(text=text, ids=ids, answer=ex.answer, example=ex))
        return out

    return PromptSource(
        train=build("train", cfg.data.train_size, cfg.train.seed),
        eval=build("test", cfg.train.eval_size, EVAL_SEED),
        task=task,
        name=cfg.data.task,
    )


def _from_reasoning_gym(cfg: Config, tokenizer, max_context: int | None) -> PromptSource:
    """reasoning-gym's rows (`rlvr.tasks.reasoning_gym`): training rows from
    `data.reasoning_gym.seed`, held-out rows (at most train.eval_size) from another seed less
    the training questions. A procedural task's rows vary in length (a maze, a long list of
    animals): a prompt longer than the context leaves for the prompt is dropped and counted
    under its task's name (`PromptSource.dropped`, printed by name when a run or an evaluation
    starts), where a built-in task or a dataset file with such a prompt is refused."""
    from rlvr.tasks.reasoning_gym import HELD_OUT_SEED_OFFSET, ReasoningGymTask

    s = cfg.data.reasoning_gym
    try:
        task = ReasoningGymTask.from_settings(s)
    except ImportError as e:
        raise ConfigError(str(e)) from None
    budget = None if max_context is None else max_context - response_budget(cfg)[1]
    dropped: Counter[str] = Counter()

    def build(examples, limit: int) -> list[Prompt]:
        out = []
        for ex in examples:
            if len(out) == limit:
                break
            messages = task.prompt_messages(ex)
            if cfg.data.system_prompt:
                messages = [{"role": "system", "content": cfg.data.system_prompt}, *messages]
            text, ids = render_messages(messages, tokenizer)
            if budget is not None and len(ids) > budget:
                dropped[ex.meta["task"]] += 1
                continue
            out.append(Prompt(text=text, ids=ids, answer=ex.answer, example=ex))
        return out

    train_examples = task.examples(s.size, s.seed)
    seen = frozenset(ex.question for ex in train_examples)
    eval_size = cfg.train.eval_size
    held_out = []
    if eval_size:
        held_out = task.examples(eval_size, s.seed + HELD_OUT_SEED_OFFSET + EVAL_SEED, exclude=seen)
    train = build(train_examples, len(train_examples))
    if not train:
        raise ConfigError(
            f"data.reasoning_gym.tasks: every training prompt of {', '.join(s.tasks)} is longer "
            f"than the model's context of {max_context} tokens leaves for the prompt ({budget} "
            f"with {response_budget(cfg)[0]} {response_budget(cfg)[1]})"
        )
    return PromptSource(
        train=train,
        eval=build(held_out, eval_size),
        task=task,
        name="reasoning_gym:" + ",".join(s.tasks),
        dropped=dict(dropped),
    )


def check_columns(example) -> None:
    """Refuse a dataset column whose name is one of the trainer's reward arguments (it would
    replace the trainer's value), naming the column, where it is, and the reserved list."""
    from rlvr.data.errors import DatasetError
    from rlvr.rewards.combine import RESERVED_KWARGS

    for key in example.columns:
        if key in RESERVED_KWARGS:
            raise DatasetError(
                example.source,
                key,
                f"a column may not be named {key!r}: reward functions receive the trainer's "
                f"{key!r} under that name. Reserved names: {', '.join(RESERVED_KWARGS)}. "
                "Rename the column",
            )


def _from_dataset(cfg: Config, tokenizer, max_context: int | None) -> PromptSource:
    from rlvr.data.dataset import load_prompt_dataset, render_prompt

    d = cfg.data
    per_token = chars_per_token(tokenizer) if max_context is not None else None

    def build(path: str | None) -> list[Prompt]:
        if path is None:
            return []
        rows = load_prompt_dataset(
            path,
            format=d.format,
            prompt_field=d.prompt_field,
            answer_field=d.answer_field,
            dedup=d.dedup,
        )
        out = []
        for ex in rows:
            check_columns(ex)
            text = render_prompt(
                ex, tokenizer, template=d.prompt_template, system_prompt=d.system_prompt
            )
            if per_token is not None:  # refuse a prompt that cannot fit before tokenizing it
                _check_length(text, per_token, ex.source, cfg, max_context)
            special = not getattr(tokenizer, "chat_template", None)
            ids = tokenizer(text, add_special_tokens=special)["input_ids"]
            out.append(
                Prompt(text=text, ids=ids, answer=ex.answer, example=ex, columns=dict(ex.columns))
            )
        return out

    train = build(d.path)
    held_out = build(d.eval_path)[: cfg.train.eval_size]
    return PromptSource(train=train, eval=held_out, task=None, name=str(d.path))


def _check_length(text: str, per_token: float, where: str, cfg: Config, max_context: int) -> None:
    """ConfigError when `text` is provably longer than the context leaves for the prompt
    (rlvr.data.token_bound); tokenizing a 10 MB prompt would cost gigabytes before the exact check."""
    key, response = response_budget(cfg)
    budget = max_context - response
    if min_tokens(text, per_token) > budget:
        raise ConfigError(
            f"{where}: the prompt has {len(text)} characters, so at least "
            f"{min_tokens(text, per_token)} tokens (a token of this tokenizer stands for at most "
            f"{per_token:g} characters); with {key} "
            f"{response} it exceeds the model's context of {max_context} tokens"
        )


def response_budget(cfg: Config) -> tuple[str, int]:
    """The key and value of a response's longest length: with tools, the total budget of the
    model's and the tools' tokens (docs/tools.md), else max_new_tokens."""
    r = cfg.rollout
    if r.max_total_tokens is not None:
        return "rollout.max_total_tokens", r.max_total_tokens
    return "rollout.max_new_tokens", r.max_new_tokens


def dropped_note(source: PromptSource) -> str | None:
    """One line naming the prompts dropped for length, by task (None: none dropped)."""
    if not source.dropped:
        return None
    counts = ", ".join(f"{task} {n}" for task, n in sorted(source.dropped.items()))
    return f"data: dropped {sum(source.dropped.values())} prompts longer than the context: {counts}"


def load_prompts(cfg: Config, tokenizer, max_context: int | None) -> PromptSource:
    """Build the prompts and check, before any work, that each fits the model's context."""
    if cfg.data.path is None and cfg.data.task == "reasoning_gym":
        source = _from_reasoning_gym(cfg, tokenizer, max_context)
    elif cfg.data.path is None:
        source = _from_task(cfg, tokenizer)
    else:
        source = _from_dataset(cfg, tokenizer, max_context)
    if not source.train:
        raise ConfigError(f"data: no training prompts from {source.name}")
    if cfg.rollout.prompts_per_step > len(source.train):  # a step would repeat prompts
        raise ConfigError(
            f"rollout.prompts_per_step: got {cfg.rollout.prompts_per_step}, expected at most "
            f"the {len(source.train)} training prompts of {source.name}"
        )
    if max_context is not None:
        key, response = response_budget(cfg)
        budget = max_context - response
        for split, prompts in (("train", source.train), ("eval", source.eval)):
            for i, p in enumerate(prompts):
                if len(p.ids) > budget:
                    raise ConfigError(
                        f"{key}: {split} prompt {i} has {len(p.ids)} tokens; with "
                        f"{key.split('.')[1]} {response} it exceeds the model's "
                        f"context of {max_context} tokens"
                    )
    return source
