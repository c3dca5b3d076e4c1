"""Tool rounds for the `vllm` engine (docs/tools.md): generate until every row has ended or
closed a tool call, run the calls, append their turns, and generate again for the rows that
called a tool, on their prompt and everything so far; the rules are `rlvr.rollout.turns`'s.

The round logic takes the generation as a function (`Generate`), so it runs here on any
backend; `VLLMEngine` passes one that makes vLLM requests (one per row, its own seed for
each round). A row stops at the close tag through vLLM's `stop_token_ids`, so the tag must
be one token (Qwen2.5's and the built-in tokenizer's `</tool_call>` are); a longer tag is
refused. Run with vLLM on the CPU (tests/test_vllm_engine.py: the fast engine's rows under
greedy decoding); unverified on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlvr.rollout.base import Rollout, SamplingParams
from rlvr.rollout.turns import RowTurns, turns_rollout


@dataclass(frozen=True)
class Request:
    """One row's generation in a round: its ids so far, its budget, what stops it, its seed."""

    ids: list[int]
    max_tokens: int
    stop_ids: list[int]
    seed: int


# requests -> for each, the generated ids (the stop token included) and their log-probs
Generate = Callable[[list[Request]], list[tuple[list[int], list[float]]]]


def tool_rounds(
    toolbox,
    rows: list[list[int]],
    seeds: list[int],
    params: SamplingParams,
    eos_ids,
    generate: Generate,
    pad_id: int,
) -> Rollout:
    """Responses with tool turns for `rows` (one seed each), generated round by round."""
    if len(toolbox.close_ids) != 1:
        raise ValueError(
            f"the vllm engine stops rows at a one-token close tag; {toolbox.fmt.call_close!r} "
            f"is {len(toolbox.close_ids)} tokens (use the fast or hf engine)"
        )
    if params.min_new_tokens:
        raise ValueError("min_new_tokens is not supported with tools")
    max_new = params.max_new_tokens
    total = toolbox.total_tokens(max_new)
    turns = [RowTurns(done=total == 0 or max_new == 0) for _ in rows]
    eos = list(eos_ids)
    for round_ in range(toolbox.max_calls + 1):
        active = [i for i, t in enumerate(turns) if not t.done]
        if not active:
            break
        requests = [
            Request(
                ids=rows[i] + turns[i].ids,
                max_tokens=min(max_new - turns[i].model_tokens, total - len(turns[i].ids)),
                stop_ids=eos + (toolbox.close_ids if turns[i].calls < toolbox.max_calls else []),
                seed=(seeds[i] + round_) & 0x7FFF_FFFF_FFFF_FFFF,
            )
            for i in active
        ]
        for i, req, (ids, lps) in zip(active, requests, generate(requests)):
            turns[i].add_round(ids[: req.max_tokens], eos, toolbox, max_new, total, lps)
    for t in turns:  # past max_calls + 1 rounds a row can only be out of calls: never here
        t.done = True
    return turns_rollout(rows, turns, pad_id, params.n, with_log_probs=True)
