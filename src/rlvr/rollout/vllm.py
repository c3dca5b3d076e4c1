"""The `vllm` engine: vLLM colocated with the trainer, in its process and on its GPU
(optional extra `[vllm]`: the releases in `VLLM_RANGE`; see the README's vLLM section).

Launch. vLLM runs in-process with `distributed_executor_backend="external_launcher"` (as
TRL's colocate mode does): no engine-core subprocess, one engine per training rank on that
rank's GPU (`cuda:LOCAL_RANK`), joining the trainer's process group when there is one. The
construction is fenced: the global RNGs (python, numpy, torch CPU and CUDA), which vLLM's
worker reseeds, and the current CUDA device are restored after it; any failure becomes a
`VLLMEngineError` naming the vLLM version, which the trainer reports as a config error.

One wake/sleep cycle a step. `generate` wakes what is asleep (the CUDA cache emptied
first, so vLLM gets the memory the trainer's allocator holds), `release` puts the engine to
sleep once the step's rollouts are in (the trainer calls it before the update),
`sync_weights` after the update wakes the weights alone and pushes the new ones
(`rlvr.rollout.weight_sync`: merged LoRA, whole FSDP2 tensors). Sleep level 1 (weights kept
in host memory) when training changes only some weights (LoRA), and only those are pushed;
level 2 (weights dropped) when it changes all of them, which are then all pushed anyway.

Numerics. vLLM computes in bf16 when the run trains under bf16 autocast, else in the
model's dtype (`rollout.vllm_dtype` overrides), and generation runs outside the trainer's
autocast. Its log-probs come back as `sampling_log_probs` (after temperature, vLLM's
"processed_logprobs": the trainer's when top_p=1 and top_k=0), for diagnostics only: old
log-probs come from the trainer's forward (docs/algorithms.md#old-and-reference-log-probs).

Seeds. Every (prompt, sample) pair is one request with its own 63-bit seed, a hash of the
batch seed, the prompt's seed and the sample index (`sample_seeds`); vLLM's `n=G, seed=s`
would give sample j the seed s + j, the stream of another prompt's sample.

Status: written against the sources of vLLM 0.22.0 and 0.33.0 and TRL 1.16's colocate mode;
unverified on hardware until scripts/gpu_check.sh has run on a GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import random
import socket

import numpy as np
import torch

from rlvr.rollout.base import Rollout, SamplingParams, lengths_from_eos
from rlvr.rollout.vllm_tools import Request, tool_rounds
from rlvr.rollout.weight_sync import base_name, push_weights, trainable_names

VLLM_RANGE = (">=0.22", "<0.34")  # pyproject's `vllm` extra; checked against its sources


class VLLMEngineError(RuntimeError):
    """The vllm engine cannot run here (no GPU, no or wrong vLLM, vLLM failed to start)."""


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


def check_environment(device: torch.device, world_size: int = 1) -> str:
    """The installed vLLM's version, or a `VLLMEngineError` saying by name why it cannot run."""
    if device.type != "cuda" or not torch.cuda.is_available():
        several = f" ({world_size} ranks)" if world_size > 1 else ""
        raise VLLMEngineError(
            f"rollout.engine=vllm needs a CUDA GPU on every rank{several}; model.device is "
            f"{str(device)!r} and CUDA is {'' if torch.cuda.is_available() else 'not '}available. "
            "Use rollout.engine=fast (or hf) on this machine"
        )
    if importlib.util.find_spec("vllm") is None:
        raise VLLMEngineError(
            "rollout.engine=vllm needs vllm: install the release built for your torch "
            "(README, 'GPU and vLLM'), e.g. pip install 'rlvr[vllm]'"
        )
    version = importlib.metadata.version("vllm")
    check_version(version)
    return version


def check_version(version: str) -> None:
    """Refuse a vLLM release outside VLLM_RANGE (the releases whose API this engine uses:
    in-process external launcher, sleep levels 1 and 2, wake_up(tags), processed log-probs)."""
    from packaging.specifiers import SpecifierSet

    if version not in SpecifierSet(",".join(VLLM_RANGE), prereleases=True):
        raise VLLMEngineError(
            f"rollout.engine=vllm: vllm {version} is installed; rlvr supports vllm"
            f"{','.join(VLLM_RANGE)} (install the release built for your torch: README, "
            "'GPU and vLLM')"
        )


