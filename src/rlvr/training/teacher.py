"""On-policy distillation's teacher (`algo.teacher`, docs/distillation.md): a frozen causal LM
that scores the tokens the student sampled, and the step's distillation advantage from its
log-probs (`rlvr.algos.distill`).

The teacher is loaded once for the run, as the reference copy is: a model directory or hub id
as `model.name_or_path` is, a run directory as its newest good checkpoint, a checkpoint
directly, and a LoRA checkpoint as its base with the adapter merged. Its log-probs come from
the trainer's own scoring (`rlvr.training.update.batch_log_probs`: micro-batches, the LM head
applied a chunk of tokens at a time, never the whole logits), so distillation is the same
whichever engine sampled and whether the student is trained whole or through LoRA.

The teacher must tokenize as the student does: the student's token ids are scored by the
teacher as they are. A teacher whose tokenizer maps any token to another id (or has other
tokens) is refused before the run starts, naming both models.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

import rlvr.cpu as cpu
from rlvr.algos.distill import DistillSums, distill_advantages, distill_sums
from rlvr.config.schema import ConfigError
from rlvr.models import check_vocabulary, load_model, load_tokenizer
from rlvr.run.distributed import Dist
from rlvr.training.batch import Batch
from rlvr.training.settings import UpdateContext
from rlvr.training.update import batch_log_probs


def resolve_teacher(name: str) -> str:
    """The model or checkpoint directory `algo.teacher` names: a run directory's newest good
    checkpoint, a checkpoint (verified), else `name` as a model directory or hub id."""
    from rlvr.run.checkpoint import CheckpointError, latest_good_checkpoint, verify_checkpoint

    path = Path(name).expanduser()
    try:
        if (path / "config.yaml").is_file() and (path / "checkpoints").is_dir():
            checkpoint = latest_good_checkpoint(path)
            if checkpoint is None:
                raise ConfigError(f"algo.teacher: run directory {path} holds no intact checkpoint")
            return str(checkpoint)
        if (path / "manifest.json").is_file():
            verify_checkpoint(path)
    except CheckpointError as e:
        raise ConfigError(f"algo.teacher: {e}") from None
    return name


def _load(path: str, dtype: str, device: torch.device) -> torch.nn.Module:
    """The teacher's weights; a LoRA checkpoint's adapter merged into its base."""
    adapter = Path(path) / "adapter_config.json"
    if adapter.is_file():
        import json

        import peft

        base = json.loads(adapter.read_text())["base_model_name_or_path"]
        model = peft.PeftModel.from_pretrained(load_model(base, dtype=dtype, device=device), path)
        return model.merge_and_unload()
    return load_model(path, dtype=dtype, device=device)


def check_same_tokenizer(student, teacher, student_name: str, teacher_name: str) -> None:
    """ConfigError in one line unless the two tokenizers map every token to the same id."""
    s, t = student.get_vocab(), teacher.get_vocab()
    if s == t:
        return
    only_s = sorted(set(s) - set(t), key=s.get)[:3]
    moved = sorted((k for k in set(s) & set(t) if s[k] != t[k]), key=s.get)[:3]
    what = (
        f"ids differ for {[(k, s[k], t[k]) for k in moved]} (token, student id, teacher id)"
        if moved
        else f"tokens {only_s or sorted(set(t) - set(s), key=t.get)[:3]} are in one only"
    )
    raise ConfigError(
        f"algo.teacher: the teacher {teacher_name!r} has another tokenizer than the student "
        f"{student_name!r} ({len(t):,} vs {len(s):,} tokens; {what}); on-policy distillation "
        "scores the student's token ids with the teacher, so both must share one vocabulary"
    )


@dataclass
class Teacher:
    """The frozen teacher, its CPU backend gate (decided from its own weights), and the
    teacher's share c of the advantage."""

    model: torch.nn.Module
    backend: cpu.Backend
    coef: float
    name: str

    @classmethod
    def load(
        cls, name: str, tokenizer, *, student: str, dtype: str, device: torch.device, coef: float
    ) -> Teacher:
        """The teacher `name` (`algo.teacher`) in `dtype` on `device`, checked against the
        student's tokenizer (`tokenizer`, of the model `student`) before any work."""
        path = resolve_teacher(name)
        try:
            teacher_tokenizer = load_tokenizer(path)
            model = _load(path, dtype, device)
            check_vocabulary(tokenizer, model, "algo.teacher")
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"algo.teacher: {e}") from None
        check_same_tokenizer(tokenizer, teacher_tokenizer, student, name)
        model.requires_grad_(False)
        model.eval()
        backend = cpu.backend(model)
        backend.pack_frozen(model)
        return cls(model, backend, coef, name)

    @property
    def resident_bytes(self) -> float:
        """The teacher's weights and buffers, held through the whole run (the memory guard
        adds them)."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return float(
            sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())
        )

    @torch.no_grad()
    def log_probs(self, batch: Batch, u: UpdateContext) -> torch.Tensor:
        """(N, T) fp32 log pi_teacher of every response token, 0 past each length."""
        return batch_log_probs(self.model, batch, replace(u, backend=self.backend))

    @torch.no_grad()
    def distill(self, batch: Batch, u: UpdateContext, d: Dist) -> tuple[Batch, dict[str, float]]:
        """The batch with its advantages mixed with the teacher's (`distill_advantages`) and
        the step's distillation metrics, summed over ranks (every rank calls this). The
        student's log-probs are pi_old's where the step computed them, else the policy's now,
        before the update: the same weights when mu = 1 with one mini-batch, unstale."""
        sums = [0.0, 0.0, 0.0, 0.0]
        if len(batch):
            teacher = self.log_probs(batch, u)
            student = batch.old_log_probs
            if student is None:
                student = batch_log_probs(u.model, batch, u)
            mask = batch.model_mask()
            advantages = distill_advantages(batch.advantages, student, teacher, mask, self.coef)
            got = distill_sums(batch.advantages, student, teacher, mask, self.coef)
            sums = got.as_list()
            batch = replace(batch, advantages=advantages)
        total = d.sum(sums)
        return batch, DistillSums(*total).metrics()
