"""Peak memory of a training step, predicted before it runs, and a clear stop when it won't fit.

A CPU run that outgrows RAM is killed by the kernel's OOM killer (no swap): no message, no
checkpoint of the step. `MemoryGuard.check` runs before every step and raises
`MemoryBudgetError` with one line naming the knobs when the predicted peak exceeds what the
process can still get: its resident set now plus the system's MemAvailable
(`/proc/meminfo`), or `RLVR_MEMORY_LIMIT_GB` when set. `RLVR_MEMORY_GUARD=0` turns it off.

The model (bytes; P parameters, P_t of them trained, L layers, width d, intermediate f,
key/value width kv, vocabulary V, training tokens n per micro-batch, r of them response
tokens, c tokens per scoring chunk; with `optim.micro_batch_tokens` set, n is that budget
or the longest sample, prompt + rollout.max_new_tokens, whichever is larger, and r <= n):

    peak = RUNTIME + STATE * (4 P + 12 P_t + 4 P [reference copy])
         + ACTIVATION * 4 n L (10 d + 4 f + 3 kv)              no gradient checkpointing
         + ACTIVATION * 4 n (L d + GC_LAYERS (10 d + 4 f + 3 kv))   with it
         + ACTIVATION * 4 n 3 V                  scoring in one piece (r tokens fit a chunk)
         + BYTES_PER_LOGIT V c + 12 r d          scoring in chunks (r > c)
         + the rollout's KV cache, 8 L kv per generated or prompt position of every row
         + what the rollout engine keeps through the update (vLLM on the CPU, which has no
           sleep mode: its copy of the weights and its KV-cache reservation)
         + what the code reward's sandboxes may hold at once: workers x one sandbox's budget
           (its cgroup's memory_mb + tmp_mb, or without a cgroup the per-process bound,
           `rlvr.rewards.sandbox.budget`)
         + on-policy distillation's teacher (algo.teacher): its weights, held all run; its
           no-grad scoring pass runs before the update, so its transient is under the update's

10 d + 4 f + 3 kv are the per-token values a Qwen2/Llama layer keeps for its backward (norm
inputs and outputs, q/k/v, attention output, residuals; gate, up, SiLU and product); under
gradient checkpointing only each layer's input is kept, plus what the recomputed layer and
its gradients hold while it runs (GC_LAYERS layers' worth). 3 V are the logits, their
log-softmax and its gradient when every response token's logits exist at once; scored in
chunks (`rlvr.training.token_scores`) only one chunk's vocabulary-wide tensors exist, plus the
hidden states' copy, its gradient and the log-probs (12 r d at most). RUNTIME, STATE and ACTIVATION are fitted by `bench/memory.py` to peak RSS probes
of real training steps without checkpointing, GC_LAYERS to one with it (its output is in
bench/README.md). The guard covers runs whose weights are on the CPU (a GPU's memory is not
RAM).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from rlvr.config.schema import ConfigError
from rlvr.training.token_scores import chunk_tokens, scoring_bytes

GIB = 1024**3

# `python bench/memory.py --fit`: RUNTIME and ACTIVATION by least squares over three probes of
# Qwen2-0.5B's layer (2 layers x 256 and 1024 response tokens, 4 layers x 512; full fine-tune,
# within -7%..+6% of each), GC_LAYERS from a checkpointed one; STATE is not fitted (every byte
# counted). Out of sample, the 30M grid model at 64-1024 tokens: +2..+9% without
# checkpointing, +7..+11% with it (glibc returning freed buffers there, rlvr.cpu.allocator).
RUNTIME = 0.416 * GIB  # torch, transformers, tokenizer, the engine's buffers
STATE = 1.0  # weights, gradients, AdamW moments (multiplier on the count above)
ACTIVATION = 0.901  # autograd's saved tensors and temporaries (multiplier on the count above)
GC_LAYERS = 1.11  # layers' worth of activations live at once under gradient checkpointing
# LoRA (under half the parameters trained): the adapters' inputs and outputs on top, fitted
# to one LoRA probe (r16 on all seven projections, 4 layers x 512 tokens: above the same
# full fine-tune's peak, 2,847 vs 2,823 MiB)
LORA_ACTIVATION = 1.31


class MemoryBudgetError(ConfigError):
    """The next step's predicted peak memory exceeds what is available; one line naming the
    config keys that lower it (a ConfigError, so the CLI prints it as one line)."""


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    intermediate: int
    kv: int
    vocab: int
    params: int
    trainable: int

    @staticmethod
    def of(model: torch.nn.Module) -> Shape | None:
        """The decoder's shape from its config; None for a model without the Llama fields."""
        c = getattr(model, "config", None)
        names = ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")
        if c is None or not all(isinstance(getattr(c, n, None), int) for n in names):
            return None
        heads = getattr(c, "num_attention_heads", 1) or 1
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        params = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return Shape(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            kv_heads * head_dim,
            c.vocab_size,
            params,
            trainable,
        )


@dataclass(frozen=True)
class Work:
    """One step's sizes: rows generated, rows per training micro-batch, lengths."""

    rows: int
    micro_rows: int
    prompt: int
    response: int
    groups_per_micro: int = 0  # > 0: prompt sharing (each prompt forwarded once per micro-batch)
    gradient_checkpointing: bool = False
    reference_copy: bool = False
    engine_bytes: float = 0.0  # held by the rollout engine through the update
    logits_chunk: int = 0  # optim.logits_chunk_tokens (0: from the scoring's budget)
    micro_tokens: int = 0  # optim.micro_batch_tokens (> 0: micro-batches by positions)
    sandbox_bytes: float = 0.0  # what the code reward's sandboxes may hold at once
    teacher_bytes: float = 0.0  # on-policy distillation's teacher's weights (algo.teacher)


