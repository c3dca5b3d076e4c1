"""The `hf` engine: Hugging Face `generate` on the policy itself (CPU or GPU)."""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import GenerationConfig, PreTrainedModel

from rlvr.rollout.base import Rollout, SamplingParams, left_pad, lengths_from_eos

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


class HFEngine:
    """Samples with `model.generate`, each prompt prefilled once per sample (HF has no
    prefix sharing); sampling uses the global torch RNG, seeded from `params.seed`."""

    def __init__(self, model: PreTrainedModel, *, pad_id: int, eos_ids: list[int]):
        self.model, self.pad_id, self.eos_ids = model, pad_id, list(eos_ids)

    def sync_weights(self) -> None:
        """The engine samples from the live policy module: nothing to copy."""

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
        device = next(self.model.parameters()).device
        ids, mask = left_pad(rows, self.pad_id, device)
        gen = GenerationConfig(
            do_sample=not params.greedy,
            temperature=params.temperature if not params.greedy else None,
            top_p=params.top_p if not params.greedy else None,
            top_k=params.top_k if not params.greedy else None,
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=params.min_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            **_NEUTRAL,
        )
        torch.manual_seed(params.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        finally:
            self.model.train(was_training)
        completion = out[:, ids.shape[1] :].cpu()
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
    return Rollout(
        prompt_ids=[r for p in parts for r in p.prompt_ids],
        completion_ids=ids,
        lengths=torch.cat([p.lengths for p in parts]),
        truncated=torch.cat([p.truncated for p in parts]),
        group_size=parts[0].group_size,
    )
