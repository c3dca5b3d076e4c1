"""The `fast` engine: a plain decoding loop on the policy itself, without `generate`.

What it saves over `model.generate` (the `hf` engine):

- each distinct prompt is prefilled once (`generate` prefills every one of the B = U * G
  rows), and its KV rows are copied to the G samples;
- the KV cache is preallocated (`StaticCache`: written in place, never grown by `torch.cat`);
- the 2D attention mask is built once (prompt padding, then ones for every generation slot:
  the causal mask already hides the slots not yet written);
- temperature, top-k and top-p are one small function on the logits, no processor list;
- rows that emitted EOS are retired: once enough of the batch is finished, the cache, mask
  and positions are index-selected down to the live rows.

On a model with fp32 weights on the CPU (the backend's gate, `rlvr.cpu.enabled`) the loop
also takes the CPU backend's decoding paths (`rlvr.cpu.decoding`): weights packed once per
rollout, each prompt's KV kept once and read by all G samples, the Llama family's lean
decoding step with small C kernels, the C sampler. The torch code above is their fallback and
the reference they are tested against.

Positions and masks are the trainer's (`rlvr.training.batch`): left-padded prompt, position ids
``cumsum(attention_mask) - 1``, so `sampling_log_probs` (log-softmax of logits / temperature
at the sampled token, fp32) match `token_log_probs` on the same sequences.
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache
from transformers.cache_utils import StaticLayer

import rlvr.cpu as cpu
from rlvr.models import cache_kwarg
from rlvr.rollout.base import (
    EngineDefaults,
    Rollout,
    SamplingParams,
    dedupe,
    left_pad,
    lengths_from_eos,
)
from rlvr.rollout.fast_tools import decode_with_tools
from rlvr.rollout.live_cache import LiveLayer
from rlvr.rollout.live_rows import LiveRows
from rlvr.rollout.streams import CounterStreams


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering of (N, V) logits: removed entries become -inf.

    Same rule as Hugging Face's warpers: top-k keeps every logit >= the k-th largest (ties
    kept); top-p keeps the smallest set of most likely tokens whose probability reaches
    `top_p`, and always the most likely token.
    """
    V = logits.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1.0 - top_p
        drop[..., -1] = False  # the most likely token always stays
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    suppress: torch.Tensor | None = None,
    generators: list[torch.Generator] | CounterStreams | None = None,
    step: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens for (N, V) logits and their log-probs under softmax(logits / T), fp32.

    Greedy takes the argmax; otherwise temperature, top-k and top-p shape the distribution
    that `torch.multinomial` draws from (the global RNG, or one `generators` entry per
    row), or, with `CounterStreams`, one batched Gumbel-max draw keyed by each row's seed
    and `step` (`rlvr.rollout.streams`). `suppress` ids (EOS before
    `min_new_tokens`) can't be chosen. The returned log-prob is always the unfiltered one,
    as the trainer computes it.
    """
    scaled = logits.float() / params.temperature
    choice = scaled if suppress is None else scaled.index_fill(-1, suppress, float("-inf"))
    if params.greedy:
        tokens = choice.argmax(dim=-1)
    elif isinstance(generators, CounterStreams):
        tokens = generators.draw(filter_logits(choice, params.top_k, params.top_p), step)
    else:
        probs = filter_logits(choice, params.top_k, params.top_p).softmax(dim=-1)
        if generators is None:
            tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
        else:  # one RNG stream per row: a row's draw does not depend on the rest of the batch
            tokens = torch.cat(
                [torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)]
            )
    log_probs = scaled.gather(-1, tokens[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)
    return tokens, log_probs


def row_generators(
    params: SamplingParams, num_prompts: int, device, counter: bool = False
) -> list | CounterStreams | None:
    """With `params.row_seeds` (one per prompt), one RNG stream per response row, seeded from
    its prompt's seed and its index in the group: sampling is then independent of how prompts
    are batched (across ranks, or generation batches), which data parallelism needs.
    One `torch.Generator` a row, or with `counter` one `CounterStreams` for the batch."""
    if params.row_seeds is None:
        return None
    if len(params.row_seeds) != num_prompts:
        raise ValueError(f"{len(params.row_seeds)} row_seeds for {num_prompts} prompts")
    seeds = [seed * 1009 + j for seed in params.row_seeds for j in range(params.n)]
    if counter:
        return CounterStreams.from_seeds(seeds, device)
    return [torch.Generator(device=device).manual_seed(s) for s in seeds]


class FastEngine(EngineDefaults):
    """Samples on the live policy module with its own decoding loop (see the module doc).

    `backend`: the CPU backend's gate for this model (`rlvr.cpu.backend`; by default decided
    from the model here). Where it is on, three switches choose among its decoding paths:
    `prefix_attention` decodes with each prompt's KV stored once per group, attended by all
    its samples (`rlvr.cpu.prefix_attention`; Llama family, static cache); `lean` with prefix
    attention runs the Llama family's decoding steps as `rlvr.cpu.lean` (the layer math on
    packed fused weights) instead of the modules; `pack_weights` multiplies with
    oneDNN-packed copies of the linear weights while sampling (`rlvr.cpu.packed`; float
    reassociation only, a large speed-up at decode shapes), and False turns `lean` off too.
    `retire_fraction`: the live batch is compacted once at least this fraction of its rows
    has finished (each compaction copies the whole KV cache, so it is not done every step);
    None never compacts (the loop still stops when every row is done). `cache`: "static"
    (preallocated) or "dynamic" (grown by concatenation, for models without static support).

    With `row_seeds`, `row_streams` picks the per-row streams: "generators" (one
    torch.Generator a row, drawn row by row), "counter" (one batched Gumbel-max draw keyed
    by each row's seed, `rlvr.rollout.streams`: no per-row work) or "auto" (counter on CUDA,
    generators elsewhere). `check_every`: decoding steps between checks for finished rows,
    each a host sync (None: every step on the CPU, every 8 on CUDA).
    """

    row_streams = "auto"
    check_every: int | None = None
    # With tools on the torch path: a tool turn is one multi-token prefill of its row
    # (`rlvr.rollout.ragged`); False feeds it one token a step as the backend's paths do.
    tool_prefill = True

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        pad_id: int,
        eos_ids: list[int],
        retire_fraction: float | None = 0.25,
        cache: str = "static",
        pack_weights: bool = True,
        prefix_attention: bool = True,
        lean: bool = True,
        backend: cpu.Backend | None = None,
        tools=None,
    ):
        if cache not in ("static", "dynamic"):
            raise ValueError(f"cache must be 'static' or 'dynamic', not {cache!r}")
        self.model, self.pad_id, self.eos_ids = model, pad_id, list(eos_ids)
        self.retire_fraction, self.cache = retire_fraction, cache
        self.pack_weights = pack_weights
        self.prefix_attention = prefix_attention
        self.lean = lean
        self.backend = cpu.backend(model) if backend is None else backend
        self.tools = tools  # a rlvr.tools.Toolbox: responses with tool turns (fast_tools.py)
        self._cache_kw = cache_kwarg(model)

    resident_bytes = 0  # samples on the policy module: nothing held through the update
    reports_log_probs = True  # its own sampler's, as the trainer computes them

    @classmethod
    def from_config(cls, model, *, pad_id: int, eos_ids: list[int], cfg, site) -> FastEngine:
        """The run's CPU backend gate and tools from `site`; no settings of its own."""
        return cls(model, pad_id=pad_id, eos_ids=eos_ids, backend=site.backend, tools=site.tools)

    def sync_weights(self) -> None:
        """The engine samples from the live policy module: nothing to copy."""

    def release(self) -> None:
        """Nothing to give back: the cache of a `generate` call is freed when it returns."""

    def _new_cache(self, max_len: int):
        config = self.model.config
        if self.cache == "dynamic":
            return DynamicCache(config=config)
        cache = StaticCache(config=config, max_cache_len=max_len)
        # Plain full-attention layers attend over the live prefix only; any other layer kind
        # (sliding window, linear attention) keeps the layer transformers chose for it.
        cache.layers = [
            LiveLayer(max_len) if type(layer) is StaticLayer else layer for layer in cache.layers
        ]
        return cache

    def forward(self, ids, mask, positions, cache, keep: int = 1) -> torch.Tensor:
        """The policy on new tokens `ids` (rows, K) that extend `cache` in place, at the
        trainer's `positions` (rows, K), under `mask` (2D over the cache's columns and the new
        ones, a 4D float mask, or None where the CPU backend's prefix attention masks the
        prompts itself): the logits of the last `keep` positions, (rows, keep, V). The
        decoding loops, with tools too (`fast_tools`, `ragged`), run the model through it."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,
            **{self._cache_kw: cache},
        )
        return out.logits

    def next_logits(self, ids, mask, positions, cache) -> torch.Tensor:
        """(rows, V) the logits that sample each row's next token: `forward`'s last position."""
        return self.forward(ids, mask, positions, cache)[:, -1, :]

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        was_training = self.model.training
        self.model.eval()
        plan = self.backend.decoding(
            self.model,
            pack_weights=self.pack_weights,
            prefix_attention=self.prefix_attention,
            lean=self.lean,
        )
        try:
            with contextlib.ExitStack() as stack:
                if plan is not None and plan.compute_dtype is not None:  # see CpuDecoding
                    stack.enter_context(torch.autocast("cpu", enabled=False))
                return self._generate(prompt_ids, params, plan)
        finally:
            self.model.train(was_training)

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams, plan):
        n, T = params.n, params.max_new_tokens
        if self.tools is not None:
            if params.min_new_tokens:
                raise ValueError("min_new_tokens is not supported with tools")
            T = self.tools.total_tokens(T) if T else 0
        rows = [p for p in prompt_ids for _ in range(n)]
        B = len(rows)
        device = next(self.model.parameters()).device
        torch.manual_seed(params.seed)
        counter = self.row_streams == "counter" or (
            self.row_streams == "auto" and device.type == "cuda"
        )
        generators = row_generators(params, len(prompt_ids), device, counter=counter)

        if B == 0 or T == 0:
            empty = torch.full((B, T), self.pad_id, dtype=torch.long, device=device)
            return self._rollout(rows, empty, torch.zeros((B, T), device=device), 0, n)

        # Distinct prompts, prefilled once; `expand` maps each of the B rows to its prefill row.
        unique, index = dedupe(prompt_ids)
        expand = torch.tensor(index, device=device).repeat_interleave(n)
        ids, prompt_mask = left_pad(unique, self.pad_id, device)
        cache = self._new_cache(ids.shape[1] + T)
        packing = contextlib.nullcontext()
        if plan is not None:
            plain = self.cache == "static" and all(type(x) is LiveLayer for x in cache.layers)
            packing = plan.prepare(cache, B, T, plain_layers=plain)
        with packing:
            return self._prefill_and_decode(
                ids, prompt_mask, expand, cache, plan, generators, params, rows
            )

    def _prefill_and_decode(self, ids, prompt_mask, expand, cache, plan, generators, params, rows):
        # The trainer's positions: counting from each row's first real token.
        prefill_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.next_logits(ids, prompt_mask, prefill_pos, cache)
        if plan is None or not plan.keep_prompts_once(cache, prompt_mask, expand):
            cache.reorder_cache(expand)  # each prompt's cache rows copied to its samples
        logits = logits.index_select(0, expand)
        decode = self._decode if self.tools is None else partial(decode_with_tools, self)
        with plan.attending() if plan is not None else contextlib.nullcontext():
            return decode(logits, cache, plan, prompt_mask, expand, generators, params, rows)

    def sample(self, logits, params, suppress, generators, plan, step):
        """The next tokens of (rows, V) `logits` and their log-probs (`sample_tokens`'s
        arguments), drawn by the CPU backend's C sampler for plain temperature sampling where
        `plan` has one, else by `sample_tokens`."""
        plain = not params.greedy and generators is None and params.top_p >= 1.0
        if plan is not None and plain and not 0 < params.top_k < logits.shape[-1]:
            drawn = plan.sample(logits, params.temperature, suppress)
            if drawn is not None:
                return drawn
        return sample_tokens(logits, params, suppress, generators, step)

    def _decode(self, logits, cache, plan, prompt_mask, expand, generators, params, rows):
        """The sampling loop after the prefill: one token per live row per step."""
        n, T = params.n, params.max_new_tokens
        B, device = len(rows), logits.device
        completion = torch.full((B, T), self.pad_id, dtype=torch.long, device=device)
        log_probs = torch.zeros((B, T), dtype=torch.float32, device=device)
        live = LiveRows(prompt_mask, expand, T, plan, generators)
        eos = torch.tensor(self.eos_ids, dtype=torch.long, device=device)
        eos_in_vocab = eos[eos < logits.shape[-1]]
        steps = 0
        check = self.check_every or (8 if device.type == "cuda" else 1)
        for t in range(T):
            suppress = eos_in_vocab if t < params.min_new_tokens else None
            tokens, lp = self.sample(logits, params, suppress, live.streams, plan, t)
            # Finished rows still in the batch write padding (and log-prob 0) after their EOS.
            completion[live.row_ids, t] = torch.where(live.alive, tokens, self.pad_id)
            log_probs[live.row_ids, t] = torch.where(live.alive, lp, 0.0)
            steps = t + 1
            live.alive &= ~torch.isin(tokens, eos)
            if t == T - 1:
                break
            # Finished rows are counted (a host sync) every `check` steps only; in between
            # they decode on, writing padding.
            n_alive = int(live.alive.sum()) if (t + 1) % check == 0 else None
            if n_alive == 0:
                break
            tokens = live.compact(tokens, n_alive, self.retire_fraction, cache, plan)
            logits = live.step(self, tokens, t, cache, plan)

        return self._rollout(rows, completion, log_probs, steps, n)

    def _rollout(self, rows, completion, log_probs, steps, n) -> Rollout:
        # Width is the longest response: a row without EOS can only be one that hit the cap.
        completion, log_probs = completion[:, :steps].cpu(), log_probs[:, :steps].cpu()
        lengths, truncated = lengths_from_eos(completion, self.eos_ids)
        if len(lengths) and not truncated.any():  # rows checked every few steps: cut the tail
            width = int(lengths.max())
            completion, log_probs = completion[:, :width], log_probs[:, :width]
        return Rollout(
            prompt_ids=rows,
            completion_ids=completion,
            lengths=lengths,
            truncated=truncated,
            group_size=n,
            sampling_log_probs=log_probs,
        )