def predict(shape: Shape, work: Work) -> dict[str, float]:
    """Peak bytes of one step, by part (see the module docstring), and their "total"."""
    s, w = shape, work
    scored = w.micro_rows * w.response
    if w.micro_tokens:  # a micro-batch computes at most the budget, or the longest sample alone
        tokens = max(w.micro_tokens, w.prompt + w.response)
        scored = min(tokens, w.rows * w.response)
    elif w.groups_per_micro:
        tokens = w.groups_per_micro * w.prompt + w.micro_rows * w.response
    else:
        tokens = w.micro_rows * (w.prompt + w.response)
    layer = 10 * s.hidden + 4 * s.intermediate + 3 * s.kv
    kept = s.hidden * s.layers + GC_LAYERS * layer if w.gradient_checkpointing else layer * s.layers
    lora = LORA_ACTIVATION if 2 * s.trainable < s.params else 1.0
    if chunk_tokens(scored, s.vocab, w.logits_chunk) >= scored:  # one piece
        logits = ACTIVATION * lora * 4 * tokens * 3 * s.vocab
    else:
        logits = scoring_bytes(scored, s.vocab, w.logits_chunk) + 12.0 * scored * s.hidden
    parts = {
        "runtime": RUNTIME,
        "state": STATE * (4 * s.params + 12 * s.trainable + 4 * s.params * w.reference_copy),
        "activations": ACTIVATION * lora * 4 * tokens * kept,
        "logits": logits,
        "kv_cache": 8.0 * s.layers * s.kv * w.rows * (w.prompt + w.response),
        "engine": float(w.engine_bytes),
        "sandboxes": float(w.sandbox_bytes),
        "teacher": float(w.teacher_bytes),
    }
    parts["total"] = sum(parts.values())
    return parts


def available_bytes() -> tuple[float, str]:
    """What this process can still use: its RSS plus MemAvailable, or RLVR_MEMORY_LIMIT_GB."""
    limit = os.environ.get("RLVR_MEMORY_LIMIT_GB")
    if limit:
        try:
            return float(limit) * GIB, "RLVR_MEMORY_LIMIT_GB"
        except ValueError:
            raise MemoryBudgetError(
                f"RLVR_MEMORY_LIMIT_GB={limit!r}: expected a number of GiB"
            ) from None
    meminfo = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            meminfo[key] = int(rest.split()[0]) * 1024
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return meminfo["MemAvailable"] + rss, "MemAvailable + this process's RSS"


class MemoryGuard:
    """Checks the predicted peak of the run's largest step against available memory."""

    def __init__(self, shape: Shape | None, work: Work) -> None:
        self.shape, self.work = shape, work
        self.enabled = shape is not None and os.environ.get("RLVR_MEMORY_GUARD", "1") != "0"

    @staticmethod
    def for_run(
        cfg,
        model,
        prompt_len: int,
        reference_copy: bool,
        engine_bytes: float = 0.0,
        sandbox_bytes: float = 0.0,
        teacher_bytes: float = 0.0,
    ) -> MemoryGuard:
        r, o = cfg.rollout, cfg.optim
        rows = r.prompts_per_step * r.group_size
        micro = min(o.micro_batch_sequences, rows)
        share = o.share_prompt and not o.gradient_checkpointing
        work = Work(
            rows=rows,
            micro_rows=micro,
            prompt=prompt_len,
            response=r.max_new_tokens,
            groups_per_micro=-(-micro // r.group_size) if share else 0,
            gradient_checkpointing=o.gradient_checkpointing,
            reference_copy=reference_copy,
            engine_bytes=engine_bytes,
            logits_chunk=o.logits_chunk_tokens,
            sandbox_bytes=sandbox_bytes,
            teacher_bytes=teacher_bytes,
            micro_tokens=o.micro_batch_tokens,
        )
        on_cpu = all(p.device.type == "cpu" for p in model.parameters())
        return MemoryGuard(Shape.of(model) if on_cpu else None, work)

    def predicted(self) -> dict[str, float]:
        return predict(self.shape, self.work)

    def check(self, step: int) -> None:
        if not self.enabled or self.shape is None:
            return
        need = self.predicted()["total"]
        have, source = available_bytes()
        if need <= have:
            return
        w = self.work
        micro = (
            f"optim.micro_batch_tokens ({w.micro_tokens})"
            if w.micro_tokens
            else f"optim.micro_batch_sequences ({w.micro_rows})"
        )
        knobs = (
            f"lower rollout.max_new_tokens ({w.response}), {micro} "
            f"or rollout.prompts_per_step x group_size ({w.rows})"
        )
        if not w.gradient_checkpointing:
            knobs += ", or set optim.gradient_checkpointing=true"
        if w.teacher_bytes:
            knobs += f"; the teacher (algo.teacher) holds {w.teacher_bytes / GIB:.1f} GiB of it"
        if w.sandbox_bytes:
            knobs += (
                f"; the code reward's sandboxes may hold {w.sandbox_bytes / GIB:.1f} GiB of it "
                "(reward.params.code.workers, memory_mb, max_procs; without a cgroup each "
                "sandbox is bounded per process)"
            )
        raise MemoryBudgetError(
            f"step {step} would need about {need / GIB:.1f} GiB at its peak but {have / GIB:.1f} "
            f"GiB is available ({source}): {knobs} (RLVR_MEMORY_GUARD=0 skips this check)"
        )
