"""What the endpoint records of each request, by rollout, and the trajectory built from it.

A rollout (one agent call) makes one or more requests. Each is recorded as a `Turn` where its
tokens are produced: the prompt ids the model read, the ids it sampled and their sampling
log-probs. Turn k+1's prompt must extend turn k's prompt and completion, token for token: a
chat re-rendered from text is spliced onto the sampled ids (`Recorder.prompt_ids`), so a
completion the tokenizer would encode otherwise is never re-tokenized; a prompt that does not
extend the previous turn is a fault of the rollout (`drift`). The trajectory is turn 1's prompt,
then each turn's completion with the context between turns (the environment's, a tool's or a
user's message, the chat template's markup) as masked tokens, as tool turns are (docs/tools.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from rlvr.rollout import Rollout
from rlvr.tools.replies import Reply


class AgentFault(RuntimeError):
    """A rollout cannot be trained on: `kind` is one of raised, timeout, non_numeric,
    non_finite, no_completion, drift, context (a prompt that leaves no room in the model's
    context), missing_term / unknown_term (named reward terms other than the environment's)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Turn:
    """One request: the prompt as text (None for a token-id prompt) and ids, the sampled ids
    (EOS included when it ended the turn), their sampling log-probs (None: the engine has
    none), the completion's text as returned, and whether it ended without EOS or a tool
    call's close. `reply`: a reply to tools as parsed (its message, its calls, whether it
    failed to parse); `echo`: what the chat template renders for that message, where it is
    not `text` (the text the next turn's prompt holds in place of the sampled ids)."""

    prompt_text: str | None
    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float] | None
    text: str
    truncated: bool
    reply: Reply | None = None
    echo: str | None = None


@dataclass
class Trace:
    """One rollout's turns, its seed, whether it is closed (its agent call ended or was given
    up: later requests are refused), and its first fault."""

    seed: int
    turns: list[Turn] = field(default_factory=list)
    closed: bool = False
    fault: AgentFault | None = None


class Recorder:
    """Rollout id -> `Trace`; shared by the endpoint's threads and the runner."""

    def __init__(self, tokenizer, eos_ids: list[int]):
        self.tokenizer, self.eos_ids = tokenizer, set(eos_ids)
        self.eos_texts = [
            tokenizer.decode([i], skip_special_tokens=False) for i in sorted(self.eos_ids)
        ]
        self._traces: dict[str, Trace] = {}
        self._lock = threading.Lock()

    def open(self, rid: str, seed: int) -> None:
        with self._lock:
            self._traces[rid] = Trace(seed)

    def close(self, rid: str) -> Trace:
        """The rollout's trace, closed and forgotten: a request of it that comes later
        (an abandoned agent's) is refused."""
        with self._lock:
            trace = self._traces.pop(rid)
            trace.closed = True
            return trace

    def trace(self, rid: str) -> Trace | None:
        with self._lock:
            return self._traces.get(rid)

    def append(self, trace: Trace, turn: Turn) -> bool:
        """Record a turn; False when the rollout is closed (the turn is not its)."""
        with self._lock:
            if trace.closed:
                return False
            trace.turns.append(turn)
            return True

    def fail(self, rid: str, fault: AgentFault) -> None:
        with self._lock:
            trace = self._traces.get(rid)
            if trace is not None and trace.fault is None:
                trace.fault = fault

    def prompt_ids(self, trace: Trace, text: str | None, ids: list[int] | None) -> list[int]:
        """The ids of a request's prompt (`text`, rendered, or `ids`, given): spliced onto the
        previous turn's sampled ids when the text extends that turn's prompt and returned
        completion, else encoded; AgentFault("drift") when they do not extend the previous
        turn's prompt and completion ids."""
        prev = trace.turns[-1] if trace.turns else None
        if text is not None:
            ids = None
            if prev is not None and prev.prompt_text is not None:
                head = prev.prompt_text + (prev.text if prev.echo is None else prev.echo)
                if text.startswith(head):
                    ids = self._spliced(prev, text[len(head) :])
            if ids is None:
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids is not None
        if prev is not None:
            before = prev.prompt_ids + prev.completion_ids
            if ids[: len(before)] != before:
                at = next(
                    (i for i, (a, b) in enumerate(zip(ids, before)) if a != b),
                    min(len(ids), len(before)),
                )
                raise AgentFault(
                    "drift",
                    f"turn {len(trace.turns) + 1}'s prompt does not extend turn "
                    f"{len(trace.turns)}'s prompt and sampled completion (they differ from "
                    f"token {at} of {len(before)}): send the previous turns back as they were "
                    "returned, or the sampled ids are not what would be trained",
                )
        return list(ids)

    def _spliced(self, prev: Turn, rest: str) -> list[int]:
        """The previous turn's ids, then `rest` encoded: the text after the returned
        completion, less the EOS's own text where the sampled EOS stands for it."""
        if prev.completion_ids and prev.completion_ids[-1] in self.eos_ids:
            eos_text = self.tokenizer.decode([prev.completion_ids[-1]], skip_special_tokens=False)
            if rest.startswith(eos_text):
                rest = rest[len(eos_text) :]
        tail = self.tokenizer(rest, add_special_tokens=False)["input_ids"] if rest else []
        return prev.prompt_ids + prev.completion_ids + tail


