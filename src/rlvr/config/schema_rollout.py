"""The config schema's rollout section: `rollout.*` and its engines' own sections
(`rollout.vllm.*`), documented as the rest of the schema is (rlvr.config.schema)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class VLLMSettings:
    """The vllm engine's own settings (`rollout.vllm.KEY`); the other engines ignore them.

    dtype: the vllm engine's dtype: auto (bfloat16 under model.autocast=bfloat16, else
        model.dtype), float32, bfloat16 or float16.
    memory: fraction of the GPU's memory the vllm engine (or each launched server) takes
        while awake (weights and KV cache; vLLM's gpu_memory_utilization).
    mode: colocate (vLLM in the trainer's process, on its device) or server (generation on
        `vllm serve` processes through vLLM's HTTP API: rollout.vllm.urls or .launch;
        docs/guides/vllm_server.md).
    urls: server mode: the running vLLM servers, e.g. http://10.0.0.5:8000 (started with
        VLLM_SERVER_DEV_MODE=1 and the flags the guide lists; keep them on loopback or a
        private network).
    launch: server mode: start this many vLLM servers on 127.0.0.1, stopped with the run
        (0 = use rollout.vllm.urls).
    cpus: the CPUs the launched servers run on, e.g. "2-3", split evenly in order among them;
        empty = all this process may use.
    gpus: the GPUs the launched servers run on, e.g. "1,2,3", split evenly in order among them
        (tensor parallel over each share); empty = the servers run on the CPU.
    timeout: seconds a server may leave its heartbeat (asked every 2 s) unanswered before
        it counts as dead: its work goes to another server, or the run ends naming it (not
        a limit on a long generation).
    """

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    memory: float = 0.35
    mode: Literal["colocate", "server"] = "colocate"
    urls: tuple[str, ...] = ()
    launch: int = 0
    cpus: str = ""
    gpus: str = ""
    timeout: float = 20.0


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling: how many responses, how long, at what temperature.

    engine: "fast" (own decode loop: prompt prefilled once per group, static KV cache), "hf"
        (generate) or "vllm" (vLLM colocated on the GPU; the `vllm` extra).
    prompts_per_step: prompts whose groups enter one rollout batch (after dynamic sampling).
    group_size: G, responses sampled per prompt.
    max_new_tokens: generation cap L_max in tokens; a response without EOS by then is truncated.
    temperature: sampling temperature; the trainer applies the same one to its log-probs.
    top_p: nucleus sampling threshold (1.0 = off).
    top_k: top-k sampling (0 = off).
    min_new_tokens: suppress EOS before this many tokens (benchmarks force lengths with it; 0 = off).
    seed_per_prompt: draw each prompt's samples from its own seed, whatever else shares the batch
        (always on under torchrun: one process samples what N ranks do only with it on; off,
        one seed a generation batch, docs/guides/distributed.md).
    vllm: the vllm engine's settings, `rollout.vllm.KEY` (`VLLMSettings`).
    tools: tools the model may call inside a response (docs/tools.md): built-in names (calc,
        python), "module:function" or "path/file.py:function"; empty = the task's own tools.
    max_tool_calls: tool calls run per response; a call past it is left as plain text.
    max_total_tokens: with tools, the whole response's budget (the model's tokens and the tool
        turns together); none = rollout.max_new_tokens, which then caps both. max_new_tokens
        always caps the model's own tokens.
    tool_timeout_s: wall-clock limit of one tool call; past it the model reads an error.
    tool_call_tags: the two tags around a tool call's JSON in the model's text (Hermes /
        Qwen2.5's by default); the row stops when the model completes the second.
    """

    engine: Literal["fast", "hf", "vllm"] = "fast"
    prompts_per_step: int = 16
    group_size: int = 8
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0
    seed_per_prompt: bool = False
    vllm: VLLMSettings = field(default_factory=VLLMSettings)
    tools: tuple[str, ...] = ()
    max_tool_calls: int = 4
    max_total_tokens: int | None = None
    tool_timeout_s: float = 10.0
    tool_call_tags: tuple[str, ...] = ("<tool_call>", "</tool_call>")
