"""Bookkeeping of responses with tool turns, shared by the engines (docs/tools.md).

A response row is the prompt's continuation: the model's turns and, after each tool call,
the tool's turn (`Toolbox.respond`) as context. The rules every engine follows, so that they
agree token for token under greedy decoding:

- a model token that is an EOS ends the response (EOS inside a tool turn does not);
- a model token that completes the close tag (`</tool_call>`) while the row has made fewer
  than `max_calls` calls ends the model's turn: the tool runs and its turn is appended;
- the response ends, truncated, when the model has generated `max_new_tokens` tokens or the
  row holds the total budget (`Toolbox.total_tokens`), checked before a tool would run; a
  tool turn that does not fit is cut at the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from rlvr.rollout.base import Rollout

if TYPE_CHECKING:  # rlvr.tools imports the sandbox, which imports the rewards
    from rlvr.tools import Toolbox
    from rlvr.tools.session import ToolReply


@dataclass
class RowTurns:
    """One response being built: its ids, which are tool tokens, and its tool calls."""

    ids: list[int] = field(default_factory=list)
    tool: list[bool] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    model_tokens: int = 0
    turn_start: int = 0
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    done: bool = False
    eos: bool = False

    def add_model_token(
        self, token: int, eos_ids, toolbox: Toolbox, max_new: int, total: int, lp: float = 0.0
    ) -> bool:
        """Append one generated token; True when it ends the turn with a call to run."""
        self.ids.append(token)
        self.tool.append(False)
        self.log_probs.append(lp)
        self.model_tokens += 1
        if token in eos_ids:
            self.done = self.eos = True
            return False
        if self.model_tokens >= max_new or len(self.ids) >= total:
            self.done = True  # truncated: no budget left for a tool turn or another token
            return False
        return self.calls < toolbox.max_calls and toolbox.ends_call(self.ids[self.turn_start :])

    def add_round(
        self,
        tokens: list[int],
        eos_ids,
        toolbox: Toolbox,
        max_new: int,
        total: int,
        log_probs: list[float] | None = None,
    ) -> None:
        """Append what one round generated for the row (`tokens`, their `log_probs`, else
        0) up to the token that ends the model's turn: at a call, the tool runs and its turn
        is appended. A round that ends on none (the budget it was given is spent, or the
        model's context) ends the row."""
        lps = [0.0] * len(tokens) if log_probs is None else log_probs
        for token, lp in zip(tokens, lps):
            if self.add_model_token(token, eos_ids, toolbox, max_new, total, lp):
                self.run_tool(toolbox, total)
                return
            if self.done:
                return
        self.done = True

    def run_tool(self, toolbox: Toolbox, total: int) -> list[int]:
        """Run the call ending the current turn; append (and return) the tool turn's ids,
        cut at the budget (the row is then done, truncated)."""
        reply = toolbox.respond(self.ids[self.turn_start :])
        self.calls += 1
        self.errors += int(reply.result.error)
        self.seconds += reply.result.seconds
        room = total - len(self.ids)
        ids = reply.ids[:room]
        self.ids += ids
        self.tool += [True] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.turn_start = len(self.ids)
        if len(self.ids) >= total:
            self.done = True
        return ids


class ToolTally:
    """The tool calls of a batch decoded in one loop (the fast engine's paths): per output row,
    its calls, errors and tool seconds; `call` runs the call a row's turn ends with."""

    def __init__(self, toolbox: Toolbox, rows: int):
        self.toolbox = toolbox
        self.calls, self.errors, self.seconds = [0] * rows, [0] * rows, [0.0] * rows

    def call(self, row: int, turn: list[int]) -> ToolReply | None:
        """Run the call that `turn` (the row's tokens since its last tool result) closes; None
        where it closes none or the row has used its `max_calls`."""
        if self.calls[row] >= self.toolbox.max_calls or not self.toolbox.ends_call(turn):
            return None
        reply = self.toolbox.respond(turn)
        self.calls[row] += 1
        self.errors[row] += int(reply.result.error)
        self.seconds[row] += reply.result.seconds
        return reply

    def rollout_fields(self) -> dict[str, torch.Tensor]:
        """The `Rollout` fields of the counts."""
        return {
            "tool_calls": torch.tensor(self.calls, dtype=torch.long),
            "tool_errors": torch.tensor(self.errors, dtype=torch.long),
            "tool_seconds": torch.tensor(self.seconds, dtype=torch.float64),
        }


class ToolRows:
    """What the fast engine's batched loops with tools (`fast_tools`, `ragged`) write for
    each of B output rows, T columns wide: the ids, the sampled log-probs (0 on tool tokens),
    the tool mask, the model's own tokens so far, which rows ended on an EOS, where each row's
    current turn starts, and the tool calls (`tally`)."""

    def __init__(self, toolbox: Toolbox, B: int, T: int, pad_id: int, device):
        self.completion = torch.full((B, T), pad_id, dtype=torch.long, device=device)
        self.log_probs = torch.zeros((B, T), dtype=torch.float32, device=device)
        self.tool_mask = torch.zeros((B, T), dtype=torch.bool)
        self.model_count = torch.zeros(B, dtype=torch.long, device=device)
        self.eos_seen = torch.zeros(B, dtype=torch.bool)
        self.turn_start = [0] * B
        self.tally = ToolTally(toolbox, B)

    def rollout(self, rows: list[list[int]], lengths: torch.Tensor, group_size: int) -> Rollout:
        """The rows as a `Rollout` with their `lengths` ((B,), on the CPU), cut to the
        longest; a row that ended on no EOS is truncated."""
        width = int(lengths.max()) if len(rows) else 0
        return Rollout(
            prompt_ids=rows,
            completion_ids=self.completion[:, :width].cpu(),
            lengths=lengths,
            truncated=~self.eos_seen,
            group_size=group_size,
            sampling_log_probs=self.log_probs[:, :width].cpu(),
            tool_mask=self.tool_mask[:, :width],
            **self.tally.rollout_fields(),
        )


def turns_rollout(
    prompts: list[list[int]],
    turns: list[RowTurns],
    pad_id: int,
    group_size: int,
    with_log_probs: bool = False,
) -> Rollout:
    """The rows as a `Rollout`: right-padded ids, tool mask, lengths, truncation, counts."""
    B = len(turns)
    width = max((len(t.ids) for t in turns), default=0)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    tool = torch.zeros((B, width), dtype=torch.bool)
    lps = torch.zeros((B, width), dtype=torch.float32)
    for i, t in enumerate(turns):
        n = len(t.ids)
        ids[i, :n] = torch.tensor(t.ids, dtype=torch.long)
        tool[i, :n] = torch.tensor(t.tool, dtype=torch.bool)
        lps[i, :n] = torch.tensor(t.log_probs, dtype=torch.float32)
    return Rollout(
        prompt_ids=prompts,
        completion_ids=ids,
        lengths=torch.tensor([len(t.ids) for t in turns], dtype=torch.long),
        truncated=torch.tensor([not t.eos for t in turns], dtype=torch.bool),
        group_size=group_size,
        sampling_log_probs=lps if with_log_probs else None,
        tool_mask=tool,
        tool_calls=torch.tensor([t.calls for t in turns], dtype=torch.long),
        tool_errors=torch.tensor([t.errors for t in turns], dtype=torch.long),
        tool_seconds=torch.tensor([t.seconds for t in turns], dtype=torch.float64),
    )