@dataclass(frozen=True)
class Trajectory:
    """One rollout as the trainer reads it: the first turn's prompt, then the completions and
    the context between them (`context`: True on context tokens), their sampling log-probs
    (0 on context; None when the engine has none), and the turn count."""

    prompt_ids: list[int]
    ids: list[int]
    context: list[bool]
    log_probs: list[float] | None
    truncated: bool
    turns: int


def trajectory(turns: list[Turn]) -> Trajectory:
    """The turns joined: turn k+1's prompt extends turn k's prompt and completion
    (`Recorder.prompt_ids` refused any other), so what lies between is context."""
    first = turns[0]
    ids, context = list(first.completion_ids), [False] * len(first.completion_ids)
    has_lp = all(t.log_probs is not None for t in turns)
    lps = list(first.log_probs or []) if has_lp else None
    seen = len(first.prompt_ids) + len(first.completion_ids)
    for turn in turns[1:]:
        between = turn.prompt_ids[seen:]
        ids += between + turn.completion_ids
        context += [True] * len(between) + [False] * len(turn.completion_ids)
        if lps is not None:
            lps += [0.0] * len(between) + list(turn.log_probs or [])
        seen = len(turn.prompt_ids) + len(turn.completion_ids)
    return Trajectory(first.prompt_ids, ids, context, lps, turns[-1].truncated, len(turns))


def rollout_of(trajectories: list[Trajectory | None], group_size: int, pad_id: int) -> Rollout:
    """A `Rollout` of the trajectories (None: a dropped rollout, an empty row); context
    tokens are the rows' tool tokens, each turn after the first one tool call (the tool
    metrics then count the environment's turns)."""
    rows = [t for t in trajectories if t is not None]
    width = max((len(t.ids) for t in rows), default=0)
    B = len(trajectories)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.bool)
    lps = torch.zeros((B, width)) if rows and all(t.log_probs is not None for t in rows) else None
    lengths, truncated = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.bool)
    calls = torch.zeros(B)
    prompts: list[list[int]] = []
    for i, t in enumerate(trajectories):
        if t is None:  # an empty row, "truncated" so that no EOS is cut from it
            prompts.append([pad_id])
            truncated[i] = True
            continue
        n = len(t.ids)
        ids[i, :n] = torch.tensor(t.ids, dtype=torch.long)
        mask[i, :n] = torch.tensor(t.context, dtype=torch.bool)
        if lps is not None:
            lps[i, :n] = torch.tensor(t.log_probs)
        lengths[i], truncated[i], calls[i] = n, t.truncated, t.turns - 1
        prompts.append(t.prompt_ids)
    multi = bool(mask.any())
    return Rollout(
        prompt_ids=prompts,
        completion_ids=ids,
        lengths=lengths,
        truncated=truncated,
        group_size=group_size,
        sampling_log_probs=lps,
        tool_mask=mask if multi else None,
        tool_calls=calls.long() if multi else None,
        tool_errors=torch.zeros(B, dtype=torch.long) if multi else None,
        tool_seconds=torch.zeros(B) if multi else None,
    )
