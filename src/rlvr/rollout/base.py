"""The rollout contract: prompts in, a typed `Rollout` out.

An engine samples `n` responses for each prompt (a group of contiguous rows) and reports
what the trainer needs to build masks from lengths, never by comparing tokens with pad_id
(pad may equal EOS, and the EOS token is part of the response).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from rlvr.config.schema import Config


@dataclass(frozen=True)
class SamplingParams:
    """How one batch is sampled. `seed` makes the draw reproducible (resume replays it)."""

    n: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    greedy: bool = False
    min_new_tokens: int = 0  # EOS suppressed before this many tokens (benchmarks only)
    # One seed per prompt: each response row then draws from its own RNG stream, so a sample
    # does not depend on which other prompts share the batch (data-parallel ranks need this).
    row_seeds: tuple[int, ...] | None = None

    def __post_init__(self):
        # The trainer's config checks these by key; this guards direct library use, where
        # temperature 0 would otherwise surface as NaN probabilities deep in sampling.
        if not self.temperature > 0:
            raise ValueError(
                f"SamplingParams.temperature must be > 0 (got {self.temperature}); "
                "for argmax decoding pass greedy=True"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1] (got {self.top_p})")
        if self.n < 1 or self.max_new_tokens < 0 or self.top_k < 0 or self.min_new_tokens < 0:
            raise ValueError(
                "SamplingParams: n >= 1, max_new_tokens >= 0, top_k >= 0 and "
                f"min_new_tokens >= 0 expected, got {self}"
            )


@dataclass(frozen=True)
class Rollout:
    """`B = len(prompt_ids) * n` responses; rows i*n .. i*n+n-1 answer prompt i.

    prompt_ids: token ids of each row's prompt (B lists, repeated across a group).
    completion_ids: (B, T) generated ids, right-padded with pad_id after each response.
    lengths: (B,) generated tokens per response, EOS included.
    truncated: (B,) True where no EOS came before max_new_tokens.
    sampling_log_probs: (B, T) the engine's own log-probs of the sampled tokens, if it has them
        (diagnostics only: old log-probs always come from the trainer's forward,
        docs/algorithms.md#old-and-reference-log-probs).
    token_versions: (B, T) long, each sampled token's policy version (the weights that computed
        its logits), where the engine reports them (vLLM servers with train.inflight_updates).

    With tools (docs/tools.md) a response is the whole conversation after the prompt: the
    model's turns and the tool turns between them, in one row. `lengths` counts both, and
    tool_mask: (B, T) bool, True on the tokens a tool turn put there (context, never
        trained); tool_calls, tool_errors: (B,) calls run and calls answered with an error;
        tool_seconds: (B,) time spent in the row's tool calls. None without tools.
    """

    prompt_ids: list[list[int]]
    completion_ids: torch.Tensor
    lengths: torch.Tensor
    truncated: torch.Tensor
    group_size: int
    sampling_log_probs: torch.Tensor | None = None
    token_versions: torch.Tensor | None = None
    tool_mask: torch.Tensor | None = None
    tool_calls: torch.Tensor | None = None
    tool_errors: torch.Tensor | None = None
    tool_seconds: torch.Tensor | None = None

    @property
    def response_mask(self) -> torch.Tensor:
        """(B, T) float mask: 1 on the model's generated tokens including EOS, 0 on padding
        and on tool tokens."""
        steps = torch.arange(self.completion_ids.shape[1], device=self.lengths.device)
        mask = steps[None, :] < self.lengths[:, None]
        if self.tool_mask is not None:
            mask &= ~self.tool_mask.to(mask.device)
        return mask.float()

    @property
    def model_lengths(self) -> torch.Tensor:
        """(B,) the tokens the model generated in each response (tool tokens not counted)."""
        if self.tool_mask is None:
            return self.lengths
        return self.lengths - self.tool_mask.sum(1).to(self.lengths.device)

    def __len__(self) -> int:
        return len(self.prompt_ids)


class EngineError(RuntimeError):
    """An engine cannot run here (no GPU, a missing or unsupported library, a failed start);
    its message names the key (`rollout.engine=vllm needs ...`), and `build_engine` reports
    it as the config error it is."""


@dataclass(frozen=True)
class EngineSite:
    """What the caller knows about where an engine runs, beyond the config (`build_engine`).

    device: the rank's device (None: the model's). autocast: what the caller's forwards
    compute in ("none" or "bfloat16": model.autocast when training). backend: the CPU
    backend's gate decided for the run (`rlvr.cpu.Backend`; None: decided from the model).
    tools: the `rlvr.tools.Toolbox` responses call (None: no tools). max_model_len: the
    longest sequence asked, prompt and response (None: the model's context). max_rows: the
    most rows (prompts x n) one `generate` call holds. rank, local_rank, world_size: the
    data-parallel layout (`rlvr.run.distributed.Dist`).
    """

    device: torch.device | None = None
    autocast: str = "none"
    backend: Any = None
    tools: Any = None
    max_model_len: int | None = None
    max_rows: int = 64
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1


@runtime_checkable
class RolloutEngine(Protocol):
    """What training, `rlvr eval` and `rlvr rm` ask of an engine.

    from_config: the engine from the config (its own section, `rollout.<name>`) and the
    caller's `EngineSite`; `build_engine` calls it. generate: a batch of prompts sampled.
    sync_weights: after an optimiser step; a no-op for the engines that sample on the policy
    module itself (fast, hf), a weight copy for an inference engine (vllm). release: once a
    step's (or an evaluation's) rollouts are in, memory the engine holds apart from the
    trainer is given back until the next `generate` (vllm's sleep); a no-op where there is
    none. resident_bytes: what the engine keeps through the update (the memory guard adds it;
    0 for the engines on the policy module).

    What an engine can do is declared on its class, readable before one is built, so that
    config checks and the trainer ask the class instead of probing an instance.
    reports_log_probs: `generate` fills `Rollout.sampling_log_probs`, the behaviour
    log-probs that rollout correction and bypass need (without them a forward computes
    them). pins_weights: `pinned()` holds the weights that sample fixed while the trainer
    updates its own (vLLM servers), so a batch is produced ahead beside an update;
    elsewhere `pinned()` is a context that pins nothing. close: stop what the engine started
    (a process, a server); idempotent, a no-op where it started nothing. step_metrics: the
    engine's own counters for a step's metrics (vLLM servers: failovers and retries); empty
    where it has none. `EngineDefaults` gives the no-op `pinned`, `close` and `step_metrics`.
    """

    reports_log_probs: ClassVar[bool]
    pins_weights: ClassVar[bool]
    resident_bytes: int

    @classmethod
    def from_config(
        cls, model, *, pad_id: int, eos_ids: list[int], cfg: Config, site: EngineSite
    ) -> RolloutEngine: ...

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout: ...

    def sync_weights(self) -> None: ...

    def release(self) -> None: ...

    def pinned(self) -> contextlib.AbstractContextManager[None]: ...

    def close(self) -> None: ...

    def step_metrics(self) -> dict[str, float]: ...


class EngineDefaults:
    """The capabilities of an engine that pins nothing and starts nothing of its own: a
    base class an engine may take them from (each engine still declares
    `reports_log_probs` itself, so that no engine claims or denies log-probs by default)."""

    pins_weights: ClassVar[bool] = False

    def pinned(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to pin: the weights that sample are the ones the trainer updates."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Nothing started: nothing to stop."""

    def step_metrics(self) -> dict[str, float]:
        """No counters of its own."""
        return {}


def lengths_from_eos(
    completion_ids: torch.Tensor, eos_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Response lengths (EOS included) and truncation flags from generated ids.

    A row's length is the index of its first EOS + 1, or T when it has none (truncated).
    Anything after the first EOS is padding, whatever token it holds.
    """
    B, T = completion_ids.shape
    if B == 0 or T == 0:  # no rows (a rank's empty share of a small refill), or no tokens
        return completion_ids.new_zeros(B), torch.full(
            (B,), T == 0, dtype=torch.bool, device=completion_ids.device
        )
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    steps = torch.arange(T, device=completion_ids.device).expand_as(completion_ids)
    first = torch.where(is_eos, steps, torch.full_like(steps, T)).min(dim=1).values
    truncated = first == T
    lengths = torch.where(truncated, torch.full_like(first, T), first + 1)
    return lengths, truncated


def left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids and attention mask, prompts aligned to the right edge."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


def dedupe(seqs: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct sequences in order of first appearance, and the index of each input among
    them: one prefill (or one training prompt pass) per distinct prompt."""
    first_seen: dict[tuple[int, ...], int] = {}
    index = [first_seen.setdefault(tuple(s), len(first_seen)) for s in seqs]
    return [list(s) for s in first_seen], index


def decode_completions(tokenizer, rollout: Rollout, *, model_only: bool = False) -> list[str]:
    """Response text without its EOS. Special tokens the task uses (<think>, <answer>) stay:
    skip_special_tokens would drop them too, so only the trailing EOS is cut by length.

    model_only: the model's own tokens only, tool turns left out: what rewards read, so a
    tool's output (model-controlled through the python tool) cannot put an answer into the
    text that is scored. Without it, the whole conversation (what samples.jsonl logs)."""
    out = []
    for i, (ids, n, trunc) in enumerate(
        zip(rollout.completion_ids, rollout.lengths.tolist(), rollout.truncated.tolist())
    ):
        keep = ids[: n if trunc else n - 1]
        if model_only and rollout.tool_mask is not None:
            keep = keep[~rollout.tool_mask[i, : len(keep)].to(keep.device)]
        out.append(tokenizer.decode(keep.tolist(), skip_special_tokens=False))
    return out


def derive_seed(*parts: int | str) -> int:
    """A stable 31-bit seed from (run seed, step, batch, ...): every draw of the run is a pure
    function of its coordinates, so a resumed run replays exactly."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
