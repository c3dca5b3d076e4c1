"""The `hf` engine: Hugging Face `generate` on the policy itself (CPU or GPU)."""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import GenerationConfig, PreTrainedModel, StoppingCriteria, StoppingCriteriaList

from rlvr.rollout.base import EngineDefaults, Rollout, SamplingParams, left_pad, lengths_from_eos
from rlvr.rollout.turns import RowTurns, turns_rollout

# Values `generate` would otherwise fill from the model's own generation_config.json (a hub
# model may ship repetition_penalty 1.05, top_k 20, ...). They would change the sampling
# distribution away from softmax(logits / T), which the trainer's log-probs assume.
_NEUTRAL = dict(
    repetition_penalty=1.0,
    min_p=None,
    typical_p=1.0,
    epsilon_cutoff=0.0,
    eta_cutoff=0.0,
    no_repeat_ngram_size=0,
    suppress_tokens=None,
    begin_suppress_tokens=None,
    bad_words_ids=None,
    forced_eos_token_id=None,
    forced_bos_token_id=None,
    num_beams=1,
)


class HFEngine(EngineDefaults):
    """Samples with `model.generate`, each prompt prefilled once per sample (HF has no
    prefix sharing); sampling uses the global torch RNG, seeded from `params.seed`.

    With `tools` (a `rlvr.tools.Toolbox`) it works in rounds: generate until every row has
    ended or closed a tool call, run the calls, append their turns, and generate again for
    the rows that called a tool, on their prompt and everything so far (`rlvr.rollout.turns`
    has the rules)."""

    def __init__(self, model: PreTrainedModel, *, pad_id: int, eos_ids: list[int], tools=None):
        self.model, self.pad_id, self.eos_ids = model, pad_id, list(eos_ids)
        self.tools = tools

    resident_bytes = 0  # samples on the policy module: nothing held through the update
    reports_log_probs = False  # `generate` returns the tokens only

    @classmethod
    def from_config(cls, model, *, pad_id: int, eos_ids: list[int], cfg, site) -> HFEngine:
        """The tools from `site`; no settings of its own."""
        return cls(model, pad_id=pad_id, eos_ids=eos_ids, tools=site.tools)

    def sync_weights(self) -> None:
        """The engine samples from the live policy module: nothing to copy."""

    def release(self) -> None:
        """Nothing to give back: `generate` frees its cache when it returns."""

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        if params.row_seeds is not None and not params.greedy:
            # generate's one global RNG mixes rows: per-prompt seeds mean one call per prompt
            return concat_rollouts(
                [
                    self.generate([p], replace(params, row_seeds=None, seed=seed))
                    for p, seed in zip(prompt_ids, params.row_seeds)
                ],
                self.pad_id,
            )
        rows = [p for p in prompt_ids for _ in range(params.n)]
        torch.manual_seed(params.seed)
        if self.tools is not None:
            return self._rounds(rows, params)
        ids, mask = left_pad(rows, self.pad_id, next(self.model.parameters()).device)
        completion = self._generate(ids, mask, params, params.max_new_tokens)
        # Width is the longest response; a row without EOS can only be one that hit the cap.
        lengths, truncated = lengths_from_eos(completion, self.eos_ids)
        steps = torch.arange(completion.shape[1])
        completion = torch.where(steps[None] < lengths[:, None], completion, self.pad_id)
        return Rollout(
            prompt_ids=rows,
            completion_ids=completion,
            lengths=lengths,
            truncated=truncated,
            group_size=params.n,
        )

    def _generate(self, ids, mask, params: SamplingParams, max_new: int, stop=None):
        """`generate`'s new tokens (on the CPU) for left-padded `ids`, at most `max_new`."""
        gen = GenerationConfig(
            do_sample=not params.greedy,
            temperature=params.temperature if not params.greedy else None,
            top_p=params.top_p if not params.greedy else None,
            top_k=params.top_k if not params.greedy else None,
            max_new_tokens=max_new,
            min_new_tokens=params.min_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            **_NEUTRAL,
        )
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=gen,
                stopping_criteria=StoppingCriteriaList([stop] if stop is not None else []),
            )
        finally:
            self.model.train(was_training)
        return out[:, ids.shape[1] :].cpu()

    def _rounds(self, rows: list[list[int]], params: SamplingParams) -> Rollout:
        """Generate, run the tools, generate again, until every row has ended."""
        tb, max_new = self.tools, params.max_new_tokens
        if params.min_new_tokens:
            raise ValueError("min_new_tokens is not supported with tools")
        total = tb.total_tokens(max_new)
        turns = [RowTurns(done=total == 0 or max_new == 0) for _ in rows]
        device = next(self.model.parameters()).device
        while active := [i for i, t in enumerate(turns) if not t.done]:
            budget = [
                min(max_new - turns[i].model_tokens, total - len(turns[i].ids)) for i in active
            ]
            ids, mask = left_pad([rows[i] + turns[i].ids for i in active], self.pad_id, device)
            allowed = torch.tensor([turns[i].calls < tb.max_calls for i in active])
            stop = _CallClosed(tb.close_ids, allowed, ids.shape[1])
            new = self._generate(ids, mask, params, max(budget), stop)
            for k, i in enumerate(active):
                turns[i].add_round(new[k, : budget[k]].tolist(), self.eos_ids, tb, max_new, total)
        return turns_rollout(rows, turns, self.pad_id, params.n)


class _CallClosed(StoppingCriteria):
    """Stops a row of `generate` once its new tokens end with the close tag `close_ids`,
    where `allowed` (rows that may still call a tool)."""

    def __init__(self, close_ids: list[int], allowed: torch.Tensor, prompt_width: int):
        self.close, self.allowed, self.start = torch.tensor(close_ids), allowed, prompt_width

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        k = len(self.close)
        if input_ids.shape[1] - self.start < k:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        tail = input_ids[:, -k:]
        hit = (tail == self.close.to(tail.device)).all(dim=1)
        return hit & self.allowed.to(hit.device)


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Rows of several rollouts (same group size) in order, padded to the widest."""
    width = max(p.completion_ids.shape[1] for p in parts)
    ids = torch.cat(
        [
            torch.nn.functional.pad(
                p.completion_ids, (0, width - p.completion_ids.shape[1]), value=pad_id
            )
            for p in parts
        ]
    )
    tools = parts[0].tool_mask is not None

    def cat(name: str, pad=None):
        if not tools:
            return None
        ts = [getattr(p, name) for p in parts]
        if pad is not None:
            ts = [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad) for t in ts]
        return torch.cat(ts)

    return Rollout(
        prompt_ids=[r for p in parts for r in p.prompt_ids],
        completion_ids=ids,
        lengths=torch.cat([p.lengths for p in parts]),
        truncated=torch.cat([p.truncated for p in parts]),
        group_size=parts[0].group_size,
        tool_mask=cat("tool_mask", pad=False),
        tool_calls=cat("tool_calls"),
        tool_errors=cat("tool_errors"),
        tool_seconds=cat("tool_seconds"),
    )