@contextlib.contextmanager
def preserved_rng(device: torch.device | None = None):
    """The python, numpy and torch (CPU, and CUDA when on it) global RNG states and the
    current CUDA device as they were before the block: vLLM's worker reseeds all of them."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    on_cuda = device is not None and device.type == "cuda"
    cuda = torch.cuda.get_rng_state_all() if on_cuda else None
    current = torch.cuda.current_device() if on_cuda else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if on_cuda:
            torch.cuda.set_rng_state_all(cuda)
            torch.cuda.set_device(current)


def launch_env(device: torch.device, rank: int, local_rank: int, world_size: int) -> dict:
    """The environment vLLM's external launcher reads (torchrun's names). Under torchrun they
    are set already; a single process gets rank 0 of 1 on its own device and a free port."""
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank if world_size > 1 else (device.index or 0)),
        "WORLD_SIZE": str(world_size),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process
    }
    if "MASTER_ADDR" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    return env


def _no_autocast():
    return torch.autocast("cuda", enabled=False)


class Residency:
    """What of vLLM is on the GPU, kept to one wake/sleep cycle a step.

    `llm`: vLLM's `LLM` (sleep(level), wake_up(tags)); `push(only)`: send the policy's weights
    (only those names; None: all). Sleep level 1 keeps the weights in host memory, so after
    the optimiser step only `changing` is pushed; level 2 drops them, so waking the weights
    pushes them all."""

    def __init__(self, llm, push, level: int, changing: set[str]):
        self.llm, self.push, self.level, self.changing = llm, push, level, changing
        self.asleep: set[str] = set()  # "weights", "kv_cache"

    def wake(self, tags: list[str]) -> None:
        tags = [t for t in tags if t in self.asleep]
        if not tags:
            return
        torch.cuda.empty_cache()  # hand vLLM the blocks torch's allocator holds
        self.llm.wake_up(tags=tags)
        self.asleep.difference_update(tags)
        if "weights" in tags and self.level == 2:
            self.push(None)  # level 2 dropped them

    def sleep(self) -> None:
        if not self.asleep:
            self.llm.sleep(level=self.level)
            self.asleep = {"weights", "kv_cache"}

    def weights_changed(self) -> None:
        if "weights" in self.asleep:
            self.wake(["weights"])
            if self.level == 2:
                return  # all pushed on waking
        self.push(self.changing)


class VLLMEngine:
    """vLLM colocated with the trainer (see the module doc). `device`: this rank's GPU;
    `autocast`, `dtype`: model.autocast and rollout.vllm_dtype; rank, local_rank, world_size:
    the trainer's data-parallel layout (`Dist`)."""

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
        self.model, self.pad_id, self.eos_ids, self.device = model, pad_id, list(eos_ids), device
        # Weights that training can change; if that is all of them, sleep drops the weights.
        self.changing = trainable_names(model)
        os.environ.update(launch_env(device, rank, local_rank, world_size))
        path = getattr(model.config, "_name_or_path", None) or model.name_or_path
        try:
            import vllm

            with preserved_rng(device):
                self.llm = vllm.LLM(
                    model=path,
                    skip_tokenizer_init=True,  # ids in, ids out
                    dtype=vllm_dtype(_param_dtype(model), autocast, dtype),
                    gpu_memory_utilization=gpu_memory_utilization,
                    enable_sleep_mode=True,
                    max_model_len=max_model_len,
                    distributed_executor_backend="external_launcher",
                    logprobs_mode="processed_logprobs",
                    seed=rank,  # every request carries its own seed; this is vLLM's default
                )
            # vLLM's own torch module (in-process: the executor is here), unwrapped from any
            # CUDA-graph wrapper; its load_weights takes Hugging Face names.
            worker = self.llm.llm_engine.model_executor.driver_worker.worker
            self._receiver = worker.get_model()
        except Exception as e:
            raise VLLMEngineError(
                f"rollout.engine=vllm: vllm {self.version} failed to start on {device}: "
                f"{type(e).__name__}: {e}"
            ) from e
        level = 2 if self.changing >= _base_names(model) else 1
        self.residency = Residency(self.llm, self._push, level, self.changing)
        self._push(None)  # the policy may already differ from the files (resume, LoRA)
        self.release()

    def _push(self, only: set[str] | None) -> None:
        with preserved_rng(self.device):
            push_weights(self._receiver, self.model, only=only, device=self.device)
            self.llm.reset_prefix_cache()

    def release(self) -> None:
        """Sleep (the trainer calls this once the step's rollouts are in)."""
        self.residency.sleep()

    def sync_weights(self) -> None:
        """Push what the optimiser step changed (after a level-2 sleep: every weight)."""
        self.residency.weights_changed()

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        from vllm import SamplingParams as VSamplingParams
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
                    VSamplingParams(
                        n=1,
                        temperature=0.0 if params.greedy else params.temperature,
                        top_p=params.top_p,
                        top_k=params.top_k,  # 0: off, in vLLM as here
                        max_tokens=params.max_new_tokens,
                        min_tokens=params.min_new_tokens,
                        stop_token_ids=self.eos_ids,
                        seed=seed,
                        logprobs=0,  # the sampled token's
                        detokenize=False,
                    )
                )
        with preserved_rng(self.device), _no_autocast():
            self.residency.wake(["weights", "kv_cache"])
            outputs = self.llm.generate(requests, sampling, use_tqdm=False) if requests else []
        completions = [out.outputs[0] for out in outputs]
        return rollout_from_outputs(prompt_ids, completions, params.n, self.pad_id, self.eos_ids)

    def _requests(self, params: SamplingParams):
        """A `vllm_tools.Generate` on this engine: one vLLM request per row."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        def generate(requests: list[Request]) -> list[tuple[list[int], list[float]]]:
            prompts = [TokensPrompt(prompt_token_ids=list(r.ids)) for r in requests]
            sampling = [
                VSamplingParams(
                    n=1,
                    temperature=0.0 if params.greedy else params.temperature,
                    top_p=params.top_p,
                    top_k=params.top_k,
                    max_tokens=r.max_tokens,
                    stop_token_ids=r.stop_ids,
                    seed=r.seed,
                    logprobs=0,
                    detokenize=False,
                )
                for r in requests
            ]
            with preserved_rng(self.device), _no_autocast():
                self.residency.wake(["weights", "kv_cache"])
                outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
            out = [o.outputs[0] for o in outputs]
            return [
                (list(c.token_ids), _token_log_probs(list(c.token_ids), c.logprobs)) for c in out
            ]

        return generate


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
