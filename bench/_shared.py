"""What bench/vs_trl.py and bench/time_to_accuracy.py share: the comparison model, the
tokenizer loader, the prompts and reward both trainers see, and TRL's timing hooks."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

import torch

# The comparison model: a Qwen2 with hidden 256, 4 layers, 4 heads (no GQA), intermediate 1024,
# untied head, on rlvr's character vocabulary: 4,252,928 parameters.
QWEN2_SHAPE = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=1024,
    max_position_embeddings=512,
)


def build_qwen2(path: Path, *, seed: int = 0, **shape) -> Path:
    """Build the comparison model deterministically and save it with its tokenizer."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rlvr.models import build_tokenizer

    tok = build_tokenizer()
    config = Qwen2Config(  # `shape` may set vocab_size: ids past the tokenizer's decode to ""
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        **{"vocab_size": len(tok), **QWEN2_SHAPE, **shape},
    )
    with torch.random.fork_rng(devices=[]):  # seeded init, the caller's RNG untouched
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def load_char_tokenizer(path: str):
    """The saved character-level tokenizer, loaded by its own class.

    `AutoTokenizer` cannot be used: next to a `model_type="qwen2"` config, transformers 5
    loads any tokenizer as `Qwen2Tokenizer`, whose byte-level pre-tokenizer drops this
    tokenizer's spaces (rlvr's tests note the same). Both trainers get this one.
    """
    from transformers import PreTrainedTokenizerFast

    from rlvr.models import resolve_model_path

    tok = PreTrainedTokenizerFast.from_pretrained(resolve_model_path(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def task_prompts(tokenizer, task_name: str, split: str, n: int, seed: int, system_prompt=None):
    """(chat-rendered prompt text, Example) pairs of a built-in rlvr task, as rlvr renders them
    (`system_prompt` first, as rlvr's `data.system_prompt`)."""
    from rlvr.data.prompts import render_messages
    from rlvr.tasks import TASKS

    task = TASKS[task_name]
    out = []
    for ex in task.make_examples(split, n, seed):
        messages = task.prompt_messages(ex)
        if system_prompt:
            messages = [{"role": "system", "content": system_prompt}, *messages]
        text, _ = render_messages(messages, tokenizer)
        out.append((text, ex))
    return out


def trl_dataset(tokenizer, task_name: str, n: int, seed: int, system_prompt=None):
    """A TRL prompt dataset (standard, not conversational: the prompt is already rendered)."""
    from datasets import Dataset

    rows = task_prompts(tokenizer, task_name, "train", n, seed, system_prompt)
    return Dataset.from_dict(
        {
            "prompt": [text for text, _ in rows],
            "question": [ex.question for _, ex in rows],
            "answer": [ex.answer for _, ex in rows],
        }
    )


def trl_task_reward(task_name: str, correct: float = 1.0, wrong: float = 0.0) -> Callable:
    """The task's own verifier as a TRL reward function: what rlvr's `reward.accuracy=task`
    computes (correct_score if the one <answer> block holds the answer, else wrong_score)."""
    from rlvr.tasks import TASKS, Example

    task = TASKS[task_name]

    def task_accuracy(completions, question, answer, **kwargs) -> list[float]:
        return [
            correct if task.verify(c, Example(q, a)) else wrong
            for c, q, a in zip(completions, question, answer)
        ]

    return task_accuracy


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def set_threads(n: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["MKL_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)


class TRLTimer:
    """Phase timings for TRL's GRPOTrainer, which logs none of its own to stdout (its
    `profiling_context` timings go only to wandb / mlflow / trackio; its `step_time` metric
    covers `training_step`, which includes generation). The class methods are wrapped:

      generation: `_generate_single_turn` (pad prompts, `model.generate`, cut at EOS);
      log_probs:  `_get_per_token_logps_and_entropies` calls made with grad disabled (the
                  reference model's forward when beta > 0; old log-probs are skipped by TRL
                  when generation and optimiser steps align, as here);
      prepare:    `_prepare_inputs` (generation + rewards + advantages + the no-grad forwards);
      train:      from the start of `training_step` to the `on_step_end` callback, minus
                  `prepare`: the policy forward, loss, backward, clipping and optimiser step.
      step:       wall time between consecutive `on_step_end` callbacks (logging included).
    `*_cpu`: the same spans in this process's CPU time (`time.process_time`), which a busy
    machine's time-sharing does not inflate (bench/shapes.py).
    """

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self._reset()
        self._last_end: float | None = None
        self._t_train_start: float | None = None

    def _reset(self) -> None:
        self.cur = dict(generation=0.0, log_probs=0.0, prepare=0.0, completion_tokens=0)
        self.cur.update(generation_cpu=0.0, prepare_cpu=0.0)
        self.cur.update(prompt_tokens=0, unique_prompt_tokens=0, rows=0)

    HOOKED = (
        "_generate_single_turn",
        "_get_per_token_logps_and_entropies",
        "_prepare_inputs",
        "training_step",
    )

    def install(self, trainer_cls) -> None:
        missing = [m for m in self.HOOKED if not hasattr(trainer_cls, m)]
        if missing:
            import trl

            raise SystemExit(
                f"trl {trl.__version__}: GRPOTrainer has no {', '.join(missing)}; these timing "
                "hooks were written against trl 1.16"
            )
        timer = self

        gen = trainer_cls._generate_single_turn

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            out = gen(self, prompt_ids, *args, **kwargs)
            timer.cur["generation"] += time.perf_counter() - t0
            timer.cur["generation_cpu"] += time.process_time() - c0
            timer.cur["completion_tokens"] += sum(len(c) for c in out[0])
            timer.cur["prompt_tokens"] += sum(len(p) for p in prompt_ids)
            timer.cur["unique_prompt_tokens"] += sum(len(p) for p in {tuple(p) for p in prompt_ids})
            timer.cur["rows"] += len(prompt_ids)
            return out

        logps = trainer_cls._get_per_token_logps_and_entropies

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            if torch.is_grad_enabled():
                return logps(self, *args, **kwargs)
            t0 = time.perf_counter()
            out = logps(self, *args, **kwargs)
            timer.cur["log_probs"] += time.perf_counter() - t0
            return out

        prep = trainer_cls._prepare_inputs

        def _prepare_inputs(self, *args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            out = prep(self, *args, **kwargs)
            timer.cur["prepare"] += time.perf_counter() - t0
            timer.cur["prepare_cpu"] += time.process_time() - c0
            return out

        step = trainer_cls.training_step

        def training_step(self, *args, **kwargs):
            if timer._t_train_start is None:
                timer._t_train_start = time.perf_counter()
                timer._c_train_start = time.process_time()
            return step(self, *args, **kwargs)

        trainer_cls._generate_single_turn = _generate_single_turn
        trainer_cls._get_per_token_logps_and_entropies = _get_per_token_logps_and_entropies
        trainer_cls._prepare_inputs = _prepare_inputs
        trainer_cls.training_step = training_step

    def callback(self):
        from transformers import TrainerCallback

        timer = self

        class _StepEnd(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                timer._last_end, timer._last_end_cpu = time.perf_counter(), time.process_time()

            def on_step_end(self, args, state, control, **kwargs):
                now, now_cpu = time.perf_counter(), time.process_time()
                rec = dict(timer.cur)
                rec["step"] = now - timer._last_end
                rec["train"] = now - timer._t_train_start - rec["prepare"]
                rec["step_cpu"] = now_cpu - timer._last_end_cpu
                rec["train_cpu"] = now_cpu - timer._c_train_start - rec["prepare_cpu"]
                timer._last_end_cpu = now_cpu
                rec["end"] = now
                timer.steps.append(rec)
                timer._last_end, timer._t_train_start = now, None
                timer._reset()

        return _StepEnd()
