"""The `vllm` engine: vLLM colocated with the trainer on the same GPU (optional extra `[vllm]`).

The engine lives in the trainer's process and GPU. Between rollouts it sleeps (level 1:
weights offloaded, KV cache freed) so the optimiser has the memory; it wakes for generation.
After every optimiser step `sync_weights` copies the policy's weights into it (under LoRA, the
adapter merged into a temporary copy of the weights). vLLM's own log-probs come back as
`sampling_log_probs`, for diagnostics only: old log-probs come from the trainer's forward
(docs/algorithms.md#old-and-reference-log-probs), since an inference engine's numerics differ
from the trainer's.

vllm is imported only when this engine is chosen; without a GPU it fails at construction.
Status: written against vLLM's documented `LLM` API (sleep mode, `TokensPrompt`, per-request
seeds); it has not been run in this project's CI, which has no GPU (see scripts/gpu_check.sh).
"""

from __future__ import annotations

import torch

from rlvr.rollout.base import Rollout, SamplingParams, lengths_from_eos


class VLLMEngine:
    def __init__(
        self,
        model,
        *,
        pad_id: int,
        eos_ids: list[int],
        gpu_memory_utilization: float = 0.35,
        max_model_len: int | None = None,
    ):
        if not torch.cuda.is_available():
            raise RuntimeError(
                "rollout.engine=vllm needs a CUDA GPU and none is available; "
                "use rollout.engine=fast (or hf) on this machine"
            )
        try:
            import vllm
        except ImportError:
            raise RuntimeError("rollout.engine=vllm needs vllm: pip install 'rlvr[vllm]'") from None
        self.model, self.pad_id, self.eos_ids = model, pad_id, list(eos_ids)
        self._vllm = vllm
        path = getattr(model.config, "_name_or_path", None) or model.name_or_path
        dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(model.dtype, "float32")
        self.llm = vllm.LLM(
            model=path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=True,
            max_model_len=max_model_len,
            seed=0,
        )
        self._asleep = False
        self.sync_weights()  # the policy may already differ from the files (resume)
        self._sleep()

    def _sleep(self) -> None:
        self.llm.sleep(level=1)
        self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def _inner_model(self):
        """vLLM's own torch module (the path differs between vLLM's engine versions)."""
        executor = self.llm.llm_engine.model_executor
        worker = executor.driver_worker
        worker = getattr(worker, "worker", worker)
        return worker.model_runner.model

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Copy the policy's current weights into vLLM (LoRA: merged, adapter only changes)."""
        model = self.model
        if hasattr(model, "merge_adapter"):  # PEFT: fold the adapter in, copy, unfold
            model.merge_adapter()
            try:
                state = {
                    k.replace("base_model.model.", "").replace(".base_layer", ""): v
                    for k, v in model.state_dict().items()
                    if "lora_" not in k
                }
            finally:
                model.unmerge_adapter()
        else:
            state = model.state_dict()
        was_asleep = self._asleep
        self._wake()
        self._inner_model().load_weights(state.items())
        self.llm.reset_prefix_cache()
        if was_asleep:
            self._sleep()

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollout:
        from vllm.inputs import TokensPrompt

        v = self._vllm
        self._wake()
        try:
            requests = [TokensPrompt(prompt_token_ids=p) for p in prompt_ids]
            seeds = params.row_seeds or [params.seed + i for i in range(len(prompt_ids))]
            sampling = [
                v.SamplingParams(
                    n=params.n,
                    temperature=0.0 if params.greedy else params.temperature,
                    top_p=params.top_p,
                    top_k=params.top_k if params.top_k > 0 else -1,
                    max_tokens=params.max_new_tokens,
                    min_tokens=params.min_new_tokens,
                    stop_token_ids=self.eos_ids,
                    seed=seed,
                    logprobs=0,
                )
                for seed in seeds
            ]
            outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        finally:
            self._sleep()
        rows, seqs, logps = [], [], []
        for prompt, out in zip(prompt_ids, outputs):
            for comp in out.outputs:
                rows.append(prompt)
                seqs.append(list(comp.token_ids))
                logps.append(
                    [next(iter(lp.values())).logprob if lp else 0.0 for lp in (comp.logprobs or [])]
                )
        width = max((len(s) for s in seqs), default=0)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        lp = torch.zeros((len(seqs), width))
        for i, (seq, seq_lp) in enumerate(zip(seqs, logps)):
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            lp[i, : len(seq_lp)] = torch.tensor(seq_lp)
        lengths, truncated = lengths_from_eos(ids, self.eos_ids)
        return Rollout(
            prompt_ids=rows,
            completion_ids=ids,
            lengths=lengths,
            truncated=truncated,
            group_size=params.n,
            sampling_log_probs=lp,
        )
